"""What Slurm (and, without accounting, the run directory) says about tracked objects,
read once per watcher cycle in a constant number of remote commands.

The batch script of every Gantry job records how it ended in its run directory
(``gantry-exit-<slurm id>.json``: exit code, and the signal if it was stopped), so a
cluster without accounting, or one whose ``sacct`` is down, still sees jobs finish. An
object's exit record is read from its own run directory only (``runs.rundir``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from runs.lifecycle.phases import is_final_phase
from runs.models import SlurmTracked
from runs.rundir import OwnerTransport, RunDirectories, RunDirectory
from slurm import errors as slurm_errors
from slurm.client import SlurmClient
from slurm.errors import describe_cluster_error
from slurm.parsers import SlurmJob
from slurm.transport import SshTransport

logger = logging.getLogger(__name__)

# Accounting, per cycle: answered, failed (retried later), or the cluster has none.
ACCOUNTING_OK = "ok"
ACCOUNTING_DOWN = "down"
ACCOUNTING_NONE = "none"


def evidence_as_owners(
    items: Sequence[tuple[str, OwnerTransport]],
    errors: list[str],
    listing: RunDirectories | None = None,
) -> dict[str, RunDirectory]:
    """What the run directories of ``items`` show, each listed as its own account (one
    command per account, or none where ``listing`` already has them). The directories of
    an account Gantry could not log in as are missing from the result (unknown, never
    "empty": no proof of absence may rest on them) and listed in ``errors``."""
    return (listing or RunDirectories()).look(items, errors)


@dataclass
class SlurmViews:
    """What Slurm says about a set of tracked objects, read once per watcher cycle."""

    queue: dict[str, SlurmJob]
    accounted: dict[str, SlurmJob]
    accounting: str = ACCOUNTING_OK
    accounting_error: str = ""
    # Exit records by Slurm job id (read when accounting is not usable).
    exits: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Run directories that could not be read this cycle, and why.
    errors: list[str] = field(default_factory=list)
    # Slurm job ids whose run directory the cycle could not list (unknown, not empty): no
    # absence of an exit record there may count as evidence.
    unlisted: set[str] = field(default_factory=set)

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
    owner_of: Callable[[SlurmTracked], SshTransport] | None = None,
    listing: RunDirectories | None = None,
) -> SlurmViews:
    """One ``squeue`` for every tracked Slurm job; for those that left the queue or show a
    final state there (squeue's view lacks the true exit code), one ``sacct`` — or, when the
    cluster has no accounting (``ACCOUNTING_NONE``) or sacct is down (``ACCOUNTING_DOWN``:
    backing off, or it just failed), one listing of their run directories' exit records.

    ``tracked``: (object, its run directory). ``client`` and ``transport`` are the service
    account's (it sees every user's jobs); ``owner_of`` gives the transport of an object's
    own account, which reads its run directory (``transport`` when not given). A failing
    sacct does not hide what squeue said: the views carry the error instead, and the exit
    records. ``early``: Slurm job ids
    that finish from their exit record: for those, the listing comes first and sacct is asked
    only about the ones without one (sacct lags the scheduler by seconds). ``listing``: the
    cycle's listing of run directories (``runs.rundir.RunDirectories``), shared with the
    reading of run files, so that a cycle lists each directory once. One squeue, at most
    one sacct and one listing per account per cycle, whatever the number of objects.
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
    resolve = owner_of or (lambda _obj: transport)
    listing = listing if listing is not None else RunDirectories()
    if accounting != ACCOUNTING_OK:
        _read_exit_records(views, need, resolve, listing)
        return views
    # Kinds that finish early: their exit records first (sacct lags); sacct for the rest.
    _read_exit_records(
        views, [item for item in need if item[0].slurm_job_id in early], resolve, listing
    )
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
            views, [item for item in need if item[0].slurm_job_id not in early], resolve, listing
        )
    return views


def _read_exit_records(
    views: SlurmViews,
    items: Sequence[tuple[SlurmTracked, str]],
    resolve: Callable[[SlurmTracked], SshTransport],
    listing: RunDirectories,
) -> None:
    """The exit records of these objects, each from its own run directory (read as its own
    account): a record another directory holds, under any id, is no evidence here."""
    if not items:
        return
    listed = evidence_as_owners(
        [(directory, functools.partial(resolve, obj)) for obj, directory in items],
        views.errors,
        listing,
    )
    for obj, directory in items:
        entry = listed.get(directory)
        if entry is None:
            views.unlisted.add(obj.slurm_job_id)
        record = entry.exit_record(obj.slurm_job_id) if entry is not None else None
        if record is not None:
            views.exits[obj.slurm_job_id] = record
