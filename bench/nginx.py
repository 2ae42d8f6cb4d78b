"""nginx beside a benchmark: the reference proxy that ``bench/front.py`` and ``bench/gateway.py``
measure Berth against, in one run, on the same upstream and the same load.

Debian's package, started in the foreground with its own config in a temporary directory: one
worker, ``proxy_buffering off`` (answers stream through as they come, like the front's), and a
keep-alive pool of 64 connections to the upstream.
"""

from __future__ import annotations

import os
import shutil
import subprocess

__all__ = ["NGINX_CONF", "start_nginx"]

NGINX_CONF = """
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream engine {{
        server 127.0.0.1:{upstream_port};
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


def start_nginx(port: int, upstream_port: int, tmp: str) -> subprocess.Popen | None:
    """nginx in the foreground with its own config under ``tmp``, or None without nginx."""
    exe = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None)
    if exe is None:
        return None
    conf = os.path.join(tmp, "nginx.conf")
    with open(conf, "w") as f:
        f.write(NGINX_CONF.format(tmp=tmp, port=port, upstream_port=upstream_port))
    return subprocess.Popen([exe, "-p", tmp, "-e", os.path.join(tmp, "error.log"), "-c", conf,
                             "-g", "daemon off;"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
