"""REST API for checkpoints, restore drills, drill policies and drill budgets."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.access import request_user
from core.api import CursorPagination
from core.permissions import IsResearcherOrOperator, ReadByRolesWriteByOperators
from drills.budgets import drill_budget_update, drill_usage
from drills.models import DrillBudget, DrillPolicy, RestoreDrill
from drills.policies import drill_policy_update
from drills.selectors import checkpoint_proofs, drill_get_for_user, drill_list
from drills.services import checkpoint_verify_request, restore_drill_cancel, restore_drill_start
from jobs.models import Checkpoint
from jobs.selectors import checkpoint_get_for_user
from nodes.models import Cluster
from trainer.sharding import rank_summary


class DrillSerializer(serializers.ModelSerializer):
    job = serializers.UUIDField(source="checkpoint.job_id", read_only=True)
    job_name = serializers.CharField(source="checkpoint.job.name", read_only=True)
    checkpoint_step = serializers.IntegerField(source="checkpoint.step", read_only=True)
    requested_by = serializers.CharField(
        source="requested_by.username", read_only=True, default=None
    )

    class Meta:
        model = RestoreDrill
        fields = [
            "id",
            "job",
            "job_name",
            "checkpoint",
            "checkpoint_step",
            "requested_by",
            "trigger",
            # verifier (run as the cluster's verifier: a pass is proof) or self (run as
            # the checkpoint's owner: a pass is never proof); see drills.attestation.
            "attestation",
            "verifier_account",
            "trainer",
            "trainer_digest",
            "steps",
            # replay (a full drill) or state_exact (state-exact, no replay: the run logged
            # too few steps after the checkpoint to replay them all).
            "level",
            "replay_to_step",
            "reference_digest",
            "allocation",
            "allocation_key",
            # What the owner's drill budget counts (drills.budgets).
            "gpus",
            "time_limit_minutes",
            "state",
            "verdict",
            "reason",
            "reason_code",
            "slurm_job_id",
            "queue_wait_s",
            "integrity_s",
            "load_s",
            "steps_s",
            "created_at",
            "submitted_at",
            "started_at",
            "finished_at",
        ]


class DrillDetailSerializer(DrillSerializer):
    class Meta(DrillSerializer.Meta):
        fields = [*DrillSerializer.Meta.fields, "evidence"]


class CheckpointDetailSerializer(serializers.ModelSerializer):
    job = serializers.UUIDField(source="job_id", read_only=True)
    last_drill = serializers.SerializerMethodField()
    fingerprint = serializers.SerializerMethodField()
    proven_by = serializers.SerializerMethodField()
    strategy = serializers.SerializerMethodField()
    shards_per_rank = serializers.SerializerMethodField()

    class Meta:
        model = Checkpoint
        fields = [
            "id",
            "job",
            "step",
            "path",
            "size_bytes",
            "file_count",
            "state_keys",
            "world_size",
            "manifest",
            "integrity",
            "integrity_detail",
            "integrity_checked_at",
            "integrity_report",
            "saved_at",
            "registered_at",
            "last_proven_at",
            "state_proven_at",
            "proof_level",
            "deleted_at",
            "last_drill",
            "fingerprint",
            "proven_by",
            "strategy",
            "shards_per_rank",
        ]

    def get_strategy(self, checkpoint: Checkpoint) -> str:
        """ddp or fsdp (a checkpoint of format 2 is DDP)."""
        return str((checkpoint.manifest or {}).get("strategy") or "ddp")

    def get_shards_per_rank(self, checkpoint: Checkpoint) -> list[dict[str, Any]]:
        """Per rank: files, file bytes, tensor slices and whole tensors held, tensor bytes
        (which rows of which tensor: ``manifest.sharding``)."""
        manifest = checkpoint.manifest or {}
        return rank_summary(manifest) if manifest.get("sharding") else []

    def get_fingerprint(self, checkpoint: Checkpoint) -> dict[str, Any] | None:
        """Gantry's record of the state at this step (the full fingerprint is in the
        drill reference; here, what it covers)."""
        held = checkpoint.job.fingerprints.filter(step=checkpoint.step).first()
        if held is None:
            return None
        return {"tensors": held.tensors, "source": held.source, "recorded_at": held.recorded_at}

    def get_proven_by(self, checkpoint: Checkpoint) -> list[dict[str, Any]]:
        """The trainer versions whose verifier-attested drills passed on this checkpoint."""
        return checkpoint_proofs(checkpoint=checkpoint)

    def get_last_drill(self, checkpoint: Checkpoint) -> dict[str, Any] | None:
        drill = checkpoint.drills.order_by("-created_at").first()
        return DrillSerializer(drill).data if drill else None


def accepted_drill(drill: RestoreDrill) -> Response:
    body = {
        "id": str(drill.id),
        "state": drill.state,
        "poll": reverse("api:drill-detail", args=[drill.id]),
    }
    return Response(body, status=status.HTTP_202_ACCEPTED)


class CheckpointDetailApi(APIView):
    """The integrity panel: per-rank files, hashes, state keys, last drill."""

    permission_classes = [IsResearcherOrOperator]

    @extend_schema(responses=CheckpointDetailSerializer)
    def get(self, request: Request, checkpoint_id: int) -> Response:
        checkpoint = checkpoint_get_for_user(
            user=request_user(request), checkpoint_id=checkpoint_id
        )
        return Response(CheckpointDetailSerializer(checkpoint).data)


class CheckpointVerifyApi(APIView):
    """Integrity check only (manifest, sizes, hashes, required state). 202: poll the checkpoint."""

    permission_classes = [IsResearcherOrOperator]

    @extend_schema(request=None, responses={202: dict})
    def post(self, request: Request, checkpoint_id: int) -> Response:
        checkpoint = checkpoint_get_for_user(
            user=request_user(request), checkpoint_id=checkpoint_id
        )
        checkpoint_verify_request(actor=request_user(request), checkpoint=checkpoint)
        poll = reverse("api:checkpoint-detail", args=[checkpoint.pk])
        return Response({"id": checkpoint.pk, "poll": poll}, status=status.HTTP_202_ACCEPTED)


class DrillStartApi(APIView):
    """Run a restore drill of this checkpoint on the same or another allocation, compared
    with what Gantry recorded of the original run. Without ``steps`` it replays to the
    run's next checkpoint and compares the state there; ``trainer: current`` asks whether
    the current trainer resumes it (a compatibility drill). 202: poll for the verdict."""

    permission_classes = [IsResearcherOrOperator]

    class InputSerializer(serializers.Serializer):
        steps = serializers.IntegerField(
            min_value=1,
            max_value=10000,
            required=False,
            help_text="Steps to replay; default: to the original run's next checkpoint.",
        )
        trainer = serializers.ChoiceField(
            choices=RestoreDrill.Trainer.choices, default=RestoreDrill.Trainer.RECORDED
        )
        partition = serializers.CharField(max_length=64, required=False)
        nodes = serializers.IntegerField(min_value=1, max_value=4096, required=False)
        tasks_per_node = serializers.IntegerField(min_value=1, max_value=256, required=False)
        gpus_per_node = serializers.IntegerField(min_value=0, max_value=64, required=False)
        gpu_type = serializers.CharField(max_length=64, required=False, allow_blank=True)

    @extend_schema(request=InputSerializer, responses={202: dict})
    def post(self, request: Request, checkpoint_id: int) -> Response:
        checkpoint = checkpoint_get_for_user(
            user=request_user(request), checkpoint_id=checkpoint_id
        )
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        steps = values.pop("steps", None)
        trainer = values.pop("trainer")
        drill = restore_drill_start(
            actor=request_user(request),
            checkpoint=checkpoint,
            steps=steps,
            allocation=values,
            trainer=trainer,
        )
        return accepted_drill(drill)


class DrillPagination(CursorPagination):
    ordering = "-created_at"


class DrillListApi(generics.ListAPIView):
    """Drills you may see, newest first; filter by state, verdict, job, cluster."""

    permission_classes = [IsResearcherOrOperator]
    serializer_class = DrillSerializer
    pagination_class = DrillPagination
    filter_backends: list[Any] = []

    @extend_schema(
        parameters=[
            OpenApiParameter("state", str, enum=[v for v, _ in RestoreDrill.State.choices]),
            OpenApiParameter("verdict", str, enum=[v for v, _ in RestoreDrill.Verdict.choices]),
            OpenApiParameter("job", str),
            OpenApiParameter("cluster", str),
        ]
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    def get_queryset(self) -> QuerySet[RestoreDrill]:
        params = self.request.query_params
        return drill_list(
            user=request_user(self.request),
            state=params.get("state"),
            verdict=params.get("verdict"),
            job=params.get("job"),
            cluster=params.get("cluster"),
        )


class DrillDetailApi(APIView):
    """A drill with its evidence: per-step comparison, per-rank report, timings."""

    permission_classes = [IsResearcherOrOperator]

    @extend_schema(responses=DrillDetailSerializer)
    def get(self, request: Request, drill_id: str) -> Response:
        drill = drill_get_for_user(user=request_user(request), drill_id=drill_id)
        return Response(DrillDetailSerializer(drill).data)


class DrillCancelApi(APIView):
    permission_classes = [IsResearcherOrOperator]

    @extend_schema(request=None, responses={202: dict})
    def post(self, request: Request, drill_id: str) -> Response:
        drill = drill_get_for_user(user=request_user(request), drill_id=drill_id)
        restore_drill_cancel(actor=request_user(request), drill=drill)
        drill.refresh_from_db()
        return accepted_drill(drill)


class DrillPolicySerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    updated_by = serializers.CharField(source="updated_by.username", read_only=True, default=None)

    class Meta:
        model = DrillPolicy
        fields = [
            "cluster",
            "enabled",
            "running_every_hours",
            "drill_final_checkpoint",
            "max_in_flight",
            "steps",
            "updated_at",
            "updated_by",
        ]
        read_only_fields = ["cluster", "updated_at", "updated_by"]


class DrillPolicyApi(APIView):
    """A cluster's scheduled-drill policy. Anyone may read it; operators change it (audited)."""

    permission_classes = [ReadByRolesWriteByOperators]

    @extend_schema(responses=DrillPolicySerializer)
    def get(self, request: Request, cluster_id: int) -> Response:
        cluster = get_object_or_404(Cluster, pk=cluster_id)
        policy, _ = DrillPolicy.objects.get_or_create(cluster=cluster)
        return Response(DrillPolicySerializer(policy).data)

    @extend_schema(request=DrillPolicySerializer, responses=DrillPolicySerializer)
    def put(self, request: Request, cluster_id: int) -> Response:
        cluster = get_object_or_404(Cluster, pk=cluster_id)
        data = DrillPolicySerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        policy = drill_policy_update(
            actor=request_user(request), cluster=cluster, **data.validated_data
        )
        return Response(DrillPolicySerializer(policy).data)

    patch = put


class DrillBudgetSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    updated_by = serializers.CharField(source="updated_by.username", read_only=True, default=None)

    class Meta:
        model = DrillBudget
        fields = [
            "cluster",
            "max_active_drills",
            "max_gpus",
            "max_gpu_hours_per_day",
            "updated_at",
            "updated_by",
        ]
        read_only_fields = ["cluster", "updated_at", "updated_by"]


class DrillBudgetApi(APIView):
    """A cluster's drill budget: per owner, the most active drills, GPUs held by them at
    once and GPU-hours of drills a day (rolling 24 h), with what yours use now. Anyone
    may read it; operators change it (audited)."""

    permission_classes = [ReadByRolesWriteByOperators]

    def _body(self, request: Request, budget: DrillBudget) -> dict[str, Any]:
        usage = drill_usage(
            owner_id=request_user(request).pk, cluster=budget.cluster, now=timezone.now()
        )
        return {
            **DrillBudgetSerializer(budget).data,
            "yours": {
                "active_drills": usage.active_drills,
                "gpus": usage.gpus,
                "gpu_hours_today": usage.gpu_hours_today,
            },
        }

    @extend_schema(responses=dict)
    def get(self, request: Request, cluster_id: int) -> Response:
        cluster = get_object_or_404(Cluster, pk=cluster_id)
        return Response(self._body(request, DrillBudget.for_cluster(cluster)))

    @extend_schema(request=DrillBudgetSerializer, responses=dict)
    def put(self, request: Request, cluster_id: int) -> Response:
        cluster = get_object_or_404(Cluster, pk=cluster_id)
        data = DrillBudgetSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        budget = drill_budget_update(
            actor=request_user(request), cluster=cluster, **data.validated_data
        )
        return Response(self._body(request, budget))

    patch = put
