"""The attacker's side of the security tests: one call to berthd's socket, run as another
user with the system's Python and nothing of Berth imported. Prints ``STATUS BODY``.

    python3 attacker.py SOCKET METHOD PATH [JSON_BODY]
"""

import http.client
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


def main():
    sock, method, path = sys.argv[1:4]
    body = sys.argv[4] if len(sys.argv) > 4 else None
    body = body.replace("$PID", str(__import__("os").getpid())) if body else None
    c = Conn(sock)
    c.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
    r = c.getresponse()
    print(r.status, r.read().decode(errors="replace"))


if __name__ == "__main__":
    main()
