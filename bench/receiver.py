"""A minimal webhook receiver for benchmarks, in a process of its own: answers every POST with 200 and
counts what it got (GET /count). Run: python bench/receiver.py PORT."""

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

received = 0
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        global received
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with lock:
            received += 1
        self._answer(b'{"ok":true}')

    def do_GET(self):
        self._answer(str(received).encode())

    def _answer(self, body: bytes):
        # One write for the whole answer: two small writes on a keep-alive connection meet Nagle's
        # algorithm and the client's delayed ACK, and every request would wait 40 ms for nothing.
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    server.request_queue_size = 256
    server.serve_forever()
