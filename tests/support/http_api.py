"""A client of the real `web` process over HTTP (requests), and a raw socket for what requests will not
send (a body that never arrives, a header twice)."""

from __future__ import annotations

import json
import socket
import time

import requests

ENDED = {"succeeded", "failed", "cancelled", "waiting"}


class HttpApi:
    def __init__(self, base_url: str, credentials: dict):
        self.base_url = base_url
        self.client_id = credentials["client_id"]
        self.api_key = credentials["api_key"]
        self.http = requests.Session()

    def headers(self, **extra) -> dict:
        return {"Authorization": f"Bearer {self.api_key}", **extra}

    def create(self, body: dict, *, key: str = "key-1", **headers) -> requests.Response:
        return self.http.post(f"{self.base_url}/v1/jobs", data=json.dumps(body), timeout=10,
                              headers=self.headers(**{"Idempotency-Key": key, "Content-Type": "application/json",
                                                      **headers}))

    def get(self, path: str, **params) -> requests.Response:
        return self.http.get(f"{self.base_url}{path}", params=params, headers=self.headers(), timeout=10,
                             allow_redirects=False)

    def post(self, path: str) -> requests.Response:
        return self.http.post(f"{self.base_url}{path}", headers=self.headers(), timeout=10)

    def job(self, job_id: str) -> dict:
        response = self.get(f"/v1/jobs/{job_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def wait(self, job_id: str, statuses=ENDED, timeout: float = 30.0, until=None) -> dict:
        """Poll the job until its status is in `statuses` (and `until(job)` holds, if given)."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["status"] in statuses and (until is None or until(job)):
                return job
            assert time.monotonic() < deadline, f"job {job_id} still {job['status']} after {timeout}s: {job}"
            time.sleep(0.05)


def raw_exchange(port: int, head: bytes, body_parts=(), *, pause_s: float = 0.0, read_timeout: float = 10.0):
    """Send a request's head and then each body part (pausing between them), stopping early if the server
    answers; read the answer until the server closes or `read_timeout`. Returns (status, headers, body,
    seconds to the first byte of the answer, whether the server closed the connection)."""
    started = time.monotonic()
    sock = socket.create_connection(("127.0.0.1", port), timeout=read_timeout)
    try:
        sock.sendall(head)
        sock.setblocking(False)
        received = b""
        for part in body_parts:
            try:
                received += sock.recv(65536)
            except BlockingIOError:
                pass
            if received:
                break  # answered already: the rest of the body is not wanted
            try:
                sock.sendall(part)
            except (BrokenPipeError, ConnectionResetError, BlockingIOError):
                break
            if pause_s:
                time.sleep(pause_s)
        sock.setblocking(True)
        sock.settimeout(read_timeout)
        first_byte = time.monotonic() - started if received else None
        closed = False
        while True:
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, socket.timeout):
                break
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            if first_byte is None:
                first_byte = time.monotonic() - started
            received += chunk
            if _complete(received):
                # Answered: did the server also drop the connection (Connection: close)?
                sock.settimeout(2.0)
                try:
                    closed = sock.recv(1) == b""
                except (TimeoutError, socket.timeout):
                    closed = False
                except ConnectionResetError:
                    closed = True
                break
    finally:
        sock.close()
    head_part, _, body = received.partition(b"\r\n\r\n")
    lines = head_part.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1]) if lines and lines[0].startswith("HTTP/") else None
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body, first_byte, closed


def _complete(received: bytes) -> bool:
    head, sep, body = received.partition(b"\r\n\r\n")
    length = content_length(head) if sep else None
    return length is not None and len(body) >= length


def content_length(head: bytes) -> int | None:
    """The Content-Length an HTTP/1.1 head (request or answer) declares, or None."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return None
