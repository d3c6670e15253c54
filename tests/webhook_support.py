"""A webhook receiver on 127.0.0.1 for tests: a tiny http.server in a thread that records
every request and answers from a script (e.g. 500 first, then 200); and a hostile endpoint
that answers one byte at a time, forever."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
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


# ---------------------------------------------------------------- a hostile endpoint

# What a dripping endpoint sends before it starts dripping, by mode: a 200 whose headers
# never end; a 500 whose (announced) body never ends; a TLS record that never completes.
DRIP_PREFIX = {
    "headers": b"HTTP/1.1 200 OK\r\nX-Drip: ",
    "body": b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 1000000\r\n\r\nslow",
    "tls": b"\x16\x03\x03\x40\x00",
}


@dataclass
class DrippingEndpoint:
    """Takes the POST, then sends one byte every ``interval`` seconds, forever (until the
    client hangs up): each read the client makes succeeds well inside any per-read
    timeout, so only a deadline on the whole POST ends it."""

    url: str
    interval: float
    connections: int = 0
    # Seconds from accepting each connection to the client hanging up.
    held_for: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wait_closed(self, count: int, *, timeout: float) -> list[float]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.held_for) >= count:
                    return list(self.held_for)
            time.sleep(0.05)
        raise AssertionError(f"{len(self.held_for)} connections closed, wanted {count}")


def _drip(endpoint: DrippingEndpoint, connection: socket.socket, prefix: bytes) -> None:
    accepted = time.monotonic()
    connection.settimeout(1.0)
    try:
        if not prefix.startswith(b"\x16"):
            # Take the request (plain HTTP only: a TLS client speaks first, a handshake).
            with suppress(OSError):
                connection.recv(65536)
        connection.sendall(prefix)
        while True:
            time.sleep(endpoint.interval)
            connection.sendall(b"a")
    except OSError:
        # The client hung up: sending to it fails.
        pass
    finally:
        with endpoint.lock:
            endpoint.held_for.append(time.monotonic() - accepted)
        connection.close()


@contextmanager
def dripping_endpoint(mode: str = "headers", *, interval: float = 0.5) -> Iterator[Any]:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    scheme = "https" if mode == "tls" else "http"
    endpoint = DrippingEndpoint(url=f"{scheme}://127.0.0.1:{port}/hook", interval=interval)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with endpoint.lock:
                endpoint.connections += 1
            threading.Thread(
                target=_drip, args=(endpoint, connection, DRIP_PREFIX[mode]), daemon=True
            ).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield endpoint
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()
