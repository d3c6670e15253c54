"""The production server settings (``controlplane.gunicorn_conf``) stream a download that
outlasts gunicorn's ``--timeout`` to its end, and serve other requests meanwhile; the same
download under sync workers is cut (what the settings are for)."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from stream_support import CHUNK, CHUNKS, PAUSE_S

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 2


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_until_a_worker_answers(port: int) -> None:
    # The master listens before its worker has booted: a connection alone is not an answer.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            probe = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            probe.request("GET", "/")
            if probe.getresponse().read() == b"ok":
                return
        except (OSError, http.client.HTTPException):
            time.sleep(0.1)
    raise AssertionError(f"gunicorn on port {port} never answered")


def _serve(*options: str) -> Iterator[int]:
    port = _free_port()
    gunicorn = str(Path(sys.executable).parent / "gunicorn")
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}
    argv = [gunicorn, *options, "-w", "1", "-b", f"127.0.0.1:{port}"]
    argv += ["--timeout", str(TIMEOUT_S), "--graceful-timeout", "1", "stream_support"]
    server = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
    try:
        _wait_until_a_worker_answers(port)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture
def production() -> Iterator[int]:
    yield from _serve("-c", "python:controlplane.gunicorn_conf", "--threads", "4")


@pytest.fixture
def sync_workers() -> Iterator[int]:
    yield from _serve("--worker-class", "sync")


def _download(port: int, got: dict[str, int]) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", "/download")
        response = connection.getresponse()
        while chunk := response.read(CHUNK):
            got["bytes"] = got.get("bytes", 0) + len(chunk)
    except (OSError, http.client.HTTPException):
        got["cut"] = 1
    finally:
        connection.close()


def test_a_download_longer_than_the_timeout_streams_whole(production: int) -> None:
    assert CHUNKS * PAUSE_S > TIMEOUT_S
    downloads = [{} for _ in range(2)]  # type: list[dict[str, int]]
    threads = [threading.Thread(target=_download, args=(production, d)) for d in downloads]
    for thread in threads:
        thread.start()
    time.sleep(PAUSE_S)
    # Two downloads running on the one worker, and it still answers before they end (no
    # absolute time: a loaded machine slows both alike).
    quick = http.client.HTTPConnection("127.0.0.1", production, timeout=10)
    quick.request("GET", "/")
    assert quick.getresponse().read() == b"ok"
    assert any(thread.is_alive() for thread in threads)
    assert all(d.get("bytes", 0) < CHUNK * CHUNKS for d in downloads)
    for thread in threads:
        thread.join(timeout=60)
    assert downloads == [{"bytes": CHUNK * CHUNKS}] * 2


def test_sync_workers_cut_the_same_download(sync_workers: int) -> None:
    got: dict[str, int] = {}
    _download(sync_workers, got)
    assert got.get("bytes", 0) < CHUNK * CHUNKS
