"""REST API of acceptance: start and cancel a run (operators), list and read runs and
their certificates (every role: a certificate is about the fleet, not anyone's work)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from acceptance.certificate import recovery_summary, sustained_summary
from acceptance.models import REQUESTABLE_TIERS, AcceptanceRun, AcceptanceStep, Certificate
from acceptance.selectors import run_get, run_list
from acceptance.services import RunRequest, acceptance_run_cancel, acceptance_run_start
from core.access import request_user
from core.api import CursorPagination
from core.permissions import IsOperator, IsResearcherOrOperator


class StepSerializer(serializers.ModelSerializer):
    class Meta:
        model = AcceptanceStep
        fields = [
            "id",
            "tier",
            "level",
            "purpose",
            "round",
            "nodes",
            "state",
            "slurm_job_id",
            "threshold",
            "threshold_source",
            "threshold_detail",
            "busbw",
            "config_key",
            "configuration",
            "verdict",
            "reason",
            "measured",
            "evidence",
            "submitted_at",
            "started_at",
            "finished_at",
        ]


class RunSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    requested_by = serializers.CharField(
        source="requested_by.username", read_only=True, default=None
    )
    certificate = serializers.SerializerMethodField()

    class Meta:
        model = AcceptanceRun
        fields = [
            "id",
            "cluster",
            "scope",
            "scope_value",
            "partition",
            "nodes",
            "tiers",
            "options",
            "state",
            "current_tier",
            "outcomes",
            "verdict",
            "reason",
            "convicted",
            "requested_by",
            "created_at",
            "started_at",
            "ended_at",
            "certificate",
        ]

    def get_certificate(self, run: AcceptanceRun) -> str | None:
        if not Certificate.objects.filter(run=run).exists():
            return None
        return f"/api/v1/acceptance/runs/{run.id}/certificate/"


class RunDetailSerializer(RunSerializer):
    steps = StepSerializer(many=True, read_only=True)
    sustained = serializers.SerializerMethodField()
    recovery = serializers.SerializerMethodField()

    class Meta(RunSerializer.Meta):
        fields = [*RunSerializer.Meta.fields, "steps", "sustained", "recovery"]

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_sustained(self, run: AcceptanceRun) -> dict[str, Any] | None:
        return sustained_summary(run)

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_recovery(self, run: AcceptanceRun) -> dict[str, Any] | None:
        return recovery_summary(run)


class RunStartSerializer(serializers.Serializer):
    cluster = serializers.IntegerField()
    scope = serializers.ChoiceField(choices=AcceptanceRun.Scope.choices)
    value = serializers.CharField(max_length=512)
    tiers = serializers.ListField(
        child=serializers.ChoiceField(choices=[t.value for t in REQUESTABLE_TIERS]),
        required=False,
    )
    options = serializers.DictField(required=False)


class RunPagination(CursorPagination):
    ordering = "-created_at"


class AcceptanceRunListApi(generics.ListAPIView):
    """Acceptance runs, newest first; filter by cluster (id) and state."""

    permission_classes = [IsResearcherOrOperator]
    serializer_class = RunSerializer
    pagination_class = RunPagination
    filter_backends: list[Any] = []

    def get_queryset(self) -> QuerySet[AcceptanceRun]:
        cluster = self.request.query_params.get("cluster")
        return run_list(
            cluster_id=int(cluster) if cluster and cluster.isdigit() else None,
            state=self.request.query_params.get("state", ""),
        )


class AcceptanceRunStartApi(APIView):
    """Start an acceptance run of a partition, a node list or a job's nodes (operators);
    202 with the run to poll."""

    permission_classes = [IsOperator]

    @extend_schema(request=RunStartSerializer, responses={202: RunSerializer})
    def post(self, request: Request) -> Response:
        body = RunStartSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        run_request = RunRequest(
            cluster_id=data["cluster"], scope=data["scope"], value=data["value"]
        )
        if "tiers" in data:
            run_request.tiers = list(data["tiers"])
        if "options" in data:
            run_request.options = dict(data["options"])
        run = acceptance_run_start(actor=request_user(request), request=run_request)
        return Response(RunSerializer(run).data, status=status.HTTP_202_ACCEPTED)


class AcceptanceRunDetailApi(APIView):
    permission_classes = [IsResearcherOrOperator]

    @extend_schema(responses=RunDetailSerializer)
    def get(self, request: Request, run_id: str) -> Response:
        return Response(RunDetailSerializer(run_get(run_id=run_id)).data)


class AcceptanceRunCancelApi(APIView):
    permission_classes = [IsOperator]

    @extend_schema(request=None, responses={200: OpenApiTypes.OBJECT})
    def post(self, request: Request, run_id: str) -> Response:
        run = run_get(run_id=run_id)
        outcome = acceptance_run_cancel(actor=request_user(request), run=run)
        return Response({"id": str(run.id), "state": run.state, "outcome": outcome})


class CertificateApi(APIView):
    """The run's certificate: the JSON document as issued (404 until the run ends)."""

    permission_classes = [IsResearcherOrOperator]

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request, run_id: str) -> Response:
        run = run_get(run_id=run_id)
        certificate = Certificate.objects.filter(run=run).first()
        if certificate is None:
            raise Http404("The run has not issued its certificate yet.")
        response = Response({**certificate.document, "digest": certificate.digest})
        response["Content-Disposition"] = f'attachment; filename="certificate-{run.id}.json"'
        return response
