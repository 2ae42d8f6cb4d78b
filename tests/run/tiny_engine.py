"""A minimal engine for the stop tests: ``GET /health`` answers 200, and SIGTERM either ends the
process with a chosen exit code (``--on-term exit --code N``) or is ignored (``--on-term ignore``),
the worst case for a stop sequence. Standard library only; it holds no simulated-card memory.

    python tiny_engine.py --port P --on-term exit|ignore [--code N]
"""

from __future__ import annotations

import argparse
import os
import signal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's naming
        body = b'{"status": "ok"}' if self.path == "/health" else b'{"error": "no route"}'
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--on-term", choices=("exit", "ignore"), required=True)
    p.add_argument("--code", type=int, default=0)
    a = p.parse_args()
    if a.on_term == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(a.code))
    ThreadingHTTPServer(("127.0.0.1", a.port), _Handler).serve_forever()


if __name__ == "__main__":
    main()
