"""A webhook receiver on 127.0.0.1 for tests: a tiny http.server in a thread that records
every request and answers from a script (e.g. 500 first, then 200)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    url: str
    # Status codes to answer, in order; once used up, ``default``.
    script: list[int] = field(default_factory=list)
    default: int = 200
    # Seconds to wait before answering (a slow endpoint).
    delay: float = 0.0
    # Answer with a redirect to this URL instead.
    redirect_to: str | None = None
    requests: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_status(self) -> int:
        with self.lock:
            return self.script.pop(0) if self.script else self.default

    def wait_for(self, count: int, *, timeout: float) -> list[Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.requests) >= count:
                    return list(self.requests)
            time.sleep(0.05)
        raise AssertionError(f"{len(self.requests)} requests after {timeout}s, wanted {count}")


@contextmanager
def webhook_receiver(**options: Any) -> Iterator[Receiver]:
    receiver_box: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            receiver = receiver_box[0]
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            with receiver.lock:
                receiver.requests.append(
                    Received(path=self.path, headers=dict(self.headers.items()), body=body)
                )
            if receiver.delay:
                time.sleep(receiver.delay)
            if receiver.redirect_to:
                self.send_response(302)
                self.send_header("Location", receiver.redirect_to)
                self.end_headers()
                return
            status = receiver.next_status()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"ok" if status < 300 else b"receiver says no")

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    port = server.server_address[1]
    receiver = Receiver(url=f"http://127.0.0.1:{port}/hook", **options)
    receiver_box.append(receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
