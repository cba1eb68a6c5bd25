"""A load balancer in front of `web` for the upgrade storm: a TCP forwarder on one address whose backend
can be switched, as a rolling restart behind HAProxy or a Kubernetes service does. New connections go
to the backend named last; connections already open keep theirs until one side closes them, so the old
`web`, stopped warm (SIGTERM: uvicorn finishes what it is answering), drains its own."""

from __future__ import annotations

import socket
import threading


class Balancer:
    def __init__(self, port: int, backend: int, host: str = "127.0.0.1"):
        self.address, self.backend = (host, port), backend
        self.listener = socket.create_server(self.address, reuse_port=False, backlog=512)
        self.closed = threading.Event()
        self.refused = 0  # connections that found no backend listening (none while a switch is warm)

    def start(self) -> "Balancer":
        threading.Thread(target=self._accept, name="balancer", daemon=True).start()
        return self

    def switch(self, backend: int) -> None:
        self.backend = backend

    def stop(self) -> None:
        self.closed.set()
        self.listener.close()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection((self.address[0], self.backend), timeout=10)
        except OSError:
            self.refused += 1
            client.close()
            return
        upstream.settimeout(None)
        threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()
        _pump(client, upstream)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        for sock in (source, sink):  # one side closed: the other is told, as a proxy does
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
