"""Training jobs and what they produce: metrics and checkpoints.

A job is one kind of ``runs.models.SlurmTracked`` (restore drills are the other);
``runs.lifecycle`` moves both.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from nodes.models import Cluster
from runs.models import SlurmTracked


class Job(SlurmTracked):
    class State(models.TextChoices):
        DRAFT = "draft"
        QUEUED = "queued", "queued in Gantry"
        SUBMITTING = "submitting"
        SUBMIT_UNKNOWN = "submit_unknown", "sbatch outcome unknown"
        PENDING = "pending", "pending in Slurm"
        RUNNING = "running"
        COMPLETING = "completing"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"
        TIMEOUT = "timeout"
        NODE_FAIL = "node_fail", "node failure"
        LOST = "lost", "lost (no record in Slurm)"

    # States from which nothing moves on: the reconcile loop stops looking at these.
    FINAL_STATES = frozenset(
        {
            State.COMPLETED,
            State.FAILED,
            State.CANCELLED,
            State.TIMEOUT,
            State.NODE_FAIL,
            State.LOST,
        }
    )
    # States in which Slurm knows the job: the reconcile loop asks Slurm about these.
    SLURM_ACTIVE_STATES = frozenset({State.PENDING, State.RUNNING, State.COMPLETING})

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs"
    )
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=128)
    config = models.JSONField(default=dict, help_text="The trainer configuration.")

    nodes = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(4096)]
    )
    gpus_per_node = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(64)])
    gpu_type = models.CharField(max_length=64, blank=True)
    tasks_per_node = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)])
    cpus_per_task = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)])
    memory_mb = models.PositiveIntegerField(
        null=True, blank=True, help_text="Memory per node; empty means the partition default."
    )
    time_limit_minutes = models.PositiveIntegerField(default=30, validators=[MinValueValidator(1)])
    partition = models.CharField(max_length=64)
    nodelist_requested = models.CharField(max_length=1024, blank=True)
    environment = models.JSONField(
        default=dict, blank=True, help_text="Extra environment variables for the job's ranks."
    )
    switches_requested = models.CharField(max_length=64, blank=True)
    # Nodes Slurm must not place the job on (``--exclude``): a recovery leaves out the
    # nodes the evidence of its incidents points at.
    exclude_nodes = models.CharField(max_length=1024, blank=True)
    # The job's own recovery settings over its cluster's policy (``jobs.recovery_settings``).
    recovery = models.JSONField(default=dict, blank=True)
    # The first logged step whose loss was NaN or infinite (set by ingest): recovery's
    # evidence that the run diverged.
    nonfinite_loss_step = models.PositiveIntegerField(null=True, blank=True)
    # Straggler evidence from the trainer's per-rank timings, kept by ingest
    # (``jobs.stragglers``): which ranks were slow, on which node, for how many intervals.
    rank_timing = models.JSONField(null=True, blank=True)

    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    state_reason = models.CharField(max_length=512, blank=True)
    allocated_nodes = models.CharField(max_length=1024, blank=True)

    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    resume_from = models.ForeignKey(
        "Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="resumed_jobs"
    )

    total_steps = models.PositiveIntegerField(null=True, blank=True)
    last_step = models.PositiveIntegerField(null=True, blank=True)
    metrics_offset = models.BigIntegerField(default=0)
    acceptance = models.JSONField(null=True, blank=True)
    # The trainer version Gantry shipped for this job (sha256 of its sources): a drill of
    # its checkpoints runs this version, kept on the cluster by digest.
    trainer_digest = models.CharField(max_length=64, blank=True)
    # The cluster account the job runs as (its owner's identity when it was submitted;
    # for a resume, the account of the checkpoint's job), fixed for its lifetime: its run
    # directory is <workdir>/users/<account>/runs/<id>. Empty: the cluster's service
    # account and <workdir>/runs/<id> (jobs from before per-user identities, clusters in
    # service-account mode).
    run_as = models.CharField("runs as (cluster account)", max_length=32, blank=True)
    # Mean samples/s of the newest logged steps, kept by the watcher: lists and the
    # overview read one column instead of aggregating metric points per row.
    throughput_now = models.FloatField(null=True, blank=True)
    target_reached_step = models.PositiveIntegerField(null=True, blank=True)
    target_reached_elapsed_s = models.FloatField(null=True, blank=True)
    optimal_loss = models.FloatField(null=True, blank=True)
    target_loss = models.FloatField(null=True, blank=True)
    # Set once the run directory was read after the job ended: nothing more will appear.
    files_final = models.BooleanField(default=False)
    # Sums over the job's metric points, kept by ingest (``jobs.ingest``) as it stores them,
    # so the goodput ledger reads one row instead of summing every point on each page view.
    # They hold while ``points_totals_offset`` equals ``metrics_offset`` (ingest moves both
    # in one update); points stored any other way (a bulk load, the admin) leave them stale
    # and the readers sum in the database instead (``jobs.goodput.selectors``). Database
    # defaults too: code from before these columns can still insert jobs.
    points_count = models.PositiveIntegerField(default=0, db_default=0)
    points_last_step = models.PositiveIntegerField(null=True, blank=True)
    points_step_time_s = models.FloatField(default=0.0, db_default=0.0)
    points_data_time_s = models.FloatField(default=0.0, db_default=0.0)
    points_blocking_s = models.FloatField(default=0.0, db_default=0.0)
    # The first logged step's wall time and elapsed seconds; the last logged step's wall time.
    points_first_wall = models.DateTimeField(null=True, blank=True)
    points_first_elapsed_s = models.FloatField(null=True, blank=True)
    points_last_wall = models.DateTimeField(null=True, blank=True)
    points_totals_offset = models.BigIntegerField(null=True, blank=True)
    # The offset at which the stored points last changed other than by steps appended after
    # the newest one (a chunk that rewrote stored steps, a bulk load): a downsampled series
    # built since then can be extended with the new steps alone (``jobs.metric_series``).
    points_rebuilt_offset = models.BigIntegerField(null=True, blank=True)
    # Metric retention's watermark (``jobs.metric_retention``): every roll-up bucket of the
    # job ending at or below this step is rolled up, but for the steps it keeps raw. Moved
    # in the transaction that deletes the rolled-up points, conditionally on its old value.
    metrics_rolled_up_to = models.PositiveIntegerField(null=True, blank=True)

    ended_at = models.DateTimeField(null=True, blank=True)

    # While the job is pending: what ``squeue --start`` said when the watcher last asked
    # (``jobs.queue_estimates``): Slurm's expected start (None: it has no estimate) and the
    # job's place among the pending jobs of its partition, in Slurm's priority order.
    expected_start_at = models.DateTimeField(null=True, blank=True)
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    queue_length = models.PositiveIntegerField(null=True, blank=True)
    pending_checked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "slurm_job_id"],
                condition=~Q(slurm_job_id=""),
                name="job_unique_slurm_id_per_cluster",
            ),
        ]
        indexes = [
            models.Index(fields=["cluster", "state"], name="job_cluster_state"),
            models.Index(fields=["owner", "-created_at"], name="job_owner_created"),
            models.Index(fields=["state", "-created_at"], name="job_state_created"),
            models.Index(fields=["-created_at", "id"], name="job_created_id"),
            # The job list filtered by cluster, newest first (the API's default order).
            models.Index(fields=["cluster", "-created_at"], name="job_perf_cluster_created"),
            # Recent failures (the overview): a person's ended jobs by end time.
            models.Index(fields=["owner", "state", "-ended_at"], name="job_perf_owner_state_ended"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({str(self.id)[:8]})"

    @property
    def is_final(self) -> bool:
        return self.state in self.FINAL_STATES

    @property
    def points_totals_valid(self) -> bool:
        """Whether the ``points_*`` sums describe every stored metric point of the job."""
        return self.points_totals_offset is not None and (
            self.points_totals_offset == self.metrics_offset
        )

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def allocated_node_names(self) -> list[str]:
        from slurm.hostlist import expand

        try:
            return expand(self.allocated_nodes) if self.allocated_nodes else []
        except ValueError:
            return []

    @property
    def newest_proven_checkpoint(self) -> Checkpoint | None:
        return self.checkpoints.filter(last_proven_at__isnull=False).order_by("-step").first()

    @property
    def progress(self) -> float | None:
        if not self.total_steps or self.last_step is None:
            return None
        return min(1.0, self.last_step / self.total_steps)


class JobEvent(models.Model):
    """One entry of a job's timeline."""

    class Kind(models.TextChoices):
        # Written by the generic lifecycle (``runs.events.RunEventKind``: a test checks
        # that every value there is here).
        STATE = "state", "state change"
        SUBMIT_ATTEMPT = "submit_attempt", "submit attempt"
        CANCEL = "cancel", "cancel"
        DUPLICATE = "duplicate", "duplicate cancelled"
        REASON = "reason", "Slurm's reason"
        # Written by jobs: hold and release, where its settings came from, checkpoints.
        HOLD = "hold", "held"
        RELEASE = "release", "released"
        TEMPLATE = "template", "from a template"
        RUN_AGAIN = "run_again", "run again"
        CHECKPOINT = "checkpoint", "checkpoint registered"
        # The trainer's own events that go on the timeline (``trainer.schema.Event``).
        RESUMED = "resumed", "resumed"
        TARGET_REACHED = "target_reached", "target reached"
        CHECKPOINT_FAILED = "checkpoint_failed", "checkpoint failed"
        DONE = "done", "training done"
        # Written by recovery (``recovery``): an incident opened, and what recovery did.
        INCIDENT = "incident", "incident"
        RECOVERY = "recovery", "recovery"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(auto_now_add=True)
    kind = models.CharField(max_length=32, choices=Kind.choices)
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, blank=True)
    message = models.TextField(blank=True)

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["job", "at"], name="jobevent_job_at")]

    def __str__(self) -> str:
        return f"{self.job_id} {self.kind} {self.from_state}→{self.to_state}"


class JobLogTail(models.Model):
    """The end of a job's Slurm output as a worker last read it (``jobs.services``): the
    page shows it with its age, so no web request reads a researcher's files. Bounded:
    at most ``jobs.services.LOG_TAIL_BYTES`` of text; ``size`` is the file's at the read."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, primary_key=True, related_name="+")
    text = models.TextField(blank=True)
    size = models.BigIntegerField(null=True, blank=True)
    truncated = models.BooleanField(default=False)
    path = models.CharField(max_length=1024, blank=True)
    read_at = models.DateTimeField(null=True, blank=True)
    # When a read was last asked for (a second ask within moments is the same one).
    requested_at = models.DateTimeField(null=True, blank=True)
    # Why the last read failed ("" when it did not): shown instead of stale text's age.
    error = models.CharField(max_length=1024, blank=True)

    def __str__(self) -> str:
        return f"log tail of {self.job_id} read {self.read_at}"


class MetricPoint(models.Model):
    """One logged training step, as the trainer wrote it to metrics.jsonl."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="metric_points")
    step = models.PositiveIntegerField()
    wall_time = models.DateTimeField()
    elapsed_s = models.FloatField(null=True, blank=True)
    loss = models.FloatField(null=True, blank=True)
    samples_per_s = models.FloatField(null=True, blank=True)
    tokens_per_s = models.FloatField(null=True, blank=True)
    step_time_s = models.FloatField(null=True, blank=True)
    data_time_s = models.FloatField(null=True, blank=True)
    checkpoint_blocking_s = models.FloatField(null=True, blank=True)
    world_size = models.PositiveSmallIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["job", "step"]
        # The unique index doubles as the time-series index: every read is "job X by step".
        constraints = [
            models.UniqueConstraint(fields=["job", "step"], name="metricpoint_unique_step")
        ]
        indexes = [
            models.Index(fields=["job", "wall_time"], name="metricpoint_job_time"),
            # The steps that saved a checkpoint (a few in thousands), in blocking order: the
            # median checkpoint cost reads only these.
            models.Index(
                fields=["job", "checkpoint_blocking_s"],
                name="metricpoint_perf_blocking",
                condition=Q(checkpoint_blocking_s__gt=0),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job_id}@{self.step}"


class MetricRollup(models.Model):
    """The logged steps of one aligned bucket (``first_step // GANTRY_METRICS_ROLLUP_BUCKET``)
    that metric retention (``jobs.metric_retention``) folded together and deleted. Sums and
    value counts per series, so that goodput's sums stay exact and chart buckets that hold
    several roll-ups average them exactly; the loss's mean, min and max are over its finite
    values, and ``loss_nonfinite`` counts the NaN and infinite ones."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="metric_rollups")
    first_step = models.PositiveIntegerField()
    last_step = models.PositiveIntegerField()
    count = models.PositiveIntegerField()
    first_wall_time = models.DateTimeField()
    last_wall_time = models.DateTimeField()
    first_elapsed_s = models.FloatField(null=True, blank=True)
    loss_min = models.FloatField(null=True, blank=True)
    loss_max = models.FloatField(null=True, blank=True)
    loss_mean = models.FloatField(null=True, blank=True)
    loss_nonfinite = models.PositiveIntegerField(default=0)
    step_time_mean = models.FloatField(null=True, blank=True)
    samples_per_s_mean = models.FloatField(null=True, blank=True)
    # Per series of the chart (``jobs.selectors.METRIC_SERIES``): the sum and the number of
    # values (the loss's finite ones only); a mean skips missing values, as SQL's AVG does.
    loss_sum = models.FloatField(default=0.0)
    loss_count = models.PositiveIntegerField(default=0)
    samples_per_s_sum = models.FloatField(default=0.0)
    samples_per_s_count = models.PositiveIntegerField(default=0)
    tokens_per_s_sum = models.FloatField(default=0.0)
    tokens_per_s_count = models.PositiveIntegerField(default=0)
    step_time_sum = models.FloatField(default=0.0)
    step_time_count = models.PositiveIntegerField(default=0)
    data_time_sum = models.FloatField(default=0.0)
    data_time_count = models.PositiveIntegerField(default=0)
    checkpoint_blocking_sum = models.FloatField(default=0.0)
    checkpoint_blocking_count = models.PositiveIntegerField(default=0)
    elapsed_sum = models.FloatField(default=0.0)
    elapsed_count = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["job", "first_step"]
        # One roll-up per bucket: a second worker rolling the same bucket up fails here.
        constraints = [
            models.UniqueConstraint(fields=["job", "first_step"], name="metricrollup_unique_step")
        ]

    def __str__(self) -> str:
        return f"{self.job_id}@{self.first_step}-{self.last_step}"


class Checkpoint(models.Model):
    class Integrity(models.TextChoices):
        UNVERIFIED = "unverified"
        OK = "ok", "verified"
        FAILED = "failed", "failed integrity check"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.PositiveIntegerField()
    path = models.CharField(max_length=1024)
    size_bytes = models.BigIntegerField(default=0)
    file_count = models.PositiveIntegerField(default=0)
    state_keys = models.JSONField(default=list, blank=True)
    world_size = models.PositiveSmallIntegerField(null=True, blank=True)
    manifest = models.JSONField(default=dict, blank=True)
    # ``trainer.schema.manifest_digest`` of the manifest Gantry read when it registered the
    # checkpoint: drills and integrity checks hold the directory to it (and to ``step``), so
    # another checkpoint put in its place fails as ``not_as_registered``. Empty: unknown.
    manifest_digest = models.CharField(max_length=64, blank=True)
    integrity = models.CharField(
        max_length=16, choices=Integrity.choices, default=Integrity.UNVERIFIED
    )
    integrity_detail = models.TextField(blank=True)
    integrity_checked_at = models.DateTimeField(null=True, blank=True)
    integrity_report = models.JSONField(null=True, blank=True)
    saved_at = models.DateTimeField(null=True, blank=True)
    registered_at = models.DateTimeField(auto_now_add=True)
    # A verifier-attested drill with replay passed (the full proof: ``checkpoint_state``).
    last_proven_at = models.DateTimeField(null=True, blank=True)
    # A verifier-attested drill at the level "state-exact, no replay" passed: every file
    # against the registered manifest and the loaded state bit for bit against the saved
    # fingerprint, with fewer steps replayed than a full drill (the run logged fewer after
    # it). Never counted as ``last_proven_at``; recovery's policy says when it is enough.
    state_proven_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(
        null=True, blank=True, help_text="When the trainer's retention removed it from the cluster."
    )

    class Meta:
        ordering = ["job", "-step"]
        constraints = [
            models.UniqueConstraint(fields=["job", "step"], name="checkpoint_unique_step")
        ]

    def __str__(self) -> str:
        return f"{self.job.name} step {self.step}"

    @property
    def proof_level(self) -> str:
        """What stands of its proof: "replay" (a full pass), "state_exact" (state-exact, no
        replay: ``state_proven_at``) or "" (none, or voided by a failure or retention)."""
        if self.integrity == self.Integrity.FAILED or self.deleted_at is not None:
            return ""
        if self.last_proven_at is not None:
            return "replay"
        return "state_exact" if self.state_proven_at is not None else ""


class StateFingerprint(models.Model):
    """The training state at a checkpoint's step, as the trainer fingerprinted it at save
    time (``trainer/SCHEMA.md``): held by Gantry, so that a drill compares what it loads
    with Gantry's copy, not with files on the cluster that could be damaged too.

    From the ``checkpoint`` event in metrics.jsonl (the last one for a step wins, like
    losses: a resumed run that saves the step again replaces it), else from the manifest.
    """

    class Source(models.TextChoices):
        EVENT = "event", "checkpoint event"
        MANIFEST = "manifest"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="fingerprints")
    step = models.PositiveIntegerField()
    data = models.JSONField()
    tensors = models.PositiveIntegerField(default=0)
    source = models.CharField(max_length=16, choices=Source.choices)
    recorded_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["job", "step"]
        constraints = [
            models.UniqueConstraint(fields=["job", "step"], name="fingerprint_unique_step")
        ]

    def __str__(self) -> str:
        return f"fingerprint of {self.job_id}@{self.step}"


class JobTemplate(models.Model):
    """A job's settings kept under a name, to submit again: private to its owner or
    shared with everyone. ``settings`` holds the body of a submit request (as
    ``POST /api/v1/jobs/submit/`` takes it) without the cluster, which is ``cluster``."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="job_templates"
    )
    name = models.CharField(max_length=128)
    description = models.CharField(max_length=512, blank=True)
    shared = models.BooleanField(default=False, help_text="Everyone may see and use it.")
    # None: the cluster was removed; the template is kept and says so.
    cluster = models.ForeignKey(
        Cluster, null=True, blank=True, on_delete=models.SET_NULL, related_name="job_templates"
    )
    settings = models.JSONField(default=dict)
    source_job = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="templates"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="jobtemplate_unique_owner_name")
        ]
        indexes = [models.Index(fields=["shared", "name"], name="jobtemplate_shared_name")]

    def __str__(self) -> str:
        return self.name
