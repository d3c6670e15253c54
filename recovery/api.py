"""REST API of recovery: incidents (the job's access rule), a cluster's recovery policy
(everyone reads it, operators change it), and suspect nodes (operators)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.access import request_user
from core.api import CursorPagination
from core.errors import FieldError
from core.permissions import IsOperator, IsResearcherOrOperator, ReadByRolesWriteByOperators
from nodes.models import Cluster, Node
from recovery.detect import policy_for
from recovery.models import Incident, RecoveryPolicy, SuspectNode
from recovery.operators import recovery_policy_update, suspect_node_clear
from recovery.selectors import incident_list, suspect_nodes


class IncidentSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    job_name = serializers.CharField(source="job.name", read_only=True)
    resumed_from_step = serializers.IntegerField(
        source="resumed_from.step", read_only=True, default=None
    )
    time_to_detect_s = serializers.FloatField(read_only=True)

    class Meta:
        model = Incident
        fields = [
            "id",
            "job",
            "job_name",
            "lineage_root",
            "cluster",
            "signal",
            "detail",
            "evidence",
            "stopped_at",
            "detected_at",
            "time_to_detect_s",
            "cancel_requested_at",
            "cancelled_at",
            "outcome",
            "reason",
            "resumed_from",
            "resumed_from_step",
            "resumed_job",
            "resumed_at",
            "resumed_proof",
            "steps",
            "deadline_passed_at",
            "skipped",
            "suspect_nodes",
            "excluded_nodes",
            "lost_steps",
            "lost_gpu_hours",
            "closed_at",
        ]


class IncidentPagination(CursorPagination):
    ordering = "-detected_at"


class IncidentListApi(generics.ListAPIView):
    """Incidents of the jobs you may see, newest first; filter by job (its whole lineage),
    cluster, outcome."""

    permission_classes = [IsResearcherOrOperator]
    serializer_class = IncidentSerializer
    pagination_class = IncidentPagination
    filter_backends: list[Any] = []

    @extend_schema(
        parameters=[
            OpenApiParameter("job", str),
            OpenApiParameter("cluster", str),
            OpenApiParameter("outcome", str, enum=[v for v, _ in Incident.Outcome.choices]),
        ]
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    def get_queryset(self) -> QuerySet[Incident]:
        params = self.request.query_params
        return incident_list(
            user=request_user(self.request),
            job=params.get("job"),
            cluster=params.get("cluster"),
            outcome=params.get("outcome"),
        )


class RecoveryPolicySerializer(serializers.ModelSerializer):
    class Meta:
        model = RecoveryPolicy
        fields = [
            "enabled",
            "max_attempts",
            "gpu_hours_budget",
            "on_hang",
            "exclude_suspects",
            "hang_factor",
            "hang_floor_seconds",
            "loss_spike_factor",
            "startup_grace_seconds",
            "state_exact_resume",
            "cancel_deadline_seconds",
            "node_view_deadline_seconds",
            "proving_start_deadline_seconds",
            "updated_at",
        ]
        read_only_fields = ["updated_at"]


class RecoveryPolicyApi(APIView):
    """A cluster's recovery policy: the settings of jobs that set none. Anyone with a role
    reads it; operators change it (audited)."""

    permission_classes = [ReadByRolesWriteByOperators]

    @extend_schema(responses=RecoveryPolicySerializer)
    def get(self, request: Request, cluster_id: int) -> Response:
        cluster = get_object_or_404(Cluster, pk=cluster_id)
        return Response(RecoveryPolicySerializer(policy_for(cluster)).data)

    @extend_schema(request=RecoveryPolicySerializer, responses=RecoveryPolicySerializer)
    def put(self, request: Request, cluster_id: int) -> Response:
        cluster = get_object_or_404(Cluster, pk=cluster_id)
        data = RecoveryPolicySerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        policy = recovery_policy_update(
            actor=request_user(request), cluster=cluster, **data.validated_data
        )
        return Response(RecoveryPolicySerializer(policy).data)

    patch = put


class SuspectEvidenceSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=SuspectNode.Kind.choices)
    # An incident's suspicion: the incident and its job.
    incident = serializers.IntegerField(allow_null=True)
    # The job whose evidence it is: the incident's, or (silent data corruption) the job
    # whose checkpoint the drills ran.
    job = serializers.CharField()
    # Silent data corruption: the drill that failed its bit-exact comparison on the node,
    # the drill that passed it on other nodes, and the checkpoint they ran.
    drill = serializers.UUIDField(allow_null=True)
    passed_drill = serializers.UUIDField(allow_null=True)
    checkpoint = serializers.IntegerField(allow_null=True)
    checkpoint_step = serializers.IntegerField(allow_null=True)
    why = serializers.CharField()


def _evidence(suspicion: SuspectNode) -> dict[str, Any]:
    drill = suspicion.drill
    job = suspicion.incident.job_id if suspicion.incident is not None else None
    if drill is not None:
        job = drill.checkpoint.job_id
    return {
        "kind": suspicion.kind,
        "incident": suspicion.incident_id,
        "job": str(job) if job is not None else "",
        "drill": str(drill.id) if drill is not None else None,
        "passed_drill": str(suspicion.passed_drill_id) if suspicion.passed_drill_id else None,
        "checkpoint": drill.checkpoint_id if drill is not None else None,
        "checkpoint_step": drill.checkpoint.step if drill is not None else None,
        "why": suspicion.evidence,
    }


class SuspectNodeSerializer(serializers.Serializer):
    node = serializers.CharField()
    node_id = serializers.IntegerField()
    cluster = serializers.CharField()
    state = serializers.CharField()
    runs = serializers.IntegerField()
    owners = serializers.IntegerField()
    slurm_says_faulty = serializers.BooleanField()
    offered_for_draining = serializers.BooleanField()
    silent_data_corruption = serializers.BooleanField()
    evidence = SuspectEvidenceSerializer(many=True)


class SuspectNodesApi(APIView):
    """Nodes the evidence points at (incidents, and silent data corruption shown by a pair
    of restore drills), not cleared yet, most suspected first (operators).
    ``offered_for_draining``: suspect on evidence from two or more different owners, or
    Slurm itself shows the node down, drained or failing."""

    permission_classes = [IsOperator]

    @extend_schema(
        parameters=[OpenApiParameter("cluster", int)],
        responses=SuspectNodeSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        raw = request.query_params.get("cluster") or ""
        if raw and not (raw.isascii() and raw.isdigit() and len(raw) <= 9):
            raise FieldError("cluster", "a cluster id (a whole number)")
        cluster_id = int(raw) if raw else None
        return Response(
            [
                {
                    "node": summary.node.name,
                    "node_id": summary.node.pk,
                    "cluster": summary.node.cluster.name,
                    "state": summary.node.state,
                    "runs": summary.jobs,
                    "owners": summary.owners,
                    "slurm_says_faulty": summary.slurm_says_faulty,
                    "offered_for_draining": summary.offered_for_draining,
                    "silent_data_corruption": summary.silent_data_corruption,
                    "evidence": [_evidence(s) for s in summary.suspicions],
                }
                for summary in suspect_nodes(cluster_id=cluster_id)
            ]
        )


class SuspectNodeClearSerializer(serializers.Serializer):
    why = serializers.CharField(max_length=500, required=False, allow_blank=True)


class SuspectNodeClearedSerializer(serializers.Serializer):
    node = serializers.CharField()
    cleared = serializers.IntegerField()


class SuspectNodeClearApi(APIView):
    """Clear a node's suspicions (operators, audited): recoveries stop leaving it out."""

    permission_classes = [IsOperator]

    @extend_schema(request=SuspectNodeClearSerializer, responses=SuspectNodeClearedSerializer)
    def post(self, request: Request, node_id: int) -> Response:
        node = get_object_or_404(Node, pk=node_id)
        data = SuspectNodeClearSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        cleared = suspect_node_clear(
            actor=request_user(request), node=node, why=data.validated_data.get("why", "")
        )
        return Response({"node": node.name, "cleared": cleared})
