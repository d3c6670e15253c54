from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api import CursorPagination
from core.models import AuditEvent
from core.permissions import IsOperator
from core.roles import role_name


class MeApi(APIView):
    """Who the caller is and which role they have."""

    class OutputSerializer(serializers.Serializer):
        username = serializers.CharField()
        role = serializers.ChoiceField(choices=["operator", "researcher", "none"])
        is_staff = serializers.BooleanField()

    @extend_schema(responses=OutputSerializer, operation_id="me")
    def get(self, request: Request) -> Response:
        user = request.user
        assert isinstance(user, AbstractBaseUser)
        data = {
            "username": user.get_username(),
            "role": role_name(user),
            "is_staff": bool(getattr(user, "is_staff", False)),
        }
        return Response(self.OutputSerializer(data).data)


class AuditEventPagination(CursorPagination):
    ordering = "-at"


class AuditEventListApi(generics.ListAPIView):
    """The audit log, newest first. Operators only."""

    permission_classes = [IsOperator]
    pagination_class = AuditEventPagination

    class OutputSerializer(serializers.ModelSerializer):
        actor = serializers.CharField(source="actor_name")

        class Meta:
            model = AuditEvent
            fields = [
                "id",
                "at",
                "actor",
                "action",
                "target_type",
                "target_id",
                "target_repr",
                "details",
            ]

    serializer_class = OutputSerializer
    filterset_fields = ["action", "target_type", "target_id"]

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return AuditEvent.objects.all()
