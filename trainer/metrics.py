"""``metrics.jsonl`` writer: one complete line per os.write() on an O_APPEND descriptor."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from typing import Any


class MetricsWriter:
    def __init__(self, path: str | None) -> None:
        self.path = path
        self._fd: int | None = None
        self._lock = threading.Lock()
        if path is not None:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        if self._fd is None:
            return
        line = (json.dumps(record, allow_nan=True, separators=(",", ":")) + "\n").encode()
        with self._lock:
            view = memoryview(line)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.fsync(self._fd)
                os.close(self._fd)
                self._fd = None


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """Parse complete lines only (a trailing partial line is ignored)."""
    out: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.endswith("\n"):
                break
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
    return out
