"""The batched run-directory reader: a fixed program that the watcher runs on the login node
as the cluster's service account (``python -I -c <this file's text>``), with its request as
JSON on stdin and its answer as one JSON document on stdout (``runs.rundir_batch`` builds
the one and checks the other). Standard library only, Python 3.6 or later; nothing in it
comes from the request but data.

For each requested directory (a trusted root, e.g. ``<workdir>/users``, then the path's
components, e.g. ``alice/runs/<job id>``, and the account expected to own them) it opens
every component below the root with ``O_NOFOLLOW | O_DIRECTORY`` relative to the one above
(no link is ever followed, and no path is resolved twice), and requires each to be owned by
that account's uid. Files are taken only when they are regular, owned by that uid and have
one link (a hard link to another account's file fails both). Then it lists what
``runs.rundir``'s shell listing lists (metrics size, acceptance, checkpoint manifests, exit
records read bounded, ``slurm-*.out`` names), and reads the requested byte ranges: a tail
from an offset (at most ``max`` bytes), or a whole file of at most ``max`` bytes (refused
when larger or when it grows past it). Opens are non-blocking (a FIFO swapped in is
refused by ``fstat`` before any read). Everything it writes counts against one budget per
run (``budget`` bytes); what does not fit is answered ``deferred``, for the next command.

A directory that fails a check is answered with ``error`` and a ``code``: ``denied``
(the service account may not read it: the caller falls back to the owner's own login),
``refused`` (a link, another owner, not a directory: unknown, never empty), ``absent``
(it does not exist, which the shell listing also reports as empty).
"""

import base64
import errno
import json
import os
import pwd
import stat
import sys

# A JSON object of the request or the answer.
Answer = dict  # type: ignore[type-arg]

EXIT_MAX = 1024
MAX_MANIFESTS = 4096
MAX_EXITS = 64
MAX_OUTPUTS = 256
# As ``runs.rundir``'s shell listing: the end of each Slurm output searched for srun's error
# lines (at most 16, each cut to 200 characters), and at most so many heartbeat files, the
# first 256 bytes of each.
SRUN_TAIL_BYTES = 16384
SRUN_LINES = 16
SRUN_LINE_CHARS = 200
MAX_BEATS = 4096
BEAT_MAX = 256
REQUEST_MAX = 16 << 20
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


class Refused(Exception):
    def __init__(self, code: str, why: str) -> None:
        Exception.__init__(self, why)
        self.code = code


def cost(text: str) -> int:
    """What ``text`` adds to the answer, as JSON (escapes included)."""
    return len(json.dumps(text)) + 4


def encoded(size: int) -> int:
    """What ``size`` bytes add to the answer, in base64."""
    return (size + 2) // 3 * 4 + 64


class Budget:
    """The bytes this run's answer may still take."""

    def __init__(self, total: int) -> None:
        self.left = total

    def take(self, size: int) -> bool:
        if size > self.left:
            self.left = 0
            return False
        self.left -= size
        return True


def _name_ok(name: object) -> bool:
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and "\0" not in name
        and len(name) <= 255
    )


def _failure(error: OSError, what: str) -> Refused:
    if error.errno in (errno.EACCES, errno.EPERM):
        return Refused("denied", "permission denied on " + what)
    if error.errno == errno.ENOENT:
        return Refused("absent", what + " does not exist")
    if error.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return Refused("refused", what + " is a link or not a directory")
    return Refused("refused", what + ": " + (error.strerror or str(error)))


def open_dir(parent: int, name: str, uid: int) -> int:
    """A directory below ``parent``, never through a link, owned by ``uid``."""
    if not _name_ok(name):
        raise Refused("refused", f"bad path component {name!r}")
    try:
        fd = os.open(name, _DIR, dir_fd=parent)
    except OSError as error:
        raise _failure(error, name) from None
    found = os.fstat(fd)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != uid:
        os.close(fd)
        raise Refused("refused", f"{name} is not a directory of the owner's")
    return fd


def file_ok(found: os.stat_result, uid: int) -> bool:
    return stat.S_ISREG(found.st_mode) and found.st_uid == uid and found.st_nlink == 1


def lstat_file(parent: int, name: str, uid: int) -> "os.stat_result | None":
    try:
        found = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except OSError:
        return None
    return found if file_ok(found, uid) else None


def open_file(parent: int, name: str, uid: int) -> "tuple[int, os.stat_result]":
    """A regular file of ``uid``'s with one link, opened without following a link; what
    was opened is what is checked (``fstat``), so a swap after a look changes nothing."""
    if not _name_ok(name):
        raise Refused("refused", f"bad file name {name!r}")
    try:
        fd = os.open(name, _FILE, dir_fd=parent)
    except OSError as error:
        raise _failure(error, name) from None
    found = os.fstat(fd)
    if not file_ok(found, uid):
        os.close(fd)
        raise Refused("refused", f"{name} is not a regular file of the owner's with one link")
    return fd, found


def read_at(fd: int, offset: int, size: int) -> bytes:
    chunks = []
    while size > 0:
        chunk = os.pread(fd, min(size, 1 << 20), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def list_checkpoints(fd: int, uid: int, budget: Budget) -> "list[str]":
    try:
        top = open_dir(fd, "checkpoints", uid)
    except Refused:
        return []
    found = []
    try:
        names = sorted(n for n in os.listdir(top) if n.startswith("step-") and _name_ok(n))
        for name in names[:MAX_MANIFESTS]:
            try:
                step = open_dir(top, name, uid)
            except Refused:
                continue
            try:
                if lstat_file(step, "manifest.json", uid) is not None and budget.take(cost(name)):
                    found.append(name)
            finally:
                os.close(step)
    finally:
        os.close(top)
    return found


def read_exit(fd: int, name: str, uid: int) -> "str | None":
    try:
        handle, found = open_file(fd, name, uid)
    except Refused:
        return None
    try:
        if found.st_size > EXIT_MAX:
            return None
        data = read_at(handle, 0, EXIT_MAX + 1)
    finally:
        os.close(handle)
    if len(data) > EXIT_MAX:
        return None
    return data.decode("utf-8", "replace").replace("\n", "")


def srun_errors(fd: int, name: str, uid: int) -> "list[str]":
    """srun's own error lines in the end of a Slurm output file."""
    try:
        handle, found = open_file(fd, name, uid)
    except Refused:
        return []
    try:
        start = max(0, found.st_size - SRUN_TAIL_BYTES)
        data = read_at(handle, start, SRUN_TAIL_BYTES)
    finally:
        os.close(handle)
    lines = [line for line in data.split(b"\n") if line.startswith(b"srun: error: ")]
    return [line.decode("utf-8", "replace")[:SRUN_LINE_CHARS] for line in lines[:SRUN_LINES]]


def list_beats(fd: int, uid: int, budget: Budget) -> "list[str]":
    """``<mtime> <content>`` of each rank's heartbeat file (``ranks/rank-*.beat``)."""
    try:
        ranks = open_dir(fd, "ranks", uid)
    except Refused:
        return []
    beats = []
    try:
        names = sorted(
            n for n in os.listdir(ranks) if n.startswith("rank-") and n.endswith(".beat")
        )
        for name in names[:MAX_BEATS]:
            try:
                handle, found = open_file(ranks, name, uid)
            except Refused:
                continue
            try:
                data = read_at(handle, 0, BEAT_MAX)
            finally:
                os.close(handle)
            text = data.decode("utf-8", "replace").replace("\n", "")
            line = f"{int(found.st_mtime)} {text}"
            if budget.take(cost(line)):
                beats.append(line)
    finally:
        os.close(ranks)
    return beats


def list_directory(fd: int, uid: int, budget: Budget) -> Answer:
    """What the shell listing of ``runs.rundir`` lists, of the directory ``fd``."""
    entry = {"metrics": None}  # type: Answer
    names = sorted(os.listdir(fd))
    metrics = lstat_file(fd, "metrics.jsonl", uid)
    if metrics is not None:
        entry["metrics"] = metrics.st_size
    entry["acceptance"] = lstat_file(fd, "acceptance.json", uid) is not None
    exits = {}  # type: dict[str, str]
    for name in [n for n in names if n.startswith("gantry-exit-") and n.endswith(".json")]:
        if len(exits) >= MAX_EXITS:
            break
        content = read_exit(fd, name, uid)
        if content is not None and budget.take(cost(name) + cost(content)):
            exits[name] = content
    entry["exits"] = exits
    outputs = []  # type: list[str]
    srun = []  # type: list[str]
    for name in [n for n in names if n.startswith("slurm-") and n.endswith(".out")]:
        if len(outputs) >= MAX_OUTPUTS:
            break
        if lstat_file(fd, name, uid) is not None and budget.take(cost(name)):
            outputs.append(name)
            errors = [f"{name} {line}" for line in srun_errors(fd, name, uid)]
            srun.extend(line for line in errors if budget.take(cost(line)))
    entry["outputs"] = outputs
    entry["srun"] = srun
    entry["beats"] = list_beats(fd, uid, budget)
    entry["manifests"] = list_checkpoints(fd, uid, budget)
    return entry


def read_whole(handle: int, found: os.stat_result, name: str, limit: int, budget: Budget) -> Answer:
    if found.st_size > limit:
        return {
            "error": f"{name} is {found.st_size} bytes, over the {limit} read as evidence",
            "code": "refused",
        }
    if not budget.take(encoded(found.st_size)):
        return {"deferred": True}
    data = read_at(handle, 0, limit + 1)
    if len(data) > limit:
        return {"error": f"{name} grew past the {limit} bytes read as evidence", "code": "refused"}
    return {"data": base64.b64encode(data).decode("ascii")}


def read_tail(
    handle: int, found: os.stat_result, offset: int, limit: int, budget: Budget
) -> Answer:
    room = max(0, (budget.left - 64) // 4 * 3)
    size = max(0, min(limit, found.st_size - offset, room))
    if size == 0 and found.st_size > offset:
        return {"deferred": True}
    budget.take(encoded(size))
    return {
        "offset": offset,
        "data": base64.b64encode(read_at(handle, offset, size)).decode("ascii"),
    }


def read_one(fd: int, uid: int, request: Answer, budget: Budget) -> Answer:
    """One requested file below the directory ``fd``: its path walked like the directory's."""
    name, offset, limit = request.get("name"), request.get("offset", 0), request.get("max")
    answer = {"name": name}  # type: Answer
    if not isinstance(name, str) or not isinstance(offset, int) or not isinstance(limit, int):
        answer.update(error="bad request", code="refused")
        return answer
    if offset < 0 or limit <= 0:
        answer.update(error="bad range", code="refused")
        return answer
    parts = name.split("/")
    opened = []
    try:
        here = fd
        for part in parts[:-1]:
            here = open_dir(here, part, uid)
            opened.append(here)
        handle, found = open_file(here, parts[-1], uid)
        opened.append(handle)
        if request.get("whole") is True:
            answer.update(read_whole(handle, found, name, limit, budget))
        else:
            answer.update(read_tail(handle, found, offset, limit, budget))
    except Refused as refused:
        answer.update(error=str(refused), code=refused.code)
    finally:
        for each in opened:
            os.close(each)
    return answer


def one_directory(request: Answer, budget: Budget) -> Answer:
    """One requested directory: walked from its root, listed, and its files read."""
    answer = {"id": request.get("id")}  # type: Answer
    if budget.left <= 0:
        answer["deferred"] = True
        return answer
    opened = []
    try:
        owner = request.get("owner")
        if not isinstance(owner, str):
            raise Refused("refused", "no owner")
        try:
            uid = pwd.getpwnam(owner).pw_uid
        except KeyError:
            raise Refused("refused", f"no account {owner} on the login node") from None
        try:
            here = os.open(str(request.get("root")), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as error:
            raise _failure(error, "the root") from None
        opened.append(here)
        parts = request.get("parts")
        if not isinstance(parts, list) or not parts:
            raise Refused("refused", "no path")
        for part in parts:
            here = open_dir(here, part, uid)
            opened.append(here)
        if request.get("list") is True:
            try:
                answer["listing"] = list_directory(here, uid, budget)
            except OSError as error:
                raise _failure(error, "the directory") from None
        reads = request.get("reads") or []
        answer["reads"] = [
            read_one(here, uid, each, budget) for each in reads if isinstance(each, dict)
        ]
    except Refused as refused:
        answer.update(error=str(refused), code=refused.code)
    finally:
        for each in opened:
            os.close(each)
    return answer


def main() -> None:
    request = json.loads(sys.stdin.read(REQUEST_MAX))
    budget = Budget(int(request.get("budget", 0)))
    answers = [
        one_directory(each, budget) for each in request.get("dirs", []) if isinstance(each, dict)
    ]
    sys.stdout.write(json.dumps({"v": 1, "dirs": answers}))


if __name__ == "__main__":
    main()
