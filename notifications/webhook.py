"""One webhook POST: to the address that passed the checks, within a wall-clock deadline,
no redirects followed. Plain ``http.client`` (no pooling, no retries of its own: the
delivery task retries with back-off and logs each attempt).

The endpoint is user input, and may be hostile. A socket timeout alone bounds each read
or write, not the POST: an endpoint that sends one byte just inside it, forever, would
hold a worker for the task's whole time limit. So every read and write (and the TLS
handshake) runs with the smaller of the per-operation timeout and the time left before
the POST's deadline, and none starts once the deadline has passed; of the answer only the
status and a short preview of an error's body are read, in small pieces.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from notifications.addresses import AddressRefused, IPAddress, Target, checked_address

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

# What is kept of an endpoint's answer: enough to see an error message in the log. The
# rest is never read (the connection is closed).
RESPONSE_PREVIEW_BYTES = 512


@dataclass(frozen=True)
class PostResult:
    ok: bool
    status_code: int | None
    error: str
    duration_ms: int
    address: str


class DeadlineExceeded(TimeoutError):
    """The POST's deadline passed before the next read or write could start."""


class Clock:
    """The deadline of one POST and the per-operation timeout under it."""

    def __init__(self, *, deadline_seconds: float, operation_timeout: float) -> None:
        self.started = time.monotonic()
        self.deadline_seconds = deadline_seconds
        self.operation_timeout = min(operation_timeout, deadline_seconds)
        self.deadline = self.started + deadline_seconds

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def next_timeout(self) -> float:
        """The timeout for the next read or write; DeadlineExceeded when none is left."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded(f"no answer within {self.deadline_seconds:g} s")
        return min(self.operation_timeout, left)


class _DeadlineSocket(socket.socket):
    """A TCP socket whose every read and write is bounded by its clock's deadline."""

    clock: Clock | None = None

    def _arm(self) -> None:
        if self.clock is not None:
            self.settimeout(self.clock.next_timeout())

    def recv_into(self, buffer: WriteableBuffer, nbytes: int = 0, flags: int = 0) -> int:
        self._arm()
        return super().recv_into(buffer, nbytes, flags)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self._arm()
        return super().recv(bufsize, flags)

    def send(self, data: ReadableBuffer, flags: int = 0) -> int:
        self._arm()
        return super().send(data, flags)

    def sendall(self, data: ReadableBuffer, flags: int = 0) -> None:
        # One timeout for the whole of sendall (CPython bounds it as a whole).
        self._arm()
        super().sendall(data, flags)


class _DeadlineSSLSocket(ssl.SSLSocket):
    """The TLS counterpart: ``SSLContext.sslsocket_class`` makes ``wrap_socket`` build it."""

    clock: Clock | None = None

    def _arm(self) -> None:
        if self.clock is not None:
            self.settimeout(self.clock.next_timeout())

    def recv_into(self, buffer: WriteableBuffer, nbytes: int | None = None, flags: int = 0) -> int:
        self._arm()
        return super().recv_into(buffer, nbytes, flags)

    def recv(self, buflen: int = 1024, flags: int = 0) -> bytes:
        self._arm()
        return super().recv(buflen, flags)

    def send(self, data: ReadableBuffer, flags: int = 0) -> int:
        self._arm()
        return super().send(data, flags)

    def sendall(self, data: ReadableBuffer, flags: int = 0) -> None:
        # SSLSocket.sendall loops over send(), which arms each piece.
        super().sendall(data, flags)


def _connect(address: IPAddress, port: int, clock: Clock) -> _DeadlineSocket:
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    sock = _DeadlineSocket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(clock.next_timeout())
        sock.connect((str(address), port))
    except BaseException:
        sock.close()
        raise
    sock.clock = clock
    return sock


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to ``address`` while naming ``host`` in the Host header."""

    def __init__(self, host: str, port: int, *, address: IPAddress, clock: Clock) -> None:
        super().__init__(host, port, timeout=clock.operation_timeout)
        self._address = address
        self._clock = clock

    def connect(self) -> None:
        self.sock = _connect(self._address, self.port, self._clock)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """TLS to ``address``, with the certificate checked against ``host`` (SNI too)."""

    def __init__(self, host: str, port: int, *, address: IPAddress, clock: Clock) -> None:
        self._tls = ssl.create_default_context()
        self._tls.sslsocket_class = _DeadlineSSLSocket
        super().__init__(host, port, timeout=clock.operation_timeout, context=self._tls)
        self._address = address
        self._clock = clock

    def connect(self) -> None:
        raw = _connect(self._address, self.port, self._clock)
        # The handshake runs in C, bounded as a whole by the timeout it starts with.
        raw.settimeout(self._clock.next_timeout())
        sock: Any = self._tls.wrap_socket(raw, server_hostname=self.host)
        sock.clock = self._clock
        self.sock = sock


def _preview(response: http.client.HTTPResponse) -> str:
    """At most RESPONSE_PREVIEW_BYTES of an error's body, in the pieces that arrive before
    the deadline; a body cut short is still a preview."""
    received = b""
    try:
        while len(received) < RESPONSE_PREVIEW_BYTES:
            piece = response.read1(RESPONSE_PREVIEW_BYTES - len(received))
            if not piece:
                break
            received += piece
    except (OSError, http.client.HTTPException):
        pass
    return " ".join(received.decode(errors="replace").split())[:200]


def _failure(error: BaseException, phase: str, clock: Clock) -> str:
    if isinstance(error, TimeoutError):
        return (
            f"timed out {phase} after {clock.elapsed():.1f} s (at most "
            f"{clock.operation_timeout:g} s per read or write, {clock.deadline_seconds:g} s "
            f"for the whole POST): {error}"
        )
    return f"failed {phase}: {type(error).__name__}: {error}"


def post(
    target: Target,
    *,
    body: bytes,
    headers: dict[str, str],
    timeout: float,
    deadline: float,
) -> PostResult:
    """POST ``body`` once, within ``deadline`` seconds in all (``timeout``: each read or
    write). Resolves and checks the address first (refused: no connection at all). A 2xx
    answer is success (its body is not read); a redirect is a failure, never followed."""
    clock = Clock(deadline_seconds=deadline, operation_timeout=timeout)

    def elapsed_ms() -> int:
        return int(clock.elapsed() * 1000)

    try:
        address = checked_address(target)
    except AddressRefused as error:
        return PostResult(False, None, str(error)[:500], elapsed_ms(), "")
    connection_class = _PinnedHTTPSConnection if target.scheme == "https" else _PinnedHTTPConnection
    connection = connection_class(target.host, target.port, address=address, clock=clock)
    phase = "connecting"
    try:
        connection.connect()
        phase = "sending"
        connection.request("POST", target.path, body=body, headers=headers)
        phase = "waiting for the answer"
        response = connection.getresponse()
        status = response.status
        preview = "" if 200 <= status < 300 else _preview(response)
    except (OSError, http.client.HTTPException) as error:
        return PostResult(
            False, None, _failure(error, phase, clock)[:500], elapsed_ms(), str(address)
        )
    finally:
        connection.close()
    if 200 <= status < 300:
        return PostResult(True, status, "", elapsed_ms(), str(address))
    if 300 <= status < 400:
        why = f"HTTP {status}: redirects are not followed; point the webhook at the final URL"
    else:
        why = f"HTTP {status}: {preview}".strip()
    return PostResult(False, status, why[:500], elapsed_ms(), str(address))
