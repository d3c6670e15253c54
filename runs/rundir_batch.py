"""Every account's run directories in one remote command: the batched reader.

Why: run directories are 0700 and owned by the researcher whose job wrote them, so the
listing used to run once per account, over that account's own login; with 200 active
researchers a watcher cycle cost about 200 logins (the pool keeps at most 8 connections per
login node, so nearly every one is a new login) and 200 listings. Instead:

- **Read access for the service account only.** When Gantry prepares an account's area and
  each run or drill directory in it (``runs.runtime.service_read_grant``, run as the owner),
  it grants the cluster's service account (``Cluster.ssh_user``, the login Gantry's own
  squeue/sacct use) ``rX`` on them with a POSIX access ACL and a default ACL, so what the
  trainer writes there later is readable by it too. Researchers are never the service
  account (``nodes.access.cluster.ssh_config_as`` refuses to act as it for a user), so they
  still cannot read one another's files. A group with read access would have done the same
  for reading, but every researcher's files would then carry that group, which a researcher
  in it (a cluster admin adding one by mistake) could read; the named ACL entry names one
  account.
- **One batched, link-safe reader as the service account.** ``rundir_program.py`` runs with
  ``python -I -c <its text>`` (fixed; no shell is built from anything) and gets its
  requests as JSON on stdin: for each directory, a trusted root (``<workdir>/users``, or
  ``<workdir>`` for work that ran as the service account), the path below it and the
  account that must own it. It walks with ``O_NOFOLLOW | O_DIRECTORY`` per component,
  requires every component and every file to be the account's (and files to have one
  link), lists what the shell listing lists, and reads requested ranges; everything it
  answers counts against ``BATCH_BUDGET_BYTES``, and what does not fit is deferred to
  the next command (at most ``MAX_BATCH_COMMANDS`` per call). Its answer is parsed
  defensively here (size, schema, names, the ids in exit records, the lengths of reads).
- **Fallback.** A directory the service account may not read (``denied``: an area prepared
  before the grant existed, a login node without ``setfacl``, or an owner who removed the
  ACL) is listed as before, as its own account, one command per such account; the cycle
  counts them (``RunDirectories.fallbacks``). A directory that fails a check (a link,
  another owner, not a directory) is unknown, with the reason: never "empty". A batch
  command that fails as a command (no Python there, a bad answer) falls back too; one that
  fails at the SSH level does not (the owner's logins go to the same login node), and
  every directory is unknown for the cycle.

So a cycle costs one listing command (more only past the budget) and one command of reads
over the service account's one login, whatever the number of accounts and jobs, plus one
command and login per account whose area has no grant.
"""

from __future__ import annotations

import base64
import binascii
import json
import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runs.runtime import user_area
from slurm.client import CommandRunner as ExecTransport
from slurm.errors import SlurmError

# The program, shipped as text with each command (about 10 kB).
PROGRAM = (Path(__file__).resolve().parent / "rundir_program.py").read_text()
# What one command's answer may hold, in bytes of JSON (file contents count in base64).
BATCH_BUDGET_BYTES = 32 << 20
# Commands of one listing or one round of reads, deferred work included.
MAX_BATCH_COMMANDS = 4
# An answer longer than this is refused whole: the budget plus the fixed part of each entry.
ANSWER_SLACK_BYTES = 1 << 20
ANSWER_BYTES_PER_ENTRY = 512
CODES = frozenset({"denied", "refused", "absent"})
_EXIT_NAME = re.compile(r"gantry-exit-[0-9]{1,20}(?:_[0-9]{1,20})?\.json")
_OUTPUT_NAME = re.compile(r"slurm-([0-9]{1,20}(?:_[0-9]{1,20})?)\.out")
_STEP_NAME = re.compile(r"step-[^/\x00\n]{1,200}")


class BatchOutputError(SlurmError):
    """The reader's answer is not what the program writes: refused whole."""


@dataclass(frozen=True)
class Target:
    """A directory as the reader walks it: from ``root`` (trusted, the service account's)
    through ``parts``, each owned by ``owner``."""

    directory: str
    root: str
    parts: tuple[str, ...]
    owner: str


@dataclass(frozen=True)
class FileRequest:
    """A file below a directory (``name``, relative): ``whole`` (at most ``max_bytes``, or
    refused), or the bytes from ``offset`` (at most ``max_bytes``)."""

    name: str
    max_bytes: int
    offset: int = 0
    whole: bool = False


@dataclass(frozen=True)
class FileRead:
    """What came of a ``FileRequest``: ``data`` (from ``offset``), or ``code`` and ``error``
    (``denied``, ``refused``, ``absent``, or ``deferred``: not read in this call)."""

    data: bytes | None = None
    offset: int = 0
    code: str = ""
    error: str = ""


@dataclass
class Listed:
    """One directory's answer: ``entries`` (``runs.rundir.parse_entry``'s input) or ``code``."""

    entries: dict[str, Any] | None = None
    code: str = ""
    error: str = ""
    reads: dict[str, FileRead] = field(default_factory=dict)


def batch_target(
    directory: str, *, workdir: str, account: str, service_account: str
) -> Target | None:
    """How the reader reaches ``directory`` of ``account``: below that account's area, or
    (for the service account's own work) below ``<workdir>/runs``; None for anything else
    (it is listed as its own account, as before)."""
    top = workdir.rstrip("/")
    if not top.startswith("/") or posixpath.normpath(directory) != directory:
        return None
    try:
        area = user_area(top, account) if account else ""
    except ValueError:
        return None
    if account == service_account:
        prefix, root, first = f"{top}/runs/", top, ("runs",)
    elif area:
        prefix, root, first = f"{area}/", f"{top}/users", (account,)
    else:
        return None
    if not directory.startswith(prefix) or len(directory) == len(prefix):
        return None
    parts = (*first, *directory[len(prefix) :].split("/"))
    if any(part in ("", ".", "..") or "\x00" in part for part in parts):
        return None
    return Target(directory=directory, root=root, parts=parts, owner=account)


class BatchReader:
    """Runs the reader program as the service account (``transport``) with ``python``."""

    def __init__(
        self,
        transport: ExecTransport,
        *,
        workdir: str,
        service_account: str,
        python: str,
        budget: int = BATCH_BUDGET_BYTES,
        max_commands: int = MAX_BATCH_COMMANDS,
    ) -> None:
        self.transport = transport
        self.workdir = workdir
        self.service_account = service_account
        self.python = python
        self.budget = budget
        self.max_commands = max_commands
        # Remote commands run, and directories answered through it.
        self.commands = 0

    def target(self, directory: str, account: str) -> Target | None:
        return batch_target(
            directory, workdir=self.workdir, account=account, service_account=self.service_account
        )

    def list_dirs(
        self, targets: Sequence[Target], reads: dict[str, list[FileRequest]] | None = None
    ) -> dict[str, Listed]:
        """Each target listed (and its ``reads`` read), in as few commands as the budget
        allows (at most ``max_commands``; what is still deferred then is answered
        ``deferred``)."""
        return self._rounds(targets, reads or {}, listing=True)

    def read(
        self, targets: Sequence[Target], reads: dict[str, list[FileRequest]]
    ) -> dict[str, Listed]:
        """Only the requested files of each target (no listing)."""
        return self._rounds([t for t in targets if reads.get(t.directory)], reads, listing=False)

    def _rounds(
        self, targets: Sequence[Target], reads: dict[str, list[FileRequest]], *, listing: bool
    ) -> dict[str, Listed]:
        answers: dict[str, Listed] = {}
        pending = list({t.directory: t for t in targets}.values())
        wanted = {d: list(r) for d, r in reads.items()}
        for _ in range(self.max_commands):
            if not pending:
                break
            round_answers = self._command(pending, wanted, listing=listing)
            pending, wanted = self._merge(answers, round_answers, pending, wanted, listing=listing)
        for target in pending:
            answer = answers.setdefault(target.directory, Listed())
            if listing and answer.entries is None and not answer.code:
                answer.code, answer.error = "deferred", "over the reader's budget this cycle"
            for request in wanted.get(target.directory, []):
                answer.reads.setdefault(request.name, FileRead(code="deferred"))
        return answers

    @staticmethod
    def _merge(
        answers: dict[str, Listed],
        got: dict[str, Listed],
        pending: list[Target],
        wanted: dict[str, list[FileRequest]],
        *,
        listing: bool,
    ) -> tuple[list[Target], dict[str, list[FileRequest]]]:
        """Fold one command's answers in; what is left: directories not yet listed, and
        requests answered ``deferred``."""
        left: list[Target] = []
        left_reads: dict[str, list[FileRequest]] = {}
        for target in pending:
            answer = got.get(target.directory)
            have = answers.setdefault(target.directory, Listed())
            if answer is None or answer.code == "deferred":
                left.append(target)
                left_reads[target.directory] = wanted.get(target.directory, [])
                continue
            if listing and have.entries is None and not have.code:
                have.entries, have.code, have.error = answer.entries, answer.code, answer.error
            again = []
            for request in wanted.get(target.directory, []):
                read = answer.reads.get(request.name, FileRead(code="deferred"))
                if read.code == "deferred" and not answer.code:
                    again.append(request)
                else:
                    have.reads[request.name] = read
            if again:
                left.append(target)
                left_reads[target.directory] = again
        return left, left_reads

    def _command(
        self, targets: list[Target], reads: dict[str, list[FileRequest]], *, listing: bool
    ) -> dict[str, Listed]:
        request = {
            "budget": self.budget,
            "dirs": [
                {
                    "id": index,
                    "root": t.root,
                    "parts": list(t.parts),
                    "owner": t.owner,
                    "list": listing,
                    "reads": [
                        {"name": r.name, "offset": r.offset, "max": r.max_bytes, "whole": r.whole}
                        for r in reads.get(t.directory, [])
                    ],
                }
                for index, t in enumerate(targets)
            ],
        }
        self.commands += 1
        entries = len(targets) + sum(len(reads.get(t.directory, [])) for t in targets)
        limit = self.budget + ANSWER_SLACK_BYTES + ANSWER_BYTES_PER_ENTRY * entries
        # The answer may be larger than a command's usual output bound, never than this.
        result = self.transport.exec(
            [self.python, "-I", "-S", "-c", PROGRAM],
            stdin=json.dumps(request).encode(),
            max_output=limit,
        )
        return parse_answer(result.stdout, targets, reads, limit=limit)


def parse_answer(
    stdout: str,
    targets: Sequence[Target],
    reads: dict[str, list[FileRequest]],
    *,
    limit: int,
) -> dict[str, Listed]:
    """The program's answer, checked: a JSON object of at most ``limit`` characters, one
    entry per requested id at most, each a listing, an error with a known code, or
    deferred; reads only of requested files, no longer than requested. Anything else
    refuses the whole answer (``BatchOutputError``)."""
    if len(stdout) > limit:
        raise BatchOutputError(f"the run-directory reader answered {len(stdout)} bytes")
    try:
        document = json.loads(stdout)
    except (ValueError, RecursionError) as error:
        raise BatchOutputError(f"the run-directory reader's answer is not JSON: {error}") from None
    if not isinstance(document, dict) or document.get("v") != 1:
        raise BatchOutputError("the run-directory reader's answer has no version 1")
    items = document.get("dirs")
    if not isinstance(items, list):
        raise BatchOutputError("the run-directory reader's answer has no directories")
    answers: dict[str, Listed] = {}
    for item in items:
        if not isinstance(item, dict):
            raise BatchOutputError("a directory in the reader's answer is not an object")
        index = item.get("id")
        if type(index) is not int or not 0 <= index < len(targets):
            raise BatchOutputError(f"the reader answered an id it was not asked: {index!r}")
        target = targets[index]
        if target.directory in answers:
            raise BatchOutputError(f"the reader answered {target.directory} twice")
        answers[target.directory] = _one_answer(item, target, reads.get(target.directory, []))
    return answers


def _text(value: Any, limit: int = 300) -> str:
    if not isinstance(value, str):
        raise BatchOutputError("a text in the reader's answer is not a string")
    return value[:limit]


def _one_answer(item: dict[str, Any], target: Target, requests: list[FileRequest]) -> Listed:
    if item.get("deferred") is True:
        return Listed(code="deferred")
    if "error" in item:
        code = item.get("code")
        if code not in CODES:
            raise BatchOutputError(f"unknown code {code!r} in the reader's answer")
        return Listed(code=str(code), error=_text(item["error"]))
    answer = Listed()
    if "listing" in item:
        answer.entries = _entries(item["listing"], target.directory)
    reads = item.get("reads", [])
    if not isinstance(reads, list):
        raise BatchOutputError("the reads in the reader's answer are not a list")
    by_name = {request.name: request for request in requests}
    for read in reads:
        if not isinstance(read, dict) or read.get("name") not in by_name:
            raise BatchOutputError("the reader answered a file it was not asked for")
        request = by_name[read["name"]]
        if request.name in answer.reads:
            raise BatchOutputError(f"the reader answered {request.name} twice")
        answer.reads[request.name] = _file_read(read, request)
    return answer


def _file_read(read: dict[str, Any], request: FileRequest) -> FileRead:
    if read.get("deferred") is True:
        return FileRead(code="deferred")
    if "error" in read:
        if read.get("code") not in CODES:
            raise BatchOutputError(f"unknown code {read.get('code')!r} for {request.name}")
        return FileRead(code=str(read["code"]), error=_text(read["error"]))
    encoded = read.get("data")
    if not isinstance(encoded, str) or len(encoded) > (request.max_bytes + 2) // 3 * 4:
        raise BatchOutputError(f"the reader's data for {request.name} is longer than asked")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise BatchOutputError(f"the reader's data for {request.name} is not base64") from None
    offset = 0 if request.whole else read.get("offset")
    if len(data) > request.max_bytes or (offset != request.offset and not request.whole):
        raise BatchOutputError(f"the reader's data for {request.name} is not the range asked")
    return FileRead(data=data, offset=request.offset)


def _entries(listing: Any, directory: str) -> dict[str, Any]:
    """A listing's fields, each checked (names by the same rules as the shell listing's)."""
    if not isinstance(listing, dict):
        raise BatchOutputError(f"the listing of {directory} is not an object")
    metrics = listing.get("metrics")
    if metrics is not None and (type(metrics) is not int or metrics < 0):
        raise BatchOutputError(f"the metrics size in {directory} is not a size")
    exits = listing.get("exits", {})
    outputs = listing.get("outputs", [])
    manifests = listing.get("manifests", [])
    if not (isinstance(exits, dict) and isinstance(outputs, list) and isinstance(manifests, list)):
        raise BatchOutputError(f"the listing of {directory} has fields of the wrong type")
    return {
        "metrics_size": metrics,
        "acceptance": listing.get("acceptance") is True,
        "exits": [
            f"{name} {_text(content, 4096)}"
            for name, content in exits.items()
            if _EXIT_NAME.fullmatch(name)
        ],
        "outputs": _names(outputs, _OUTPUT_NAME),
        # ``<slurm-N.out> <srun's error line>`` and ``<mtime> <heartbeat>``: checked by
        # ``runs.rundir`` with the shell listing's own rules.
        "srun": _lines(listing.get("srun", []), 512),
        "beats": _lines(listing.get("beats", []), 512),
        "manifests": [
            f"{directory}/checkpoints/{name}/manifest.json"
            for name in _names(manifests, _STEP_NAME)
        ],
    }


def _lines(values: Any, limit: int) -> list[str]:
    if not isinstance(values, list):
        raise BatchOutputError("a list in the reader's listing is not a list")
    return [value for value in values if isinstance(value, str) and len(value) <= limit]


def _names(values: Iterable[Any], pattern: re.Pattern[str]) -> list[str]:
    return [value for value in values if isinstance(value, str) and pattern.fullmatch(value)]
