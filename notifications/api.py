"""REST API for one's own notification subscriptions and their delivery log. One view per
operation; every error is ``{"message", "extra"}`` (a refused field in ``extra.fields``)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.access import request_user
from core.api import CursorPagination
from core.permissions import IsResearcherOrOperator
from nodes.models import Cluster
from notifications.models import Delivery, Subscription
from notifications.selectors import (
    delivery_list_for_user,
    subscription_get_for_user,
    subscription_list_for_user,
)
from notifications.services import subscription_create, subscription_remove
from notifications.topics import Topic


class SubscriptionSerializer(serializers.ModelSerializer):
    """A subscription as its owner sees it: never the signing secret, only its first
    characters (``secret_prefix``)."""

    cluster = serializers.CharField(source="cluster.name", read_only=True, default=None)
    active = serializers.BooleanField(source="is_active", read_only=True)

    class Meta:
        model = Subscription
        fields = [
            "id",
            "name",
            "channel",
            "url",
            "secret_prefix",
            "topics",
            "cluster",
            "active",
            "created_at",
            "removed_at",
            "consecutive_failures",
            "paused_until",
        ]
        read_only_fields = fields


class SubscriptionListApi(generics.ListAPIView):
    """Your own subscriptions, newest first (removed ones too, marked inactive)."""

    permission_classes = [IsResearcherOrOperator]
    serializer_class = SubscriptionSerializer
    pagination_class = None

    def get_queryset(self):  # type: ignore[no-untyped-def]
        if getattr(self, "swagger_fake_view", False):
            # The schema generator may ask with no one signed in.
            return Subscription.objects.none()
        return subscription_list_for_user(user=request_user(self.request))


class SubscriptionCreateApi(APIView):
    """Subscribe: by ``email`` (to your account's address) or by ``webhook`` (a JSON POST
    to ``url``, signed ``X-Gantry-Signature: sha256=<HMAC-SHA256 of the body>``). The
    answer holds the webhook's signing ``secret``: the only time it is shown.

    The URL must be http(s) and resolve to public addresses only (no loopback, private,
    link-local or metadata addresses) unless an operator allowed them; it is checked again
    at every send. Operators' topics (``node.*``, ``drill.failed``, ``proven_age.breach``)
    may be narrowed to one ``cluster`` (its id)."""

    permission_classes = [IsResearcherOrOperator]

    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(max_length=64)
        channel = serializers.ChoiceField(choices=Subscription.Channel.choices)
        url = serializers.CharField(max_length=2048, required=False, default="", allow_blank=True)
        topics = serializers.ListField(
            child=serializers.ChoiceField(choices=Topic.choices), allow_empty=False
        )
        cluster = serializers.IntegerField(required=False, allow_null=True, default=None)

    class OutputSerializer(SubscriptionSerializer):
        secret = serializers.SerializerMethodField(
            help_text="the webhook's signing secret, shown only in this answer; null for email"
        )

        class Meta(SubscriptionSerializer.Meta):
            fields = [*SubscriptionSerializer.Meta.fields, "secret"]
            read_only_fields = fields

        def get_secret(self, subscription: Subscription) -> str | None:
            secret: str | None = self.context.get("secret")
            return secret

    @extend_schema(request=InputSerializer, responses={201: OutputSerializer})
    def post(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values: dict[str, Any] = dict(data.validated_data)
        cluster = None
        if values["cluster"] is not None:
            cluster = Cluster.objects.filter(pk=values["cluster"]).first()
            if cluster is None:
                return Response(
                    {
                        "message": "cluster: no such cluster",
                        "extra": {"fields": {"cluster": ["no such cluster"]}},
                    },
                    status=status.HTTP_400_BAD_REQUEST,
                )
        subscription, secret = subscription_create(
            user=request_user(request),
            name=values["name"],
            channel=values["channel"],
            url=values["url"],
            topics=values["topics"],
            cluster=cluster,
        )
        body = self.OutputSerializer(subscription, context={"secret": secret}).data
        response = Response(body, status=status.HTTP_201_CREATED)
        # The answer holds a secret: no cache may keep it.
        response["Cache-Control"] = "no-store"
        return response


class SubscriptionDetailApi(APIView):
    permission_classes = [IsResearcherOrOperator]

    @extend_schema(responses=SubscriptionSerializer)
    def get(self, request: Request, subscription_id: int) -> Response:
        subscription = subscription_get_for_user(
            user=request_user(request), subscription_id=subscription_id
        )
        return Response(SubscriptionSerializer(subscription).data)


class SubscriptionRemoveApi(APIView):
    """Remove a subscription: nothing more is sent to it; its delivery log stays."""

    permission_classes = [IsResearcherOrOperator]

    @extend_schema(request=None, responses=SubscriptionSerializer)
    def post(self, request: Request, subscription_id: int) -> Response:
        subscription = subscription_remove(
            user=request_user(request), subscription_id=subscription_id
        )
        return Response(SubscriptionSerializer(subscription).data)


class DeliverySerializer(serializers.ModelSerializer):
    event_id = serializers.UUIDField(source="event.id", read_only=True)
    event_kind = serializers.CharField(source="event.kind", read_only=True)
    event_title = serializers.CharField(source="event.title", read_only=True)
    occurred_at = serializers.DateTimeField(source="event.occurred_at", read_only=True)
    attempt_log = serializers.SerializerMethodField()

    class Meta:
        model = Delivery
        fields = [
            "id",
            "event_id",
            "event_kind",
            "event_title",
            "occurred_at",
            "state",
            "attempts",
            "next_attempt_at",
            "delivered_at",
            "last_error",
            "attempt_log",
        ]

    def get_attempt_log(self, delivery: Delivery) -> list[dict[str, Any]]:
        return [
            {
                "number": attempt.number,
                "started_at": attempt.started_at,
                "duration_ms": attempt.duration_ms,
                "ok": attempt.ok,
                "status_code": attempt.status_code,
                "error": attempt.error,
            }
            for attempt in delivery.attempt_log.all()
        ]


class DeliveryPagination(CursorPagination):
    ordering = "-created_at"


class SubscriptionDeliveriesApi(generics.ListAPIView):
    """The delivery log of one of your subscriptions, newest first, with every attempt."""

    permission_classes = [IsResearcherOrOperator]
    serializer_class = DeliverySerializer
    pagination_class = DeliveryPagination

    def get_queryset(self):  # type: ignore[no-untyped-def]
        if getattr(self, "swagger_fake_view", False):
            # The schema generator asks without a subscription.
            return Delivery.objects.none()
        subscription = subscription_get_for_user(
            user=request_user(self.request), subscription_id=self.kwargs["subscription_id"]
        )
        return (
            delivery_list_for_user(user=request_user(self.request))
            .filter(subscription=subscription)
            .prefetch_related("attempt_log")
        )
