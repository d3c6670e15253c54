"""The generic part of anything Gantry runs as one Slurm job: the fields the lifecycle
(``runs.lifecycle``) reads and moves. Abstract: each kind (jobs, restore drills) is a table
of its own app.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import models


class SlurmTracked(models.Model):
    """What Gantry tracks of an object it runs as one Slurm job (jobs, restore drills).

    Each concrete model adds its own ``state`` field; ``runs.lifecycle`` reads and moves
    these fields with conditional updates, the same way for every kind.
    """

    slurm_job_id = models.CharField(max_length=32, blank=True, db_index=True)
    exit_code = models.IntegerField(null=True, blank=True)
    submit_attempts = models.PositiveSmallIntegerField(default=0)
    # While a submit task holds the object, no other may start submitting it.
    submit_lease_until = models.DateTimeField(null=True, blank=True)
    # When the last sbatch for it was sent. Set before the command goes out: if the worker
    # dies or the answer is lost, the outcome is unknown and no second sbatch may follow
    # until a Slurm job with the tag is found (adopted) or proven absent.
    sbatch_sent_at = models.DateTimeField(null=True, blank=True)
    last_seen_in_slurm_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    submitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    if TYPE_CHECKING:
        # Each concrete model declares these itself (its own id type, state choices and
        # relation names); the lifecycle relies on them.
        id: Any
        state: str
        cluster: Any
        cluster_id: int
        FINAL_STATES: frozenset[str]
        SLURM_ACTIVE_STATES: frozenset[str]

    class Meta:
        abstract = True
