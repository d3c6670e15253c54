"""Health API under /api/v1/: a node's GPU health, stack and drift; GPU capacity per
partition by health (readable by researchers and operators, like the inventory); a
cluster's health source (everyone with a role reads it, operators change it, audited)."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.access import request_user
from core.permissions import IsResearcherOrOperator, ReadByRolesWriteByOperators
from health.models import HealthSource
from health.operators import health_source_update
from health.selectors import gpu_capacity_by_partition, node_health_view
from nodes.models import Cluster, Node


class GpuHealthSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    uuid = serializers.CharField()
    model = serializers.CharField()
    state = serializers.CharField()
    reasons = serializers.ListField(child=serializers.CharField())
    action = serializers.CharField()
    readings = serializers.DictField()


class NodeHealthApi(APIView):
    """The node's latest probe verdict: state, reasons, action, per-GPU readings, its
    stack with fingerprint, and how it differs from its partitions' majority stack."""

    permission_classes = [IsResearcherOrOperator]

    class OutputSerializer(serializers.Serializer):
        node = serializers.CharField()
        state = serializers.CharField()
        reasons = serializers.ListField(child=serializers.CharField())
        action = serializers.CharField()
        probed_at = serializers.DateTimeField(allow_null=True)
        stack = serializers.DictField()
        stack_fingerprint = serializers.CharField()
        drift = serializers.DictField()
        gpus = GpuHealthSerializer(many=True)
        offered_for_draining = serializers.BooleanField()

    @extend_schema(responses=OutputSerializer)
    def get(self, request: Request, node_id: int) -> Response:
        node = get_object_or_404(Node.objects.select_related("cluster"), pk=node_id)
        view = node_health_view(node=node)
        health = view.health
        body: dict[str, Any] = {
            "node": node.name,
            "state": view.state,
            "reasons": list(health.reasons) if health else [],
            "action": health.action if health else "watch",
            "probed_at": health.probed_at if health else None,
            "stack": health.stack if health else {},
            "stack_fingerprint": health.stack_fingerprint if health else "",
            "drift": {
                partition: [
                    {"key": d.key, "value": d.value, "majority": d.majority, "split": d.split}
                    for d in differences
                ]
                for partition, differences in view.drift.items()
            },
            "gpus": [
                {
                    "index": gpu.index,
                    "uuid": gpu.uuid,
                    "model": gpu.model,
                    "state": gpu.state,
                    "reasons": gpu.reasons,
                    "action": gpu.action,
                    "readings": gpu.readings,
                }
                for gpu in view.gpus
            ],
            "offered_for_draining": view.offered_for_draining,
        }
        return Response(self.OutputSerializer(body).data)


class GpuCapacityApi(APIView):
    """Per cluster and partition: GPUs healthy, degraded, unhealthy and unknown."""

    permission_classes = [IsResearcherOrOperator]

    class OutputSerializer(serializers.Serializer):
        cluster = serializers.CharField()
        partition = serializers.CharField()
        healthy = serializers.IntegerField()
        degraded = serializers.IntegerField()
        unhealthy = serializers.IntegerField()
        unknown = serializers.IntegerField()
        drifted_nodes = serializers.IntegerField()

    @extend_schema(responses=OutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        rows = gpu_capacity_by_partition()
        return Response(self.OutputSerializer(rows, many=True).data)


class HealthSourceSerializer(serializers.ModelSerializer):
    class Meta:
        model = HealthSource
        fields = [
            "directory",
            "enabled",
            "interval_seconds",
            "last_collected_at",
            "last_error",
            "last_commands",
            "last_bytes",
            "last_seconds",
            "last_counts",
            "updated_at",
        ]
        read_only_fields = [name for name in fields if name.startswith("last_")] + ["updated_at"]


class HealthSourceInputSerializer(serializers.Serializer):
    # Checked again by the model (the path rule of Cluster.workdir, normal, not "/").
    directory = serializers.CharField(max_length=512, required=False)
    enabled = serializers.BooleanField(required=False)
    interval_seconds = serializers.IntegerField(min_value=10, max_value=3600, required=False)


class HealthSourceApi(APIView):
    """Where the cluster's health-check hook leaves its probe files and how often Gantry
    collects them, with the last collection's cost and error. ``configured`` false: none
    yet (an operator's PUT with a directory makes one)."""

    permission_classes = [ReadByRolesWriteByOperators]

    @extend_schema(responses=HealthSourceSerializer)
    def get(self, request: Request, cluster_id: int) -> Response:
        cluster = get_object_or_404(Cluster, pk=cluster_id)
        source = HealthSource.objects.filter(cluster=cluster).first()
        body = HealthSourceSerializer(source or HealthSource(cluster=cluster)).data
        return Response({**body, "configured": source is not None})

    @extend_schema(request=HealthSourceInputSerializer, responses=HealthSourceSerializer)
    def put(self, request: Request, cluster_id: int) -> Response:
        cluster = get_object_or_404(Cluster, pk=cluster_id)
        data = HealthSourceInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        source = health_source_update(
            actor=request_user(request), cluster=cluster, **data.validated_data
        )
        return Response({**HealthSourceSerializer(source).data, "configured": True})

    patch = put
