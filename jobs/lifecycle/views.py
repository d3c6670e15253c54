"""What Slurm (and, without accounting, the run directory) says about tracked objects,
read once per watcher cycle in a constant number of remote commands.

The batch script of every Gantry job records how it ended in its run directory
(``gantry-exit-<slurm id>.json``: exit code, and the signal if it was stopped), so a
cluster without accounting, or one whose ``sacct`` is down, still sees jobs finish.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from jobs.lifecycle.phases import is_final_phase
from jobs.models import SlurmTracked
from nodes.slurm import errors as slurm_errors
from nodes.slurm.client import SlurmClient
from nodes.slurm.errors import describe_cluster_error
from nodes.slurm.parsers import SlurmJob
from nodes.slurm.transport import SshTransport

# Accounting, per cycle: answered, failed (retried later), or the cluster has none.
ACCOUNTING_OK = "ok"
ACCOUNTING_DOWN = "down"
ACCOUNTING_NONE = "none"

_LIST_ENTRY = (
    'd={dir}; printf "D %s\\n" "$d"; '
    'for f in "$d"/gantry-exit-*.json; do if [ -f "$f" ]; then '
    'printf "X %s\\n" "$(head -c 1024 "$f" | tr -d "\\n")"; fi; done; '
    'for f in "$d"/slurm-*.out; do if [ -f "$f" ]; then printf "O %s\\n" "${{f##*/}}"; fi; done; '
)


@dataclass
class DirectoryEvidence:
    """What a run directory shows of the Slurm jobs that ran in it."""

    exits: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Slurm job ids that wrote output here (``slurm-<id>.out``): they ran.
    outputs: set[str] = field(default_factory=set)


def directory_evidence(
    transport: SshTransport, directories: Sequence[str]
) -> dict[str, DirectoryEvidence]:
    """One remote command for all directories: exit records and Slurm output files."""
    found: dict[str, DirectoryEvidence] = {
        directory: DirectoryEvidence() for directory in directories
    }
    if not directories:
        return found
    script = "".join(_LIST_ENTRY.format(dir=shlex.quote(d)) for d in dict.fromkeys(directories))
    current: DirectoryEvidence | None = None
    for line in transport.exec_shell(script + "true").stdout.splitlines():
        kind, _, value = line.partition(" ")
        if kind == "D":
            current = found.setdefault(value, DirectoryEvidence())
        elif current is None:
            continue
        elif kind == "X":
            try:
                record = json.loads(value)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("slurm_job_id"):
                current.exits[str(record["slurm_job_id"])] = record
        elif kind == "O" and value.startswith("slurm-") and value.endswith(".out"):
            current.outputs.add(value.removeprefix("slurm-").removesuffix(".out"))
    return found


@dataclass
class SlurmViews:
    """What Slurm says about a set of tracked objects, read once per watcher cycle."""

    queue: dict[str, SlurmJob]
    accounted: dict[str, SlurmJob]
    accounting: str = ACCOUNTING_OK
    accounting_error: str = ""
    # Exit records by Slurm job id (read when accounting is not usable).
    exits: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def accounting_ok(self) -> bool:
        return self.accounting == ACCOUNTING_OK


def slurm_views(
    client: SlurmClient,
    transport: SshTransport,
    tracked: Sequence[tuple[SlurmTracked, str]],
    *,
    accounting: str = ACCOUNTING_OK,
    early: frozenset[str] = frozenset(),
) -> SlurmViews:
    """One ``squeue`` for every tracked Slurm job; for those that left the queue or show a
    final state there (squeue's view lacks the true exit code), one ``sacct`` — or, when the
    cluster has no accounting (``ACCOUNTING_NONE``) or sacct is down (``ACCOUNTING_DOWN``:
    backing off, or it just failed), one listing of their run directories' exit records.

    ``tracked``: (object, its run directory). A failing sacct does not hide what squeue
    said: the views carry the error instead, and the exit records. ``early``: Slurm job ids
    that finish from their exit record: for those, the listing comes first and sacct is asked
    only about the ones without one (sacct lags the scheduler by seconds). At most two
    listings and one sacct per cycle, whatever the number of objects.
    """
    if not tracked:
        return SlurmViews(queue={}, accounted={})
    queue = client.jobs_in_queue([obj.slurm_job_id for obj, _ in tracked])
    need = [
        (obj, directory)
        for obj, directory in tracked
        if obj.slurm_job_id not in queue or is_final_phase(queue[obj.slurm_job_id].state)
    ]
    if not need:
        return SlurmViews(queue=queue, accounted={})
    views = SlurmViews(queue=queue, accounted={}, accounting=accounting)
    if accounting != ACCOUNTING_OK:
        _read_exit_records(views, transport, need)
        return views
    # Kinds that finish early: their exit records first (sacct lags); sacct for the rest.
    _read_exit_records(views, transport, [item for item in need if item[0].slurm_job_id in early])
    need = [item for item in need if item[0].slurm_job_id not in views.exits]
    if not need:
        return views
    start = min(obj.submitted_at or obj.created_at for obj, _ in need) - timedelta(hours=1)
    try:
        views.accounted = client.jobs_accounting([obj.slurm_job_id for obj, _ in need], start=start)
    except slurm_errors.SlurmError as error:
        if isinstance(error, slurm_errors.SshError):
            raise
        views.accounting = ACCOUNTING_DOWN
        views.accounting_error = describe_cluster_error(error)
        _read_exit_records(
            views, transport, [item for item in need if item[0].slurm_job_id not in early]
        )
    return views


def _read_exit_records(
    views: SlurmViews, transport: SshTransport, items: Sequence[tuple[SlurmTracked, str]]
) -> None:
    if items:
        evidence = directory_evidence(transport, [directory for _, directory in items])
        for item in evidence.values():
            views.exits.update(item.exits)
