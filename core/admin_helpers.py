from __future__ import annotations

from typing import Any

from django.db import models
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html


def admin_link(obj: models.Model | None, text: str | None = None) -> str:
    """A link to the object's admin change page, or a dash."""
    if obj is None:
        return "–"
    url = reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk])
    return format_html('<a href="{}">{}</a>', url, text if text is not None else str(obj))


def admin_changelist_link(model: type[models.Model], text: str, **filters: object) -> str:
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    query = "&".join(f"{key}={value}" for key, value in filters.items())
    return format_html('<a href="{}?{}">{}</a>', url, query, text)


class ServiceDeleteMixin:
    """Admin deletions go through a service (``delete_service(actor=, <name>=obj)``), which
    refuses what must not go and writes the audit event; bulk deletion too, one by one,
    refusals listed."""

    delete_service: Any = None
    delete_argument: str = ""

    def delete_model(self, request: HttpRequest, obj: models.Model) -> None:
        self.delete_service(actor=request.user, **{self.delete_argument: obj})

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        from django.contrib import messages

        from core.errors import ApplicationError

        refused = []
        for obj in queryset:
            try:
                self.delete_service(actor=request.user, **{self.delete_argument: obj})
            except ApplicationError as error:
                refused.append(f"{obj}: {error.message}")
        for line in refused:
            messages.error(request, f"Not deleted: {line}")
