"""The one listing of run directories: what a watcher cycle knows of the files the jobs and
drills it watches wrote, read in one remote command per account.

A run directory belongs to the account the object runs as (0700), and that account may
be hostile to other researchers: so every directory is listed as its own account, only
regular files count (no links, no devices, no directories named like files), each exit
record is read bounded and kept only when the Slurm id in its file name and the one in
its content agree, and what a directory shows is evidence about the objects of that
directory alone (``RunDirectory.exit_record``), never merged across directories.

``RunDirectories`` is one cycle's listing: the cycle names up front every directory it
may look at (``want``), and the first look lists them all; later looks are answered from
it, and only a directory nobody named is listed again. Given a ``BatchReader``
(``runs.rundir_batch``: the watcher gives one), it lists every account's directories in
one command as the service account, which the owners let read them (a POSIX ACL), with
the same checks done link-safely there; a directory the service account may not read falls
back to the listing as its own account (one command per such account, counted in
``fallbacks``). Without one (or for a directory outside the accounts' areas), one command
per account, as its own account.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runs.rundir_batch import BatchReader, FileRead, FileRequest, Target
from slurm import errors as slurm_errors
from slurm.transport import SshTransport

logger = logging.getLogger(__name__)

# The most of an exit record that is read (it is a few dozen bytes when honest).
EXIT_RECORD_MAX_BYTES = 1024
# Directories per listing command (each entry of the script is at most ~1.5 kB).
LIST_CHUNK = 64

# One directory's entry in the listing script. ``-f`` and ``! -L``: a regular file that is
# not a link. Exit records print their own file name, so the id in it can be checked.
_LIST_ENTRY = (
    'd={dir}; printf "D %s\\n" "$d"; '
    'f="$d/metrics.jsonl"; if [ -f "$f" ] && [ ! -L "$f" ]; then '
    'printf "M %s\\n" "$(stat -c %s "$f")"; fi; '
    'f="$d/acceptance.json"; if [ -f "$f" ] && [ ! -L "$f" ]; then echo A; fi; '
    'for f in "$d"/checkpoints/step-*/manifest.json; do '
    'if [ -f "$f" ] && [ ! -L "$f" ]; then printf "C %s\\n" "$f"; fi; done; '
    'for f in "$d"/gantry-exit-*.json; do if [ -f "$f" ] && [ ! -L "$f" ]; then '
    'printf "X %s %s\\n" "${{f##*/}}" "$(head -c {limit} "$f" | tr -d "\\n")"; fi; done; '
    'for f in "$d"/slurm-*.out; do if [ -f "$f" ] && [ ! -L "$f" ]; then '
    'printf "O %s\\n" "${{f##*/}}"; '
    'tail -c {tail} "$f" | grep -a -m 16 "^srun: error: " | cut -c 1-200 | '
    'while IFS= read -r l; do printf "E %s %s\\n" "${{f##*/}}" "$l"; done; fi; done; '
    'n=0; for f in "$d"/ranks/rank-*.beat; do n=$((n + 1)); [ "$n" -gt {beats} ] && break; '
    'if [ -f "$f" ] && [ ! -L "$f" ]; then printf "R %s %s\\n" "$(stat -c %Y "$f")" '
    '"$(head -c 256 "$f" | tr -d "\\n")"; fi; done; '
)

# How much of the end of a Slurm output file is searched for srun's own error lines, and
# the most heartbeat files read per directory.
SRUN_TAIL_BYTES = 16384
MAX_BEATS = 4096
_OUT_NAME = re.compile(r"slurm-([0-9]{1,20}(?:_[0-9]{1,20})?)\.out")
# ``srun: error: <node>: task <N>: <what>`` (srun's line for a task that ended badly).
_SRUN_ERROR = re.compile(
    r"srun: error: (?P<node>[A-Za-z0-9._-]{1,64}): tasks? (?P<tasks>[0-9][0-9,-]{0,40}): "
    r"(?P<what>.{1,120})"
)

_EXIT_NAME = re.compile(r"gantry-exit-([0-9]{1,20}(?:_[0-9]{1,20})?)\.json")


@dataclass(frozen=True)
class Beat:
    """A rank's heartbeat file: what it says, and when the file system saw it written."""

    rank: int
    node: str
    step: int
    modified: int


def _beat_line(value: str) -> Beat | None:
    modified, _, content = value.partition(" ")
    if not modified.isdigit():
        return None
    try:
        record = json.loads(content)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    rank, node, step = record.get("rank"), record.get("node"), record.get("step")
    if not (
        isinstance(rank, int)
        and 0 <= rank < 1_000_000
        and isinstance(node, str)
        and re.fullmatch(r"[A-Za-z0-9._-]{1,64}", node)
        and isinstance(step, int)
        and step >= 0
    ):
        return None
    return Beat(rank=rank, node=node, step=step, modified=int(modified))


def _srun_error_line(value: str) -> tuple[str, tuple[str, str, str]] | None:
    name, _, line = value.partition(" ")
    named = _OUT_NAME.fullmatch(name)
    matched = _SRUN_ERROR.fullmatch(line.strip())
    if named is None or matched is None:
        return None
    return named.group(1), (matched["node"], matched["tasks"], matched["what"].strip())


@dataclass
class RunDirectory:
    """What one run directory shows."""

    # Exit records by Slurm job id: only those whose file name and content agree.
    exits: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Slurm job ids that wrote output here (``slurm-<id>.out``): they ran.
    outputs: set[str] = field(default_factory=set)
    metrics_size: int | None = None
    acceptance: bool = False
    manifests: list[str] = field(default_factory=list)
    # srun's error lines by Slurm job id, in the order srun wrote them: (node, tasks, what).
    # The job's own output file holds them, so they are the job's claim, not Slurm's record.
    srun_errors: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)
    # Each rank's newest heartbeat (``trainer/heartbeat.py``), by rank.
    beats: dict[int, Beat] = field(default_factory=dict)

    def exit_record(self, slurm_job_id: str) -> dict[str, Any] | None:
        """The exit record of that Slurm job, if this directory holds one."""
        return self.exits.get(slurm_job_id) if slurm_job_id else None


def _exit_line(value: str) -> tuple[str, dict[str, Any]] | None:
    """(Slurm id, record) of an ``X <file name> <content>`` line, or None when the name is
    not an exit record's, the content is not a JSON object, or the two ids disagree."""
    name, _, content = value.partition(" ")
    matched = _EXIT_NAME.fullmatch(name)
    if matched is None:
        return None
    try:
        record = json.loads(content)
    except ValueError:
        return None
    if not isinstance(record, dict) or str(record.get("slurm_job_id", "")) != matched.group(1):
        return None
    return matched.group(1), record


def parse_listing(output: str) -> dict[str, RunDirectory]:
    """The listing script's output, by directory."""
    found: dict[str, RunDirectory] = {}
    current: RunDirectory | None = None
    # A manifest path outside the directory being listed (a name with a newline in it,
    # say) is not taken.
    prefix = "\0"
    for line in output.splitlines():
        kind, _, value = line.partition(" ")
        if kind == "D":
            current = found.setdefault(value, RunDirectory())
            prefix = value.rstrip("/") + "/checkpoints/"
        elif current is None:
            continue
        elif kind == "M" and value.strip().isdigit():
            current.metrics_size = int(value)
        elif kind == "A":
            current.acceptance = True
        elif kind == "C" and value.startswith(prefix):
            current.manifests.append(value)
        elif kind == "X":
            parsed = _exit_line(value)
            if parsed is not None:
                current.exits[parsed[0]] = parsed[1]
        elif kind == "O" and value.startswith("slurm-") and value.endswith(".out"):
            current.outputs.add(value.removeprefix("slurm-").removesuffix(".out"))
        elif kind == "E":
            error = _srun_error_line(value)
            if error is not None:
                current.srun_errors.setdefault(error[0], []).append(error[1])
        elif kind == "R":
            beat = _beat_line(value)
            if beat is not None and beat.rank not in current.beats:
                current.beats[beat.rank] = beat
    return found


def parse_entry(entries: dict[str, Any]) -> RunDirectory:
    """A directory as the batched reader listed it (``runs.rundir_batch``), with the same
    rules for exit records as the shell listing's."""
    found = RunDirectory(
        metrics_size=entries["metrics_size"],
        acceptance=entries["acceptance"],
        manifests=list(entries["manifests"]),
        outputs={name.removeprefix("slurm-").removesuffix(".out") for name in entries["outputs"]},
    )
    for line in entries["exits"]:
        parsed = _exit_line(line)
        if parsed is not None:
            found.exits[parsed[0]] = parsed[1]
    for line in entries["srun"]:
        error = _srun_error_line(line)
        if error is not None:
            found.srun_errors.setdefault(error[0], []).append(error[1])
    for line in entries["beats"]:
        beat = _beat_line(line)
        if beat is not None and beat.rank not in found.beats:
            found.beats[beat.rank] = beat
    return found


def list_run_directories(
    transport: SshTransport, directories: Sequence[str]
) -> dict[str, RunDirectory]:
    """One remote command, as ``transport``'s account, per ``LIST_CHUNK`` of
    ``directories`` (sshd hands a command to the shell as one argument, which Linux caps
    at 128 KiB: about 90 entries of the script)."""
    unique = list(dict.fromkeys(directories))
    if not unique:
        return {}
    listed: dict[str, RunDirectory] = {}
    for start in range(0, len(unique), LIST_CHUNK):
        script = "".join(
            _LIST_ENTRY.format(
                dir=shlex.quote(d),
                limit=EXIT_RECORD_MAX_BYTES,
                tail=SRUN_TAIL_BYTES,
                beats=MAX_BEATS,
            )
            for d in unique[start : start + LIST_CHUNK]
        )
        listed.update(parse_listing(transport.exec_shell(script + "true").stdout))
    # A directory the command reached shows (an empty one included); one it did not is
    # missing, and the caller treats it as unknown, never as empty.
    return {directory: listed.get(directory, RunDirectory()) for directory in unique}


# How to reach a directory: its account's transport, resolved when needed.
OwnerTransport = Callable[[], SshTransport]


class RunDirectories:
    """One watcher cycle's listing of run directories (see the module's docstring)."""

    def __init__(self, batch: BatchReader | None = None) -> None:
        self._listed: dict[str, RunDirectory] = {}
        self._wanted: dict[str, OwnerTransport] = {}
        self.batch = batch
        # Directories the batched reader listed (their files are read through it too).
        self._targets: dict[str, Target] = {}
        # Remote listing commands sent per account (one per account per look that had
        # something new), and directories that needed them although a batch was given.
        self.owner_commands = 0
        self.fallbacks = 0

    @property
    def commands(self) -> int:
        """Remote commands sent: the batched reader's and the per-account listings."""
        return self.owner_commands + (self.batch.commands if self.batch is not None else 0)

    def batched(self, directory: str) -> bool:
        """Whether the batched reader listed ``directory`` (and so may read its files)."""
        return directory in self._targets

    def want(self, items: Sequence[tuple[str, OwnerTransport]]) -> None:
        """Directories this cycle will look at: listed with the first look."""
        for directory, owner in items:
            if directory not in self._listed:
                self._wanted.setdefault(directory, owner)

    def look(
        self, items: Sequence[tuple[str, OwnerTransport]], errors: list[str]
    ) -> dict[str, RunDirectory]:
        """What ``items``' directories show. Directories of an account Gantry could not log
        in as (or whose listing failed, or that failed the batched reader's checks) are
        missing from the result (unknown, never "empty": no proof of absence may rest on
        them) and named in ``errors``."""
        missing = {d: owner for d, owner in items if d not in self._listed}
        if missing:
            missing = {**self._wanted, **missing}
            self._wanted = {}
            self._list(missing, errors)
        return {d: self._listed[d] for d, _ in items if d in self._listed}

    def read(self, reads: dict[str, list[FileRequest]]) -> dict[str, dict[str, FileRead]]:
        """The requested files of directories the batched reader listed, in one command
        (more only past its budget). Raises ``SlurmError`` when that command fails."""
        if self.batch is None:
            return {}
        targets = [self._targets[d] for d in reads if d in self._targets]
        answers = self.batch.read(targets, reads)
        return {directory: answer.reads for directory, answer in answers.items()}

    def _list(self, items: dict[str, OwnerTransport], errors: list[str]) -> None:
        groups: dict[int, tuple[SshTransport, list[str]]] = {}
        for directory, owner in items.items():
            try:
                transport = owner()
            except slurm_errors.SlurmError as error:
                errors.append(f"{directory}: {error}")
                continue
            groups.setdefault(id(transport), (transport, []))[1].append(directory)
        if self.batch is not None:
            groups = self._list_batched(groups, errors)
        for transport, directories in groups.values():
            self.owner_commands += -(-len(set(directories)) // LIST_CHUNK)
            try:
                self._listed.update(list_run_directories(transport, directories))
            except slurm_errors.SlurmError as error:
                logger.warning(
                    "listing run directories as %s failed: %s", transport.config.user, error
                )
                errors.append(f"run directories of {transport.config.user}: {error}")

    def _list_batched(
        self, groups: dict[int, tuple[SshTransport, list[str]]], errors: list[str]
    ) -> dict[int, tuple[SshTransport, list[str]]]:
        """List what the batched reader can reach; what is left for the owners' logins."""
        assert self.batch is not None
        targets: dict[str, Target] = {}
        for transport, directories in groups.values():
            for directory in directories:
                target = self.batch.target(directory, transport.config.user)
                if target is not None:
                    targets[directory] = target
        if not targets:
            return groups
        try:
            answers = self.batch.list_dirs(list(targets.values()))
        except slurm_errors.SshError as error:
            # The login node itself is unreachable: the owners' logins would fail alike.
            errors.append(f"run directories (batched, as the service account): {error}")
            return {
                key: (t, [d for d in ds if d not in targets]) for key, (t, ds) in groups.items()
            }
        except slurm_errors.SlurmError as error:
            logger.warning("the batched run-directory reader failed: %s", error)
            answers = {}
        left: dict[int, tuple[SshTransport, list[str]]] = {}
        for key, (transport, directories) in groups.items():
            for directory in directories:
                answer = answers.get(directory)
                if answer is not None and answer.entries is not None:
                    self._listed[directory] = parse_entry(answer.entries)
                    self._targets[directory] = targets[directory]
                elif answer is not None and answer.code == "absent":
                    self._listed[directory] = RunDirectory()
                    self._targets[directory] = targets[directory]
                elif answer is not None and answer.code in ("refused", "deferred"):
                    errors.append(f"{directory}: {answer.error or answer.code}")
                else:
                    # Not reachable by the reader (no grant, not below an area, it failed).
                    self.fallbacks += directory in targets
                    left.setdefault(key, (transport, []))[1].append(directory)
        return left
