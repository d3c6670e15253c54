"""One webhook POST: to the address that passed the checks, with short timeouts, no
redirects followed. Plain ``http.client`` (no pooling, no retries of its own: the delivery
task retries with back-off and logs each attempt)."""

from __future__ import annotations

import http.client
import socket
import ssl
import time
from dataclasses import dataclass

from notifications.addresses import AddressRefused, IPAddress, Target, checked_address

# What is kept of an endpoint's answer: enough to see an error message in the log.
RESPONSE_PREVIEW_BYTES = 512


@dataclass(frozen=True)
class PostResult:
    ok: bool
    status_code: int | None
    error: str
    duration_ms: int
    address: str


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to ``address`` while naming ``host`` in the Host header."""

    def __init__(self, host: str, port: int, *, address: IPAddress, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((str(self._address), self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """TLS to ``address``, with the certificate checked against ``host`` (SNI too)."""

    def __init__(self, host: str, port: int, *, address: IPAddress, timeout: float) -> None:
        self._tls = ssl.create_default_context()
        super().__init__(host, port, timeout=timeout, context=self._tls)
        self._address = address

    def connect(self) -> None:
        raw = socket.create_connection((str(self._address), self.port), self.timeout)
        self.sock = self._tls.wrap_socket(raw, server_hostname=self.host)


def post(target: Target, *, body: bytes, headers: dict[str, str], timeout: float) -> PostResult:
    """POST ``body`` once. Resolves and checks the address first (refused: no connection
    at all). A 2xx answer is success; a redirect is a failure, never followed."""
    started = time.monotonic()

    def elapsed_ms() -> int:
        return int((time.monotonic() - started) * 1000)

    try:
        address = checked_address(target)
    except AddressRefused as error:
        return PostResult(False, None, str(error)[:500], elapsed_ms(), "")
    connection_class = _PinnedHTTPSConnection if target.scheme == "https" else _PinnedHTTPConnection
    connection = connection_class(target.host, target.port, address=address, timeout=timeout)
    try:
        connection.request("POST", target.path, body=body, headers=headers)
        response = connection.getresponse()
        status = response.status
        preview = response.read(RESPONSE_PREVIEW_BYTES).decode(errors="replace")
    except (OSError, http.client.HTTPException) as error:
        kind = "timed out" if isinstance(error, TimeoutError | socket.timeout) else "failed"
        message = f"{kind}: {type(error).__name__}: {error}"[:500]
        return PostResult(False, None, message, elapsed_ms(), str(address))
    finally:
        connection.close()
    if 200 <= status < 300:
        return PostResult(True, status, "", elapsed_ms(), str(address))
    if 300 <= status < 400:
        why = f"HTTP {status}: redirects are not followed; point the webhook at the final URL"
    else:
        why = f"HTTP {status}: {' '.join(preview.split())[:200]}".strip()
    return PostResult(False, status, why[:500], elapsed_ms(), str(address))
