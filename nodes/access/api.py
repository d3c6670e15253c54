"""REST API of per-user cluster identities (``nodes.access.identities``), under /api/v1/clusters/.

One view per operation. The user CA's public key and the sshd line are for everyone with a
role (they are what a login node's admin needs, nothing secret); the mapping of users to
accounts is for operators; each user sees their own account.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.access import request_user
from core.errors import FieldError
from core.permissions import IsOperator, IsResearcherOrOperator
from nodes.access.identities import (
    NO_IDENTITY_FIX,
    cluster_identity_delete,
    cluster_identity_for_user,
    cluster_identity_list,
    cluster_identity_set,
    cluster_user_auth_set,
    cluster_user_ca_ensure,
    sshd_config_line,
    sshd_config_lines,
    trusted_ca_file,
    trusted_ca_keys,
)
from nodes.models import Cluster, ClusterIdentity


class UserCaSerializer(serializers.Serializer):
    cluster_id = serializers.IntegerField()
    user_auth = serializers.CharField()
    public_key = serializers.CharField(allow_null=True)
    trusted_ca_file = serializers.CharField()
    sshd_config_line = serializers.CharField()
    sshd_config_lines = serializers.ListField(child=serializers.CharField())
    trusted_ca_keys = serializers.ListField(child=serializers.CharField())


def user_ca_data(cluster: Cluster) -> dict[str, Any]:
    return {
        "cluster_id": cluster.pk,
        "user_auth": cluster.user_auth,
        "public_key": cluster.user_ca_public_key or None,
        "trusted_ca_file": trusted_ca_file(cluster),
        "sshd_config_line": sshd_config_line(cluster),
        "sshd_config_lines": sshd_config_lines(cluster),
        "trusted_ca_keys": trusted_ca_keys(cluster),
    }


class IdentitySerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="cluster.name", read_only=True)
    user = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = ClusterIdentity
        fields = ["id", "cluster", "user", "account", "public_key", "created_at", "updated_at"]


class ClusterUserCaApi(APIView):
    """The cluster's user CA: its public key, the lines of the login node's TrustedUserCAKeys
    file (``trusted_ca_keys``: two during a rotation) and the lines its sshd_config needs
    (``sshd_config_lines``: trust the CA, accept only Gantry's principal per account;
    ``sshd_config_line`` is the first). The private key is never shown. ``public_key`` is
    null until an operator creates the CA."""

    permission_classes = [IsResearcherOrOperator]

    @extend_schema(responses=UserCaSerializer)
    def get(self, request: Request, cluster_id: int) -> Response:
        cluster = get_object_or_404(Cluster, pk=cluster_id)
        return Response(UserCaSerializer(user_ca_data(cluster)).data)


class ClusterUserCaCreateApi(APIView):
    """Create the cluster's user CA if it has none (operators; audited); idempotent."""

    permission_classes = [IsOperator]

    @extend_schema(request=None, responses=UserCaSerializer)
    def post(self, request: Request, cluster_id: int) -> Response:
        cluster = get_object_or_404(Cluster, pk=cluster_id)
        cluster_user_ca_ensure(actor=request_user(request), cluster=cluster)
        return Response(UserCaSerializer(user_ca_data(cluster)).data)


class ClusterUserAuthApi(APIView):
    """How Gantry acts as users on this cluster (operators; audited): ``certificate``,
    ``user_keys``, or ``service_account`` (the explicit opt-in to the legacy single account)."""

    permission_classes = [IsOperator]

    class InputSerializer(serializers.Serializer):
        user_auth = serializers.ChoiceField(choices=Cluster.UserAuth.choices)

    @extend_schema(request=InputSerializer, responses=UserCaSerializer)
    def put(self, request: Request, cluster_id: int) -> Response:
        cluster = get_object_or_404(Cluster, pk=cluster_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        cluster = cluster_user_auth_set(
            actor=request_user(request), cluster=cluster, user_auth=data.validated_data["user_auth"]
        )
        return Response(UserCaSerializer(user_ca_data(cluster)).data)


class ClusterIdentityListApi(APIView):
    """Which cluster account each Gantry user's work runs as on this cluster (operators)."""

    permission_classes = [IsOperator]

    @extend_schema(responses=IdentitySerializer(many=True))
    def get(self, request: Request, cluster_id: int) -> Response:
        cluster = get_object_or_404(Cluster, pk=cluster_id)
        identities = cluster_identity_list(cluster=cluster)
        return Response(IdentitySerializer(identities, many=True).data)


class ClusterIdentitySetApi(APIView):
    """Map a Gantry user (by user name) to a cluster account (operators; audited). One
    account per user and one user per account on a cluster; mapping a user again changes
    the account their new work runs as."""

    permission_classes = [IsOperator]

    class InputSerializer(serializers.Serializer):
        user = serializers.CharField(max_length=150)
        # Checked as given (nodes.access.identities.check_account): never trimmed or repaired.
        account = serializers.CharField(max_length=64, trim_whitespace=False, allow_blank=True)

    @extend_schema(request=InputSerializer, responses={201: IdentitySerializer})
    def post(self, request: Request, cluster_id: int) -> Response:
        cluster = get_object_or_404(Cluster, pk=cluster_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        user = get_user_model().objects.filter(username=data.validated_data["user"]).first()
        if user is None:
            raise FieldError("user", "no Gantry user with this name")
        identity = cluster_identity_set(
            actor=request_user(request),
            cluster=cluster,
            user=user,
            account=data.validated_data["account"],
        )
        identity = cluster_identity_list().get(pk=identity.pk)
        return Response(IdentitySerializer(identity).data, status=status.HTTP_201_CREATED)


class ClusterIdentityDeleteApi(APIView):
    """Remove a mapping (operators; audited). Work already submitted keeps its account."""

    permission_classes = [IsOperator]

    @extend_schema(request=None, responses={204: None})
    def post(self, request: Request, cluster_id: int, identity_id: int) -> Response:
        identity = get_object_or_404(
            cluster_identity_list(cluster=get_object_or_404(Cluster, pk=cluster_id)),
            pk=identity_id,
        )
        cluster_identity_delete(actor=request_user(request), identity=identity)
        return Response(status=status.HTTP_204_NO_CONTENT)


class MyIdentitySerializer(serializers.Serializer):
    cluster_id = serializers.IntegerField()
    user_auth = serializers.CharField()
    account = serializers.CharField(allow_null=True)
    public_key = serializers.CharField(allow_null=True)
    fix = serializers.CharField(allow_null=True)


class MyClusterIdentityApi(APIView):
    """The account your work runs as on this cluster (null, with what to do, when you have
    none); on a cluster in ``user_keys`` mode, the public key to install for it."""

    permission_classes = [IsResearcherOrOperator]

    @extend_schema(responses=MyIdentitySerializer)
    def get(self, request: Request, cluster_id: int) -> Response:
        cluster = get_object_or_404(Cluster, pk=cluster_id)
        identity = cluster_identity_for_user(cluster=cluster, user=request_user(request))
        service = cluster.user_auth == Cluster.UserAuth.SERVICE_ACCOUNT
        data = {
            "cluster_id": cluster.pk,
            "user_auth": cluster.user_auth,
            "account": cluster.ssh_user if service else (identity.account if identity else None),
            "public_key": (identity.public_key or None) if identity else None,
            "fix": None if service or identity else NO_IDENTITY_FIX.format(id=cluster.pk),
        }
        return Response(MyIdentitySerializer(data).data)
