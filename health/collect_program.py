"""The health collector's remote half: a fixed program that Gantry runs on the login node as
the cluster's service account (``python -I -S -c <this file's text>``), with its request as
JSON on stdin and its answer as one JSON document on stdout (``health.collect`` builds the
one and checks the other). Standard library only, Python 3.6 or later; nothing in the
request is ever run or put in a shell, it is data: the directory, the limits, and the files
already seen.

It opens the health directory (where Slurm's health-check hook, ``scripts/gantry-health-check``,
writes ``<node>.json`` as root) with ``O_NOFOLLOW | O_DIRECTORY`` and requires it to be owned
by root or by the service account and writable by nobody else. It takes the names that look
like ``<node>.json`` (at most ``max_files``, in name order; the hook's temporary files start
with a dot and are skipped), opens each relative to the directory with ``O_NOFOLLOW |
O_NONBLOCK`` (a link is refused, a FIFO never blocks) and requires a regular file with one
link, owned by root or the service account, of at most ``max_bytes``. A file whose
``<mtime_ns>:<size>`` is in ``known`` is answered ``unchanged`` without being read. Every byte
of data counts against ``budget``; a file that does not fit is answered ``deferred``.

The answer says the login node's clock (``now``) so that Gantry judges a probe's age on the
clock that stamped it.
"""

import base64
import errno
import json
import os
import re
import stat
import sys
import time

# A JSON object of the request or the answer.
Answer = dict  # type: ignore[type-arg]
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\.json")
REQUEST_MAX = 1 << 20
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


def encoded(size: int) -> int:
    """What ``size`` bytes add to the answer, in base64."""
    return (size + 2) // 3 * 4


def owners() -> "set[int]":
    """Who may own the directory and the files: root and the account running this."""
    return {0, os.geteuid()}


def open_directory(path: str) -> "tuple[int | None, tuple[str, str] | None]":
    """The directory's fd, or (code, why)."""
    try:
        fd = os.open(path, _DIR)
    except OSError as error:
        if error.errno == errno.ENOENT:
            return None, ("absent", "the health directory does not exist")
        if error.errno in (errno.EACCES, errno.EPERM):
            return None, ("denied", "the service account may not read the health directory")
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            return None, ("refused", "the health directory is a link or not a directory")
        return None, ("refused", f"the health directory cannot be opened: {error.strerror}")
    info = os.fstat(fd)
    if info.st_uid not in owners():
        os.close(fd)
        return None, ("refused", f"the health directory is owned by uid {info.st_uid}")
    if info.st_mode & 0o022:
        os.close(fd)
        return None, ("refused", "the health directory is writable by others than its owner")
    return fd, None


def read_one(
    directory: int, name: str, known: "dict[str, str]", max_bytes: int, budget: "list[int]"
) -> Answer:
    """One file's entry; ``budget`` is a one-item list of the bytes still free."""
    entry = {"name": name}  # type: Answer
    try:
        fd = os.open(name, _FILE, dir_fd=directory)
    except OSError as error:
        why = "a link" if error.errno == errno.ELOOP else error.strerror
        entry.update(code="refused", error=f"cannot open: {why}")
        return entry
    try:
        info = os.fstat(fd)
        entry.update(mtime=info.st_mtime, size=info.st_size)
        entry["key"] = f"{info.st_mtime_ns}:{info.st_size}"
        if not stat.S_ISREG(info.st_mode):
            entry.update(code="refused", error="not a regular file")
        elif info.st_nlink != 1:
            entry.update(code="refused", error=f"has {info.st_nlink} links")
        elif info.st_uid not in owners():
            entry.update(code="refused", error=f"owned by uid {info.st_uid}")
        elif info.st_size > max_bytes:
            entry.update(code="too_large", error=f"{info.st_size} bytes (at most {max_bytes})")
        elif known.get(name) == entry["key"]:
            entry["unchanged"] = True
        elif encoded(info.st_size) > budget[0]:
            entry["deferred"] = True
        else:
            data = os.read(fd, max_bytes + 1)
            if len(data) > max_bytes:
                entry.update(code="too_large", error=f"grew past {max_bytes} bytes")
            else:
                budget[0] -= encoded(len(data))
                entry["data"] = base64.b64encode(data).decode("ascii")
    finally:
        os.close(fd)
    return entry


def collect(request: Answer) -> Answer:
    answer = {"v": 1, "now": time.time(), "files": [], "ignored": 0, "over_limit": 0}  # type: Answer
    directory, problem = open_directory(str(request["directory"]))
    if directory is None:
        answer["code"], answer["error"] = problem or ("refused", "not opened")
        return answer
    try:
        names = sorted(os.listdir(directory))
        wanted = [name for name in names if NAME.fullmatch(name)]
        answer["ignored"] = sum(1 for name in names if not name.startswith(".")) - len(wanted)
        max_files = int(request["max_files"])
        answer["over_limit"] = max(0, len(wanted) - max_files)
        known = request.get("known") or {}
        budget = [int(request["budget"])]
        for name in wanted[:max_files]:
            answer["files"].append(
                read_one(directory, name, known, int(request["max_bytes"]), budget)
            )
    finally:
        os.close(directory)
    return answer


def main() -> int:
    request = json.loads(sys.stdin.read(REQUEST_MAX))
    sys.stdout.write(json.dumps(collect(request)))
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
