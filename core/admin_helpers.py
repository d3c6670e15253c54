from __future__ import annotations

from django.db import models
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
