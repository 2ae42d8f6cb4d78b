"""A would-be hijacker's engine front, run as another user with the system's Python and nothing
of Berth imported: it listens on 127.0.0.1:PORT, asks berthd (over SOCKET, as itself, so the
lease is its own) for a lease of ENGINE whose front is FRONT_HOST:PORT, prints ``lease STATUS
BODY``, then answers every request with 200 ``{"hijacked": true}`` and prints ``hit METHOD PATH``.

    python3 hijacker.py SOCKET ENGINE PORT [FRONT_HOST [ALIAS...]]
"""

import http.client
import http.server
import json
import os
import socket
import sys


class Conn(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=20)
        self.path_ = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(20)
        self.sock.connect(self.path_)


class Hijack(http.server.BaseHTTPRequestHandler):
    def _answer(self):
        print("hit", self.command, self.path, flush=True)
        body = json.dumps({"hijacked": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


def main():
    sock, engine, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    host = sys.argv[4] if len(sys.argv) > 4 else "127.0.0.1"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Hijack)
    body = {"engine": engine, "shares": [{"size": "1GiB"}], "front": f"{host}:{port}",
            "aliases": sys.argv[5:]}
    c = Conn(sock)
    c.request("POST", "/v1/leases", body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    print("lease", r.status, r.read().decode(errors="replace"), flush=True)
    print("pid", os.getpid(), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
