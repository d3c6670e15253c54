"""Admin of acceptance: operators set busbw thresholds here; runs and certificates are
shown read-only (a certificate is immutable once issued)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from acceptance.models import AcceptanceRun, BusbwThreshold, Certificate


@admin.register(BusbwThreshold)
class BusbwThresholdAdmin(admin.ModelAdmin):
    list_display = ("cluster", "partition", "level", "op", "busbw", "updated_by", "updated_at")
    list_filter = ("cluster", "level", "op")
    readonly_fields = ("updated_by", "updated_at")

    def save_model(
        self, request: HttpRequest, obj: BusbwThreshold, form: Any, change: bool
    ) -> None:
        obj.updated_by = request.user  # type: ignore[assignment]
        super().save_model(request, obj, form, change)


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(AcceptanceRun)
class AcceptanceRunAdmin(ReadOnly):
    list_display = ("id", "cluster", "scope_value", "state", "verdict", "created_at")
    list_filter = ("cluster", "state", "verdict")


@admin.register(Certificate)
class CertificateAdmin(ReadOnly):
    list_display = ("id", "cluster", "verdict", "issued_at")
    list_filter = ("cluster", "verdict")
