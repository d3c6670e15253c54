"""A WSGI app for ``tests/controlplane/test_gunicorn_conf.py``: a download that streams ``CHUNKS`` chunks of
``CHUNK`` bytes, one every ``PAUSE_S`` seconds (as a whole log read over SFTP trickles
out), and a quick answer on any other path."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

CHUNK = 64 * 1024
CHUNKS = 10
PAUSE_S = 0.4


def _slowly() -> Iterator[bytes]:
    for index in range(CHUNKS):
        time.sleep(PAUSE_S)
        yield bytes([65 + index % 26]) * CHUNK


def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
    if environ["PATH_INFO"] == "/download":
        start_response(
            "200 OK",
            [("Content-Type", "text/plain"), ("Content-Length", str(CHUNK * CHUNKS))],
        )
        return _slowly()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]
