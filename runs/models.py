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


class SlurmRequest(models.Model):
    """A person's request to act on a tracked object's Slurm job (cancel, hold, release).

    Recorded in the web request (no command runs there), carried out by a worker as the
    object's own account (``runs.lifecycle.requests``), and sent again by the watcher while
    it stays open with its task lost (a Redis restart loses nothing asked). One table for
    every kind: ``kind`` is the tracked model's label, ``object_id`` its primary key.
    """

    class Action(models.TextChoices):
        CANCEL = "cancel", "cancel"
        HOLD = "hold", "hold"
        RELEASE = "release", "release"

    class Status(models.TextChoices):
        OPEN = "open", "open"
        DONE = "done", "done"
        FAILED = "failed", "failed"
        # A hold asked again as a release (or the reverse) before it was carried out.
        SUPERSEDED = "superseded", "superseded"

    kind = models.CharField(max_length=64)
    object_id = models.CharField(max_length=64)
    cluster = models.ForeignKey("nodes.Cluster", on_delete=models.CASCADE, related_name="+")
    slurm_job_id = models.CharField(max_length=32)
    action = models.CharField(max_length=16, choices=Action.choices)
    requested_by = models.CharField(max_length=150)
    requested_at = models.DateTimeField(auto_now_add=True)
    # When its task was last enqueued: the watcher sends it again once this is old.
    enqueued_at = models.DateTimeField()
    attempts = models.PositiveSmallIntegerField(default=0)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    # What happened, in words; for a failure, why (what the object's page shows).
    outcome = models.CharField(max_length=1024, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # Asking twice while the first is open is the same request.
            models.UniqueConstraint(
                fields=["kind", "object_id", "action"],
                condition=models.Q(status="open"),
                name="slurmrequest_one_open_per_action",
            )
        ]
        indexes = [
            models.Index(fields=["cluster", "status", "enqueued_at"], name="slurmrequest_open"),
            models.Index(fields=["kind", "object_id"], name="slurmrequest_object"),
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.kind}:{self.object_id} ({self.status})"
