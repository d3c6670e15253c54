"""The one listing of run directories: what a watcher cycle knows of the files the jobs and
drills it watches wrote, read in one remote command per account.

A run directory belongs to the account the object runs as (0700), and that account may
be hostile to other researchers: so every directory is listed as its own account, only
regular files count (no links, no devices, no directories named like files), each exit
record is read bounded and kept only when the Slurm id in its file name and the one in
its content agree, and what a directory shows is evidence about the objects of that
directory alone (``RunDirectory.exit_record``), never merged across directories.

``RunDirectories`` is one cycle's listing: the cycle names up front every directory it
may look at (``want``), and the first look lists them all, one command per account;
later looks are answered from it, and only a directory nobody named is listed again.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nodes.slurm import errors as slurm_errors
from nodes.slurm.transport import SshTransport

logger = logging.getLogger(__name__)

# The most of an exit record that is read (it is a few dozen bytes when honest).
EXIT_RECORD_MAX_BYTES = 1024

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
    'printf "O %s\\n" "${{f##*/}}"; fi; done; '
)

_EXIT_NAME = re.compile(r"gantry-exit-([0-9]{1,20}(?:_[0-9]{1,20})?)\.json")


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
    return found


def list_run_directories(
    transport: SshTransport, directories: Sequence[str]
) -> dict[str, RunDirectory]:
    """One remote command, as ``transport``'s account, for all ``directories``."""
    unique = list(dict.fromkeys(directories))
    if not unique:
        return {}
    script = "".join(
        _LIST_ENTRY.format(dir=shlex.quote(d), limit=EXIT_RECORD_MAX_BYTES) for d in unique
    )
    listed = parse_listing(transport.exec_shell(script + "true").stdout)
    # A directory the command reached shows (an empty one included); one it did not is
    # missing, and the caller treats it as unknown, never as empty.
    return {directory: listed.get(directory, RunDirectory()) for directory in unique}


# How to reach a directory: its account's transport, resolved when needed.
OwnerTransport = Callable[[], SshTransport]


class RunDirectories:
    """One watcher cycle's listing of run directories (see the module's docstring)."""

    def __init__(self) -> None:
        self._listed: dict[str, RunDirectory] = {}
        self._wanted: dict[str, OwnerTransport] = {}
        # Remote listing commands sent (one per account per look that had something new).
        self.commands = 0

    def want(self, items: Sequence[tuple[str, OwnerTransport]]) -> None:
        """Directories this cycle will look at: listed with the first look."""
        for directory, owner in items:
            if directory not in self._listed:
                self._wanted.setdefault(directory, owner)

    def look(
        self, items: Sequence[tuple[str, OwnerTransport]], errors: list[str]
    ) -> dict[str, RunDirectory]:
        """What ``items``' directories show. Directories of an account Gantry could not log
        in as (or whose listing failed) are missing from the result (unknown, never
        "empty": no proof of absence may rest on them) and named in ``errors``."""
        missing = {d: owner for d, owner in items if d not in self._listed}
        if missing:
            missing = {**self._wanted, **missing}
            self._wanted = {}
            self._list(missing, errors)
        return {d: self._listed[d] for d, _ in items if d in self._listed}

    def _list(self, items: dict[str, OwnerTransport], errors: list[str]) -> None:
        groups: dict[int, tuple[SshTransport, list[str]]] = {}
        for directory, owner in items.items():
            try:
                transport = owner()
            except slurm_errors.SlurmError as error:
                errors.append(f"{directory}: {error}")
                continue
            groups.setdefault(id(transport), (transport, []))[1].append(directory)
        for transport, directories in groups.values():
            self.commands += 1
            try:
                self._listed.update(list_run_directories(transport, directories))
            except slurm_errors.SlurmError as error:
                logger.warning(
                    "listing run directories as %s failed: %s", transport.config.user, error
                )
                errors.append(f"run directories of {transport.config.user}: {error}")
