"""REST API for clusters, nodes, GPUs and topology. One view per operation."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from django.shortcuts import get_object_or_404
from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.access import request_user
from core.api import CursorPagination
from core.permissions import IsOperator, IsResearcherOrOperator
from nodes.access.identities import sshd_config_line
from nodes.models import Cluster, Gpu, Node, Partition
from nodes.registration import cluster_probe, cluster_register
from nodes.selectors import cluster_list, node_list, switch_tree
from nodes.services import cluster_sync_request, cluster_update, node_drain, node_resume

_HOST_NAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?"
)


class PartitionSerializer(serializers.ModelSerializer):
    class Meta:
        model = Partition
        fields = [
            "name",
            "is_default",
            "state",
            "max_time_minutes",
            "total_nodes",
            "total_cpus",
            "nodes_expression",
            "gone",
        ]


class ClusterSerializer(serializers.ModelSerializer):
    partitions = PartitionSerializer(many=True, read_only=True)
    # The login node's admin adds this line (and the public key, in that file) to trust
    # Gantry's short-lived user certificates.
    user_ca_sshd_config_line = serializers.SerializerMethodField()

    class Meta:
        model = Cluster
        fields = [
            "id",
            "name",
            "description",
            "is_default",
            "ssh_host",
            "ssh_port",
            "ssh_user",
            "host_key_type",
            "host_key_fingerprint",
            "workdir",
            "python",
            "default_partition",
            "proven_checkpoint_max_age_minutes",
            "verifier_account",
            "slurm_version",
            "slurm_cluster_name",
            "accounting_available",
            "accounting_error",
            "accounting_failing_since",
            "accounting_retry_at",
            "last_reconcile_at",
            "last_reconcile_error",
            "sync_status",
            "last_sync_at",
            "last_sync_ok_at",
            "last_sync_error",
            "sync_failures",
            "next_sync_at",
            "user_auth",
            "user_ca_public_key",
            "user_ca_sshd_config_line",
            "partitions",
        ]

    def get_user_ca_sshd_config_line(self, cluster: Cluster) -> str:
        return sshd_config_line(cluster)


class GpuSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name", read_only=True)
    cluster = serializers.CharField(source="node.cluster.name", read_only=True)

    class Meta:
        model = Gpu
        fields = ["id", "cluster", "node", "index", "gpu_type", "memory_mb", "state", "health"]


class NodeSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    leaf_switch = serializers.CharField(source="leaf_switch.name", read_only=True, default=None)
    gpus = serializers.SerializerMethodField()

    class Meta:
        model = Node
        fields = [
            "id",
            "cluster",
            "name",
            "state",
            "state_flags",
            "reason",
            "cpus_total",
            "cpus_alloc",
            "memory_mb",
            "memory_alloc_mb",
            "features",
            "partitions",
            "leaf_switch",
            "gpus",
            "last_seen_at",
            "state_changed_at",
        ]

    def get_gpus(self, node: Node) -> dict[str, Any]:
        gpus = list(node.gpus.all())
        by_type: dict[str, dict[str, int]] = {}
        for gpu in gpus:
            entry = by_type.setdefault(gpu.gpu_type or "gpu", {"total": 0, "allocated": 0})
            entry["total"] += 1
            entry["allocated"] += gpu.state == Gpu.State.ALLOCATED
        return {
            "total": len(gpus),
            "allocated": sum(gpu.state == Gpu.State.ALLOCATED for gpu in gpus),
            "by_type": by_type,
        }


class ClusterListApi(generics.ListAPIView):
    """Registered clusters with their sync state."""

    permission_classes = [IsResearcherOrOperator]
    serializer_class = ClusterSerializer
    pagination_class = None

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return cluster_list().prefetch_related("partitions")


class ClusterDetailApi(generics.RetrieveAPIView):
    permission_classes = [IsResearcherOrOperator]
    serializer_class = ClusterSerializer
    lookup_url_kwarg = "cluster_id"

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return cluster_list().prefetch_related("partitions")


class ClusterUpdateApi(APIView):
    """Change what may change on a registered cluster (operators): the description, the
    default flag, the work directory, the Python, the default partition and the maximum
    age of a running job's newest proven checkpoint (``null``: no limit), the account
    drills that count as proof run as (``verifier_account``). Validated and
    audited (``cluster.update`` with the values before and after)."""

    permission_classes = [IsOperator]

    class InputSerializer(serializers.Serializer):
        description = serializers.CharField(max_length=255, required=False, allow_blank=True)
        is_default = serializers.BooleanField(required=False)
        workdir = serializers.CharField(max_length=512, required=False)
        python = serializers.CharField(max_length=512, required=False)
        default_partition = serializers.CharField(max_length=64, required=False, allow_blank=True)
        proven_checkpoint_max_age_minutes = serializers.IntegerField(
            min_value=1, max_value=525600, required=False, allow_null=True
        )
        # The account drills that count as proof run as ("": drills are self-attested).
        verifier_account = serializers.CharField(max_length=32, required=False, allow_blank=True)

    @extend_schema(request=InputSerializer, responses=ClusterSerializer)
    def patch(self, request: Request, cluster_id: int) -> Response:
        cluster = get_object_or_404(Cluster, pk=cluster_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        if data.validated_data:
            cluster_update(actor=request_user(request), cluster=cluster, **data.validated_data)
        updated = Cluster.objects.prefetch_related("partitions").get(pk=cluster.pk)
        return Response(ClusterSerializer(updated).data)


class ProbeSerializer(serializers.Serializer):
    slurm_version = serializers.CharField()
    cluster_name = serializers.CharField(allow_null=True)
    accounting_available = serializers.BooleanField()
    accounting_error = serializers.CharField(allow_null=True)
    partitions = serializers.ListField(child=serializers.CharField())
    json_supported = serializers.BooleanField(allow_null=True)


def _probe_data(info: Any) -> dict[str, Any]:
    return {
        "slurm_version": info.slurm_version,
        "cluster_name": info.cluster_name,
        "accounting_available": info.accounting_available,
        "accounting_error": info.accounting_error,
        "partitions": [p.name for p in info.partitions],
        "json_supported": info.json_supported,
    }


class ClusterRegisterApi(APIView):
    """Register a cluster: Gantry connects, shows and pins the host key, probes Slurm.

    Give ``host_key_fingerprint`` (checked on a trusted path) to have Gantry refuse any
    other key. Without it registration is refused, naming the key the server presents,
    unless ``trust_on_first_use`` is true: then that key is pinned as is (and the audit log
    says so).
    """

    permission_classes = [IsOperator]

    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(max_length=63)
        description = serializers.CharField(
            max_length=255, required=False, default="", allow_blank=True
        )
        ssh_host = serializers.CharField(max_length=255)
        ssh_port = serializers.IntegerField(min_value=1, max_value=65535, default=22)
        ssh_user = serializers.CharField(max_length=32)
        private_key = serializers.CharField(
            write_only=True, trim_whitespace=False, style={"base_template": "textarea.html"}
        )
        workdir = serializers.CharField(max_length=512)
        python = serializers.CharField(max_length=512)
        default_partition = serializers.CharField(
            max_length=64, required=False, default="", allow_blank=True
        )
        host_key_fingerprint = serializers.CharField(
            max_length=128, required=False, default="", allow_blank=True
        )
        is_default = serializers.BooleanField(default=False)
        trust_on_first_use = serializers.BooleanField(
            default=False,
            help_text="without host_key_fingerprint: pin whatever key the server presents now",
        )
        user_auth = serializers.ChoiceField(
            choices=Cluster.UserAuth.choices,
            required=False,
            help_text="how Gantry acts as users there (default: certificate, for a new cluster)",
        )

        def validate_ssh_host(self, value: str) -> str:
            # A host name or an IP address, nothing a resolver chokes on (a label over 63
            # characters made the IDNA codec raise, a 500) or a shell could read.
            value = value.strip()
            try:
                ipaddress.ip_address(value)
                return value
            except ValueError:
                pass
            if not _HOST_NAME.fullmatch(value):
                raise serializers.ValidationError(
                    "a host name (letters, digits, '-', '.'; labels of at most 63) or an IP address"
                )
            return value

    class OutputSerializer(serializers.Serializer):
        cluster = ClusterSerializer()
        fingerprint_seen = serializers.CharField()
        probe = ProbeSerializer()

    @extend_schema(request=InputSerializer, responses={201: OutputSerializer})
    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        registration = cluster_register(
            actor=request_user(request),
            name=values["name"],
            description=values["description"],
            ssh_host=values["ssh_host"],
            ssh_port=values["ssh_port"],
            ssh_user=values["ssh_user"],
            private_key=values["private_key"],
            workdir=values["workdir"],
            python=values["python"],
            default_partition=values["default_partition"],
            expected_fingerprint=values["host_key_fingerprint"] or None,
            is_default=values["is_default"],
            trust_on_first_use=values["trust_on_first_use"],
            user_auth=values.get("user_auth"),
        )
        cluster = Cluster.objects.prefetch_related("partitions").get(pk=registration.cluster.pk)
        output = {
            "cluster": cluster,
            "fingerprint_seen": registration.fingerprint_seen,
            "probe": _probe_data(registration.info),
        }
        return Response(self.OutputSerializer(output).data, status=status.HTTP_201_CREATED)


class ClusterProbeApi(APIView):
    """Connect with the pinned key and report Slurm's version, name, partitions, accounting."""

    permission_classes = [IsOperator]

    @extend_schema(request=None, responses=ProbeSerializer)
    def post(self, request: Request, cluster_id: int) -> Response:
        cluster = get_object_or_404(Cluster, pk=cluster_id)
        info = cluster_probe(actor=request_user(request), cluster=cluster)
        return Response(ProbeSerializer(_probe_data(info)).data)


class ClusterSyncApi(APIView):
    """Sync the inventory now (202: poll the cluster for ``last_sync_at``)."""

    permission_classes = [IsOperator]

    class OutputSerializer(serializers.Serializer):
        cluster_id = serializers.IntegerField()
        poll = serializers.CharField()

    @extend_schema(request=None, responses={202: OutputSerializer})
    def post(self, request: Request, cluster_id: int) -> Response:
        cluster = get_object_or_404(Cluster, pk=cluster_id)
        cluster_sync_request(actor=request_user(request), cluster=cluster)
        poll = reverse("api:cluster-detail", args=[cluster.pk])
        return Response(
            self.OutputSerializer({"cluster_id": cluster.pk, "poll": poll}).data,
            status=status.HTTP_202_ACCEPTED,
        )


class NodePagination(CursorPagination):
    ordering = "id"
    page_size = 200


class NodeListApi(generics.ListAPIView):
    """Nodes, filterable by cluster, state, partition, GPU type and a search string."""

    permission_classes = [IsResearcherOrOperator]
    serializer_class = NodeSerializer
    pagination_class = NodePagination
    filter_backends: list[Any] = []

    @extend_schema(
        parameters=[
            OpenApiParameter("cluster", int),
            OpenApiParameter("state", str, enum=[value for value, _ in Node.State.choices]),
            OpenApiParameter("partition", str),
            OpenApiParameter("gpu_type", str),
            OpenApiParameter("search", str),
        ]
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    def get_queryset(self):  # type: ignore[no-untyped-def]
        params = self.request.query_params
        cluster = params.get("cluster")
        if cluster is not None and not cluster.isdigit():
            raise serializers.ValidationError({"cluster": ["must be a cluster id (a number)"]})
        state = params.get("state") or None
        if state and state not in {value for value, _ in Node.State.choices}:
            raise serializers.ValidationError({"state": [f"unknown node state {state!r}"]})
        return node_list(
            cluster_id=int(cluster) if cluster else None,
            state=state,
            partition=params.get("partition") or None,
            gpu_type=params.get("gpu_type") or None,
            search=params.get("search") or None,
        )


class NodeDetailApi(generics.RetrieveAPIView):
    permission_classes = [IsResearcherOrOperator]
    serializer_class = NodeSerializer
    lookup_url_kwarg = "node_id"

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return node_list(include_gone=True)


class NodeDrainApi(APIView):
    """Drain a node in Slurm (operators; a reason is required). Audited."""

    permission_classes = [IsOperator]

    class InputSerializer(serializers.Serializer):
        reason = serializers.CharField(max_length=255)

    @extend_schema(request=InputSerializer, responses=NodeSerializer)
    def post(self, request: Request, node_id: int) -> Response:
        node = get_object_or_404(Node.objects.select_related("cluster"), pk=node_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        node_drain(actor=request_user(request), node=node, reason=data.validated_data["reason"])
        return Response(NodeSerializer(node_list(include_gone=True).get(pk=node.pk)).data)


class NodeResumeApi(APIView):
    """Return a node to service in Slurm (operators). Audited."""

    permission_classes = [IsOperator]

    @extend_schema(request=None, responses=NodeSerializer)
    def post(self, request: Request, node_id: int) -> Response:
        node = get_object_or_404(Node.objects.select_related("cluster"), pk=node_id)
        node_resume(actor=request_user(request), node=node)
        return Response(NodeSerializer(node_list(include_gone=True).get(pk=node.pk)).data)


class GpuListApi(generics.ListAPIView):
    """GPUs, filterable by cluster, type and state."""

    permission_classes = [IsResearcherOrOperator]
    serializer_class = GpuSerializer
    pagination_class = NodePagination
    filterset_fields = ["gpu_type", "state"]

    def get_queryset(self):  # type: ignore[no-untyped-def]
        gpus = Gpu.objects.select_related("node", "node__cluster").exclude(
            node__state=Node.State.GONE
        )
        cluster = self.request.query_params.get("cluster")
        if cluster:
            if not cluster.isdigit():
                raise serializers.ValidationError({"cluster": ["must be a cluster id (a number)"]})
            gpus = gpus.filter(node__cluster_id=int(cluster))
        return gpus


def _switch_json(switch: Any) -> dict[str, Any]:
    return {
        "name": switch.name,
        "level": switch.level,
        "switches": [_switch_json(child) for child in switch.child_list],
        "nodes": [
            {
                "id": node.id,
                "name": node.name,
                "state": node.state,
                "cpus_total": node.cpus_total,
                "memory_mb": node.memory_mb,
                "gpus": [
                    {"index": gpu.index, "type": gpu.gpu_type, "state": gpu.state}
                    for gpu in node.gpus.all()
                ],
            }
            for node in switch.nodes.all()
        ],
    }


class TopologyApi(APIView):
    """The switch tree of each cluster: spine → leaf switches → nodes → GPUs."""

    permission_classes = [IsResearcherOrOperator]

    @extend_schema(parameters=[OpenApiParameter("cluster", int)], responses=dict)
    def get(self, request: Request) -> Response:
        clusters = cluster_list()
        cluster = request.query_params.get("cluster")
        if cluster:
            if not cluster.isdigit():
                raise serializers.ValidationError({"cluster": ["must be a cluster id (a number)"]})
            clusters = clusters.filter(pk=int(cluster))
        return Response(
            {
                "clusters": [
                    {
                        "id": c.id,
                        "name": c.name,
                        "switches": [_switch_json(root) for root in switch_tree(cluster=c)],
                    }
                    for c in clusters
                ]
            }
        )
