"""REST API of scaling studies. Create answers 202 with the id to poll."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.access import request_user
from core.api import CursorPagination
from core.errors import FieldError
from core.permissions import IsResearcherOrOperator
from nodes.models import Cluster
from studies.models import ScalingStudy
from studies.selectors import study_get_for_user, study_list_for_user, study_report
from studies.services import study_create, study_results_freeze
from trainer.config import PRESETS


class StudySerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", read_only=True)
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    url = serializers.SerializerMethodField()

    class Meta:
        model = ScalingStudy
        fields = [
            "id",
            "name",
            "kind",
            "owner",
            "cluster",
            "partition",
            "scales",
            "batch_size",
            "warmup_steps",
            "measured_steps",
            "ranks_per_node",
            "gpus_per_rank",
            "use_placement",
            "target_requested",
            "config",
            "created_at",
            "url",
        ]

    def get_url(self, study: ScalingStudy) -> str:
        return reverse("api:study-detail", args=[study.pk])


class StudyInputSerializer(serializers.Serializer):
    cluster = serializers.CharField(required=False, help_text="default cluster if omitted")
    name = serializers.CharField(max_length=128)
    kind = serializers.ChoiceField(choices=ScalingStudy.Kind.values)
    scales = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=4096), help_text="rank counts"
    )
    preset = serializers.ChoiceField(choices=sorted(PRESETS), required=False)
    config = serializers.DictField(required=False, default=dict, help_text="trainer config keys")
    batch_size = serializers.IntegerField(
        min_value=1,
        required=False,
        help_text="strong: the fixed global batch; weak: the fixed per-rank batch",
    )
    warmup_steps = serializers.IntegerField(min_value=0, max_value=100000, default=5)
    measured_steps = serializers.IntegerField(min_value=1, max_value=100000, default=30)
    partition = serializers.CharField(required=False, allow_blank=True, default="")
    ranks_per_node = serializers.IntegerField(min_value=1, max_value=256, default=1)
    gpus_per_rank = serializers.IntegerField(min_value=0, max_value=1, default=1)
    gpu_type = serializers.CharField(required=False, allow_blank=True, default="")
    time_limit_minutes = serializers.IntegerField(min_value=1, max_value=525600, default=15)
    use_placement = serializers.BooleanField(default=True)
    target_requested = serializers.BooleanField(default=False)


def cluster_from(name: str | None) -> Cluster:
    if name:
        cluster = Cluster.objects.filter(name=name).first()
        if cluster is None:
            raise FieldError("cluster", f"no cluster named {name!r}")
        return cluster
    cluster = Cluster.objects.filter(is_default=True).first()
    if cluster is None:
        raise FieldError("cluster", "no default cluster; name one")
    return cluster


class StudyPagination(CursorPagination):
    ordering = "-created_at"


class StudyListCreateApi(APIView):
    """``GET``: studies you may see (operators: all), newest first.
    ``POST``: create a study; its points are submitted one after another (202)."""

    permission_classes = [IsResearcherOrOperator]

    @extend_schema(responses=StudySerializer(many=True))
    def get(self, request: Request) -> Response:
        paginator = StudyPagination()
        page = paginator.paginate_queryset(
            study_list_for_user(user=request_user(request)), request, self
        )
        return paginator.get_paginated_response(StudySerializer(page, many=True).data)

    @extend_schema(request=StudyInputSerializer, responses={202: dict})
    def post(self, request: Request) -> Response:
        data = StudyInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values: dict[str, Any] = dict(data.validated_data)
        config = dict(values.get("config") or {})
        if values.get("preset"):
            config.setdefault("preset", values["preset"])
        study = study_create(
            user=request_user(request),
            cluster=cluster_from(values.get("cluster")),
            name=values["name"],
            kind=values["kind"],
            scales=list(values["scales"]),
            config=config,
            batch_size=values.get("batch_size"),
            warmup_steps=values["warmup_steps"],
            measured_steps=values["measured_steps"],
            partition=values["partition"],
            ranks_per_node=values["ranks_per_node"],
            gpus_per_rank=values["gpus_per_rank"],
            gpu_type=values["gpu_type"],
            time_limit_minutes=values["time_limit_minutes"],
            use_placement=values["use_placement"],
            target_requested=values["target_requested"],
        )
        body = {
            "id": study.pk,
            "state": "running",
            "poll": reverse("api:study-detail", args=[study.pk]),
        }
        return Response(body, status=status.HTTP_202_ACCEPTED)


class StudyDetailApi(APIView):
    """A study with its table: per point the job, steady-state throughput, speed-up,
    efficiency, step-time breakdown, and whether the points are comparable."""

    permission_classes = [IsResearcherOrOperator]

    @extend_schema(responses=dict)
    def get(self, request: Request, study_id: int) -> Response:
        study = study_get_for_user(user=request_user(request), study_id=study_id)
        study_results_freeze(study=study)
        return Response({**StudySerializer(study).data, "report": study_report(study=study)})
