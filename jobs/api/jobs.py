"""REST API for jobs. One view per operation; cluster actions answer 202 with the id."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import generics, serializers, status
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core import cache
from core.access import request_user
from core.api import CursorPagination
from core.conditional import etag_for, not_modified, revalidate
from core.errors import FieldError
from core.permissions import IsResearcherOrOperator
from jobs.compose.settings import job_request_from_values
from jobs.goodput.work_at_risk import job_work_at_risk
from jobs.models import Checkpoint, Job, JobEvent
from jobs.pending_queue import job_pending_summary
from jobs.placement import job_request_with_advice, placement_advice_for_request
from jobs.selectors import (
    job_get_for_user,
    job_goodput,
    job_metrics,
)
from jobs.services import job_cancel, job_log_tail, job_preview, job_resume, job_submit
from jobs.validation import JobRequest
from nodes.placement_service import placement_as_dict
from trainer.config import DEFAULTS, PRESETS


class CheckpointSerializer(serializers.ModelSerializer):
    class Meta:
        model = Checkpoint
        fields = [
            "id",
            "step",
            "path",
            "size_bytes",
            "file_count",
            "state_keys",
            "world_size",
            "integrity",
            "integrity_detail",
            "saved_at",
            "registered_at",
            "last_proven_at",
            "state_proven_at",
            "proof_level",
        ]


class JobSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", read_only=True)
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    progress = serializers.FloatField(read_only=True, allow_null=True)
    world_size = serializers.IntegerField(read_only=True)
    parent_id = serializers.UUIDField(read_only=True, allow_null=True)
    resume_from_step = serializers.IntegerField(
        source="resume_from.step", read_only=True, default=None
    )

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "owner",
            # The cluster account it runs as ("": the cluster's service account).
            "run_as",
            "cluster",
            "state",
            "state_reason",
            "slurm_job_id",
            "partition",
            "nodes",
            "tasks_per_node",
            "gpus_per_node",
            "gpu_type",
            "cpus_per_task",
            "memory_mb",
            "time_limit_minutes",
            "nodelist_requested",
            "switches_requested",
            "exclude_nodes",
            "recovery",
            "environment",
            "allocated_nodes",
            "exit_code",
            "world_size",
            "total_steps",
            "last_step",
            "progress",
            "optimal_loss",
            "target_loss",
            "target_reached_step",
            "target_reached_elapsed_s",
            "parent_id",
            "resume_from_step",
            "created_at",
            "submitted_at",
            "started_at",
            "ended_at",
            "config",
        ]


class GoodputBucketsSerializer(serializers.Serializer):
    queued = serializers.FloatField()
    startup = serializers.FloatField()
    restore = serializers.FloatField()
    productive = serializers.FloatField()
    data_wait = serializers.FloatField()
    checkpoint_blocking = serializers.FloatField()
    lost_progress = serializers.FloatField()
    idle = serializers.FloatField()
    recovery = serializers.FloatField(
        help_text="an incident's quiet after the last step, and the gap to its resumed job"
    )
    other = serializers.FloatField()


class GoodputLedgerSerializer(serializers.Serializer):
    ratio = serializers.FloatField(allow_null=True, help_text="productive / wall")
    wall_s = serializers.FloatField(help_text="the buckets sum to it exactly")
    buckets = GoodputBucketsSerializer(help_text="seconds")


class GoodputAdviceInputsSerializer(serializers.Serializer):
    checkpoint_cost_s = serializers.FloatField(allow_null=True)
    mtti_s = serializers.FloatField()
    restore_s = serializers.FloatField(allow_null=True)
    prior_used = serializers.BooleanField()
    restore_source = serializers.ChoiceField(choices=["drills", "resume", "none"])
    interruptions = serializers.IntegerField()
    gpu_hours = serializers.FloatField()


class GoodputAdviceSerializer(serializers.Serializer):
    current_interval_s = serializers.FloatField(allow_null=True)
    optimal_interval_s = serializers.FloatField(allow_null=True)
    expected_ratio_now = serializers.FloatField(allow_null=True)
    expected_ratio_optimal = serializers.FloatField(allow_null=True)
    inputs = GoodputAdviceInputsSerializer()


class GoodputSerializer(GoodputLedgerSerializer):
    """The lineage's ledger (``jobs.goodput.ledger`` states the formulas), this job's share of it,
    and Young/Daly checkpoint-interval advice."""

    lineage = serializers.ListField(child=serializers.UUIDField())
    started = serializers.BooleanField()
    job = GoodputLedgerSerializer()
    advice = GoodputAdviceSerializer()


class WorkSinceSerializer(serializers.Serializer):
    checkpoint_step = serializers.IntegerField(
        allow_null=True, help_text="null: no such checkpoint; counted from the job's start"
    )
    since = serializers.DateTimeField()
    age_s = serializers.FloatField()
    gpu_hours = serializers.FloatField(help_text="allocated GPUs (ranks without GPUs) × age")


class ResumedFromSerializer(serializers.Serializer):
    checkpoint_step = serializers.IntegerField()
    proven = serializers.BooleanField()


class WorkAtRiskSerializer(serializers.Serializer):
    """What the running job would lose if it died now (``jobs.goodput.work_at_risk``)."""

    gpus = serializers.IntegerField()
    since_proven = WorkSinceSerializer(help_text="since the newest checkpoint a drill proved")
    since_written = WorkSinceSerializer(help_text="since the newest checkpoint written")
    max_proven_age_s = serializers.FloatField(
        allow_null=True, help_text="the cluster's limit on the proven checkpoint's age"
    )
    breached = serializers.BooleanField()
    resumed_from = ResumedFromSerializer(allow_null=True)


class QueuePositionSerializer(serializers.Serializer):
    position = serializers.IntegerField(help_text="1 = the next to be considered")
    of = serializers.IntegerField(help_text="pending jobs in the partition")
    partition = serializers.CharField()
    basis = serializers.ChoiceField(
        choices=["slurm", "gantry"],
        help_text="slurm: among every pending job of the partition, by Slurm's priority "
        "(squeue --start); gantry: among Gantry's own pending jobs, by submit time, until "
        "the watcher has asked Slurm",
    )


class PendingReasonSerializer(serializers.Serializer):
    """Why a pending job waits, and when Slurm expects it to start."""

    code = serializers.CharField(help_text="Slurm's reason code, e.g. Resources")
    explanation = serializers.CharField(help_text="the code in plain words")
    held = serializers.BooleanField(help_text="held (scontrol hold): POST …/release/ frees it")
    expected_start = serializers.DateTimeField(
        allow_null=True, help_text="Slurm's estimate (squeue --start); null: it has none"
    )
    checked_at = serializers.DateTimeField(
        allow_null=True, help_text="when Gantry last asked Slurm; null: not yet"
    )
    queue_position = QueuePositionSerializer(allow_null=True)


class JobDetailSerializer(JobSerializer):
    acceptance = serializers.JSONField(read_only=True)
    throughput_samples_per_s = serializers.FloatField(
        source="throughput_now", read_only=True, allow_null=True
    )
    goodput = serializers.SerializerMethodField()
    work_at_risk = serializers.SerializerMethodField()
    pending_reason = serializers.SerializerMethodField()

    class Meta(JobSerializer.Meta):
        fields = [
            *JobSerializer.Meta.fields,
            "acceptance",
            "throughput_samples_per_s",
            "goodput",
            "work_at_risk",
            "pending_reason",
        ]

    @extend_schema_field(WorkAtRiskSerializer(allow_null=True))
    def get_work_at_risk(self, job: Job) -> dict[str, Any] | None:
        """Only while the job runs; null otherwise."""
        risk = job_work_at_risk(job=job)
        return None if risk is None else WorkAtRiskSerializer(risk.as_dict()).data  # type: ignore[return-value]

    @extend_schema_field(PendingReasonSerializer(allow_null=True))
    def get_pending_reason(self, job: Job) -> dict[str, Any] | None:
        """Only for a job pending in Slurm; null otherwise."""
        summary = job_pending_summary(job=job)
        return None if summary is None else PendingReasonSerializer(summary).data  # type: ignore[return-value]

    @extend_schema_field(GoodputSerializer)
    def get_goodput(self, job: Job) -> dict[str, Any]:
        # The view passes the ledger it read; computed here only for other callers.
        ledger = self.context.get("goodput")
        if ledger is None:
            ledger = job_goodput(job=job)
        return GoodputSerializer(ledger).data  # type: ignore[return-value]


class JobInputSerializer(serializers.Serializer):
    cluster = serializers.CharField(
        required=False, help_text="cluster name; default cluster if omitted"
    )
    name = serializers.CharField(max_length=128)
    partition = serializers.CharField(max_length=64, required=False, allow_blank=True, default="")
    nodes = serializers.IntegerField(min_value=1, max_value=4096, default=1)
    gpus_per_node = serializers.IntegerField(min_value=0, max_value=64, default=0)
    gpu_type = serializers.CharField(max_length=64, required=False, allow_blank=True, default="")
    tasks_per_node = serializers.IntegerField(min_value=1, max_value=256, required=False)
    cpus_per_task = serializers.IntegerField(min_value=1, max_value=1024, default=1)
    memory_mb = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)
    time_limit_minutes = serializers.IntegerField(min_value=1, max_value=525600, default=30)
    nodelist = serializers.CharField(max_length=1024, required=False, allow_blank=True, default="")
    switches = serializers.CharField(max_length=64, required=False, allow_blank=True, default="")
    preset = serializers.ChoiceField(choices=sorted(PRESETS), required=False)
    config = serializers.DictField(required=False, default=dict, help_text="trainer config keys")
    environment = serializers.DictField(
        child=serializers.CharField(allow_blank=True, max_length=1024),
        required=False,
        default=dict,
        help_text='extra environment variables for the ranks, e.g. {"NCCL_DEBUG": "INFO"}',
    )
    use_placement_advice = serializers.BooleanField(
        default=False,
        help_text="fill nodelist and switches with Gantry's placement advice (fewest switches)",
    )
    exclude = serializers.CharField(
        max_length=1024,
        required=False,
        allow_blank=True,
        default="",
        help_text="nodes Slurm must not use (a node list expression, --exclude)",
    )
    recovery = serializers.DictField(
        required=False,
        default=dict,
        help_text="this job's recovery settings over its cluster's policy: enabled, "
        "max_attempts, gpu_hours_budget, on_hang (recover|hold|notify), exclude_suspects",
    )


def job_request_from(data: dict[str, Any]) -> JobRequest:
    """The validated submit body as a JobRequest (the same conversion templates use)."""
    return job_request_from_values(data)


class AcceptedSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    state = serializers.CharField()
    poll = serializers.CharField()


def accepted(job: Job) -> Response:
    body = {"id": job.id, "state": job.state, "poll": reverse("api:job-detail", args=[job.id])}
    return Response(AcceptedSerializer(body).data, status=status.HTTP_202_ACCEPTED)


class RequestAcceptedSerializer(AcceptedSerializer):
    request = serializers.CharField(
        help_text="what became of the ask: cancel requested (a worker sends it), cancel "
        "requested already, cancelled (before Slurm had it), already <state>; hold / "
        "release requested"
    )


def accepted_request(job: Job, outcome: str) -> Response:
    """202 for a cancel, hold or release: recorded, carried out by a worker."""
    body = {
        "id": job.id,
        "state": job.state,
        "poll": reverse("api:job-detail", args=[job.id]),
        "request": outcome,
    }
    return Response(RequestAcceptedSerializer(body).data, status=status.HTTP_202_ACCEPTED)


class JobSubmitApi(APIView):
    """Submit a training job (202: poll ``poll`` for its state).

    Impossible requests (unknown partition, more GPUs per node than any node has, time over
    the partition's limit, an invalid trainer config) are refused with the field and why.
    """

    permission_classes = [IsResearcherOrOperator]

    @extend_schema(request=JobInputSerializer, responses={202: AcceptedSerializer})
    def post(self, request: Request) -> Response:
        data = JobInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        job_request = job_request_from(values)
        if values.get("use_placement_advice"):
            job_request, _advice = job_request_with_advice(job_request)
        job = job_submit(user=request_user(request), request=job_request)
        return accepted(job)


class JobPreviewApi(APIView):
    """Validate a job and show the exact sbatch script it would run; saves nothing."""

    permission_classes = [IsResearcherOrOperator]

    class OutputSerializer(serializers.Serializer):
        script = serializers.CharField()
        config = serializers.DictField()
        world_size = serializers.IntegerField()
        placement = serializers.DictField(
            help_text="placement advice: nodes, switches spanned, explanation, Slurm options"
        )

    @extend_schema(request=JobInputSerializer, responses=OutputSerializer)
    def post(self, request: Request) -> Response:
        data = JobInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        job_request = job_request_from(values)
        applied = bool(values.get("use_placement_advice"))
        if applied:
            job_request, advice = job_request_with_advice(job_request)
        else:
            advice = placement_advice_for_request(job_request)
        job, script = job_preview(user=request_user(request), request=job_request)
        return Response(
            self.OutputSerializer(
                {
                    "script": script,
                    "config": job.config,
                    "world_size": job.world_size,
                    "placement": {**placement_as_dict(advice), "applied": applied},
                }
            ).data
        )


class JobDetailApi(APIView):
    permission_classes = [IsResearcherOrOperator]

    @extend_schema(responses=JobDetailSerializer)
    def get(self, request: Request, job_id: str) -> Response:
        job = job_get_for_user(user=request_user(request), job_id=job_id)
        return Response(JobDetailSerializer(job, context={"goodput": job_goodput(job=job)}).data)


class JobCancelApi(APIView):
    """Cancel a job (owner or operator); idempotent. 202 with ``request``: "cancel
    requested" (a worker sends scancel as the job's account; a failure shows on the job's
    timeline as "could not cancel: …"); poll for ``cancelled``."""

    permission_classes = [IsResearcherOrOperator]

    @extend_schema(request=None, responses={202: RequestAcceptedSerializer})
    def post(self, request: Request, job_id: str) -> Response:
        job = job_get_for_user(user=request_user(request), job_id=job_id)
        outcome = job_cancel(actor=request_user(request), job=job)
        job.refresh_from_db()
        return accepted_request(job, outcome)


class JobResumeApi(APIView):
    """Start a new job that continues from one of this job's checkpoints."""

    permission_classes = [IsResearcherOrOperator]

    class InputSerializer(serializers.Serializer):
        checkpoint_step = serializers.IntegerField(min_value=0)
        steps = serializers.IntegerField(min_value=1, required=False)
        name = serializers.CharField(max_length=128, required=False)
        nodes = serializers.IntegerField(min_value=1, required=False)
        tasks_per_node = serializers.IntegerField(min_value=1, required=False)
        partition = serializers.CharField(max_length=64, required=False)
        environment = serializers.DictField(
            child=serializers.CharField(allow_blank=True, max_length=1024),
            required=False,
            help_text="environment variables for the ranks; default: the resumed job's",
        )

    @extend_schema(request=InputSerializer, responses={202: AcceptedSerializer})
    def post(self, request: Request, job_id: str) -> Response:
        job = job_get_for_user(user=request_user(request), job_id=job_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        checkpoint = Checkpoint.objects.filter(job=job, step=values["checkpoint_step"]).first()
        if checkpoint is None:
            raise FieldError(
                "checkpoint_step", f"job has no checkpoint at step {values['checkpoint_step']}"
            )
        overrides = {
            key: values[key] for key in ("nodes", "tasks_per_node", "partition") if key in values
        }
        new_job = job_resume(
            actor=request_user(request),
            checkpoint=checkpoint,
            name=values.get("name"),
            steps=values.get("steps"),
            overrides=overrides,
            environment=values.get("environment"),
        )
        return accepted(new_job)


# The job's fields a metrics answer changes with (its ETag).
METRICS_VERSION_FIELDS = (
    "id",
    "metrics_offset",
    "optimal_loss",
    "target_loss",
    "target_reached_step",
    "metrics_rolled_up_to",
)


class JobMetricsApi(APIView):
    """Metric series, downsampled on the server to at most ``max_points`` per series."""

    permission_classes = [IsResearcherOrOperator]

    @extend_schema(
        parameters=[
            OpenApiParameter("step_min", int),
            OpenApiParameter("step_max", int),
            OpenApiParameter("max_points", int),
        ],
        responses=dict,
    )
    def get(self, request: Request, job_id: str) -> Response:
        # What the answer depends on, read narrowly first: most polls end in a 304.
        job = job_get_for_user(
            user=request_user(request), job_id=job_id, only=METRICS_VERSION_FIELDS
        )
        params = request.query_params

        def integer(name: str, default: int | None, low: int, high: int) -> int | None:
            raw = params.get(name)
            if raw is None or raw == "":
                return default
            try:
                value = int(raw)
            except ValueError:
                raise serializers.ValidationError({name: ["must be an integer"]}) from None
            if not low <= value <= high:
                raise serializers.ValidationError({name: [f"must be between {low} and {high}"]})
            return value

        step_min = integer("step_min", None, 0, 2**31 - 1)
        step_max = integer("step_max", None, 0, 2**31 - 1)
        max_points = integer("max_points", 2000, 10, 2000) or 2000
        # The series change only with new points (the offset moves) and the events' values.
        etag = etag_for(
            job.id,
            job.metrics_offset,
            step_min,
            step_max,
            max_points,
            job.optimal_loss,
            job.target_loss,
            job.target_reached_step,
            # Retention rolling steps up reads them from other rows: another answer's key.
            job.metrics_rolled_up_to,
        )
        unchanged = not_modified(request, etag)
        if unchanged is not None:
            return unchanged  # type: ignore[return-value]

        def answer() -> dict[str, Any]:
            job = job_get_for_user(user=request_user(request), job_id=job_id)
            return job_metrics(job=job, step_min=step_min, step_max=step_max, max_points=max_points)

        if not isinstance(request.accepted_renderer, JSONRenderer):
            # The browsable API renders the answer itself.
            return revalidate(Response(answer()), etag)  # type: ignore[return-value]
        # The answer as sent, kept under its ETag: the same for everyone who may see the
        # job (the access check is above), so a first view of a chart someone has seen
        # since its last points is neither read, decoded nor encoded again.
        body = cache.get_or_set(
            cache.JOB_METRICS_BODY,
            cache.key_job_metrics_body(etag=etag),
            lambda: JSONRenderer().render(answer()),
        )
        response = HttpResponse(body, content_type=JSONRenderer.media_type)
        return revalidate(response, etag)  # type: ignore[return-value]


class JobCheckpointsApi(APIView):
    permission_classes = [IsResearcherOrOperator]

    @extend_schema(responses=CheckpointSerializer(many=True))
    def get(self, request: Request, job_id: str) -> Response:
        job = job_get_for_user(user=request_user(request), job_id=job_id)
        return Response(CheckpointSerializer(job.checkpoints.order_by("-step"), many=True).data)


class JobLogsApi(APIView):
    """The tail of the job's Slurm output file as a worker last read it, with ``read_at``
    and ``age_s``; a read older than a few seconds asks for a new one (``reading``: poll
    again). ``error``: why the last read failed. Nothing is read from the cluster here."""

    permission_classes = [IsResearcherOrOperator]

    @extend_schema(parameters=[OpenApiParameter("max_bytes", int)], responses=dict)
    def get(self, request: Request, job_id: str) -> Response:
        job = job_get_for_user(user=request_user(request), job_id=job_id)
        raw = str(request.query_params.get("max_bytes") or "65536")
        if not raw.isdigit() or not 1 <= int(raw) <= 1 << 20:
            raise serializers.ValidationError({"max_bytes": ["an integer from 1 to 1048576"]})
        return Response(job_log_tail(job=job, max_bytes=int(raw)))


class JobEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["id", "at", "kind", "from_state", "to_state", "message"]


class JobEventPagination(CursorPagination):
    ordering = "at"


class JobEventsApi(generics.ListAPIView):
    """The job's timeline, oldest first."""

    permission_classes = [IsResearcherOrOperator]
    serializer_class = JobEventSerializer
    pagination_class = JobEventPagination
    filter_backends: list[Any] = []

    def get_queryset(self):  # type: ignore[no-untyped-def]
        job = job_get_for_user(user=request_user(self.request), job_id=self.kwargs["job_id"])
        return JobEvent.objects.filter(job=job)


class TrainerPresetsApi(APIView):
    """The trainer's presets and defaults, for building a config."""

    permission_classes = [IsResearcherOrOperator]

    @extend_schema(responses=dict)
    def get(self, request: Request) -> Response:
        return Response({"presets": PRESETS, "defaults": DEFAULTS})
