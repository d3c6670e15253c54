"""The admin of the health app: each cluster's health source (operators edit it; the change
goes through ``health.operators.health_source_update``, validated and audited)."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from core.access import request_user
from health.models import HealthSource
from health.operators import health_source_update


@admin.register(HealthSource)
class HealthSourceAdmin(admin.ModelAdmin):
    list_display = [
        "cluster",
        "directory",
        "enabled",
        "interval_seconds",
        "last_collected_at",
        "last_seconds",
        "last_bytes",
        "last_error",
    ]
    list_filter = ["enabled"]
    fields = [
        "cluster",
        "directory",
        "enabled",
        "interval_seconds",
        "last_collected_at",
        "last_error",
        "last_commands",
        "last_bytes",
        "last_seconds",
        "last_counts",
        "updated_by",
        "updated_at",
    ]
    readonly_fields = [
        "last_collected_at",
        "last_error",
        "last_commands",
        "last_bytes",
        "last_seconds",
        "last_counts",
        "updated_by",
        "updated_at",
    ]

    def get_readonly_fields(self, request: HttpRequest, obj: object = None) -> list[str]:
        # The cluster is chosen when the source is made, never moved to another one.
        extra = ["cluster"] if obj is not None else []
        return [*self.readonly_fields, *extra]

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        # Switch a source off instead: the change is then audited.
        return False

    def save_model(
        self, request: HttpRequest, obj: HealthSource, form: object, change: bool
    ) -> None:
        # Through the service, so the change is validated and audited like the API's.
        saved = health_source_update(
            actor=request_user(request),
            cluster=obj.cluster,
            directory=obj.directory,
            enabled=obj.enabled,
            interval_seconds=obj.interval_seconds,
        )
        obj.pk = saved.pk
        obj.refresh_from_db()
