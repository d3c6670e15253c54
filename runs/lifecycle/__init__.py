"""The one Slurm lifecycle, for everything Gantry runs as one Slurm job (jobs and drills).

Every kind goes the same way: ``queued`` in Gantry → claimed for submission
(``submitting``, with a lease) → looked up by its tag before any ``sbatch`` (a redelivered
task adopts the Slurm job it finds instead of submitting again) → files written and
``sbatch`` → ``pending`` / ``running`` as Slurm says → a final state from accounting (or,
without accounting, from the batch script's exit record). An sbatch whose answer was lost
leaves the object ``submit_unknown`` until its tag is found or proven absent; a submit task
that went missing is requeued by the watcher; an object Slurm forgot is declared lost.
Every state change is a conditional update on the state the caller read, so two workers
racing apply each change once.

What differs between kinds (the script and files, what a refusal, a lost Slurm job or a
finished one means, the timeline) is a handful of hooks on a subclass:
``jobs.lifecycle.JobLifecycle`` and ``drills.lifecycle.DrillLifecycle``.

Modules: ``kind`` (hooks and the transition primitive), ``submit`` (exactly-once
submission, cancel, requeue), ``requests`` (a person's cancel, hold and release, recorded
in the web request and carried out by a worker as the object's account), ``watch`` (what
the watcher applies), ``views`` (what Slurm and the run directories say, read in a
constant number of commands), ``phases``; the run directories themselves are listed by
``runs.rundir``.
"""

from __future__ import annotations

from runs.lifecycle.kind import Tracked, WontSubmit
from runs.lifecycle.phases import SLURM_STATE_MAP, Phase, is_final_phase, slurm_phase
from runs.lifecycle.submit import slurm_error_as_application_error
from runs.lifecycle.views import (
    ACCOUNTING_DOWN,
    ACCOUNTING_NONE,
    ACCOUNTING_OK,
    SlurmViews,
    evidence_as_owners,
    slurm_views,
)
from runs.lifecycle.watch import Watching


class SlurmLifecycle(Watching[Tracked]):
    """The lifecycle, written once: submission (``submit``) and watching (``watch``) over
    the kind's hooks (``kind``). Subclasses set the class attributes and the hooks."""


__all__ = [
    "ACCOUNTING_DOWN",
    "ACCOUNTING_NONE",
    "ACCOUNTING_OK",
    "SLURM_STATE_MAP",
    "Phase",
    "SlurmLifecycle",
    "SlurmViews",
    "WontSubmit",
    "evidence_as_owners",
    "is_final_phase",
    "slurm_error_as_application_error",
    "slurm_phase",
    "slurm_views",
]
