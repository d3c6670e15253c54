"""Durable IO: fsync, atomic JSON, and the thread pool that hashes and writes files."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

BLOCK = 256 << 10  # hash/write/read step inside a file: small enough to stay in cache


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, mv: memoryview) -> None:
    off, n = 0, len(mv)
    while off < n:
        off += os.write(fd, mv[off:])


def write_durable(path: str, data: bytes | memoryview) -> None:
    """Write bytes to ``path`` and fsync the file (not atomic; caller decides the name)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, memoryview(data))
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_json(path: str, obj: Any) -> None:
    """temp file + fsync + rename + fsync(dir): readers see the old file or the whole new one."""
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    write_durable(tmp, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def io_workers() -> int:
    """Threads for checkpoint IO: one more than the cores, so one can wait on the disk
    (write/fsync/read) while the others hash; at least 2, at most 8."""
    env = os.environ.get("TRAINER_CKPT_THREADS")
    if env:
        return max(1, int(env))
    return max(2, min(8, (os.cpu_count() or 1) + 1))


def io_pool() -> ThreadPoolExecutor:
    """Shared pool for hashing/IO (hashlib and os.read/write release the GIL). Tasks never
    submit to the pool themselves, so callers may wait on it from any thread."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=io_workers(), thread_name_prefix="ckpt-io")
        return _POOL


def blocks(mv: memoryview) -> Iterator[memoryview]:
    for off in range(0, len(mv), BLOCK):
        yield mv[off : off + BLOCK]


def write_hashed(path: str, pieces: list[memoryview]) -> tuple[int, str]:
    """Hash, write and fsync ``pieces`` into a new file; returns (size, sha256). Every byte is
    hashed from the same memory it is written from."""
    h = hashlib.sha256()
    n = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for piece in pieces:
            for mv in blocks(piece):
                h.update(mv)
                _write_all(fd, mv)
                n += len(mv)
        os.fsync(fd)
    finally:
        os.close(fd)
    return n, h.hexdigest()


def _hash_file(path: str) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    buf = bytearray(BLOCK)
    mv = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        with contextlib.suppress(OSError, AttributeError):
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while True:
            got = fh.readinto(mv)
            if not got:
                break
            h.update(mv[:got])
            n += got
    return h.hexdigest(), n


def sha256_file(path: str) -> tuple[str, int]:
    """sha256 and size of a file."""
    return _hash_file(path)


def sha256_files(paths: list[str]) -> list[tuple[str, int] | BaseException]:
    """sha256 and size of several files, hashed in parallel (errors returned, not raised)."""
    futs = [io_pool().submit(_hash_file, p) for p in paths]
    out: list[tuple[str, int] | BaseException] = []
    for f in futs:
        try:
            out.append(f.result())
        except Exception as exc:
            out.append(exc)
    return out
