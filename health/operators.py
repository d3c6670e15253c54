"""Operators' health settings: where a cluster's probe files are and how often they are
collected (``HealthSource``). Validated and audited."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from core.audit import AuditAction, audit_event_record
from core.errors import FieldError
from core.roles import is_operator
from core.types import Actor
from health.models import HealthSource
from nodes.models import Cluster

SOURCE_FIELDS = ("directory", "enabled", "interval_seconds")


def health_source_update(
    *, actor: Actor, cluster: Cluster, system: bool = False, **values: Any
) -> HealthSource:
    """Create or change a cluster's health source (operators; ``system``: Gantry's own
    command line, recorded as such), with the values before and after in the audit log. A
    new source needs a directory; changing the directory forgets the files seen there and
    collects at once."""
    if not system and not is_operator(actor):
        raise PermissionDenied("Only operators may change where health probes are collected.")
    unknown = sorted(set(values) - set(SOURCE_FIELDS))
    if unknown:
        raise FieldError(unknown[0], "not a health source setting")
    with transaction.atomic():
        source = HealthSource.objects.select_for_update().filter(cluster=cluster).first()
        created = source is None
        if source is None:
            source = HealthSource(cluster=cluster)
        before = {key: getattr(source, key) for key in SOURCE_FIELDS}
        for key, value in values.items():
            setattr(source, key, value)
        if created and not source.directory:
            raise FieldError("directory", "a new health source needs its directory")
        if source.directory != before["directory"] or source.enabled != before["enabled"]:
            source.seen, source.next_collect_at = {}, None
        source.updated_by = actor if actor is not None and actor.is_authenticated else None
        try:
            source.full_clean(exclude=["cluster"])
        except ValidationError as error:
            name, messages = next(iter(error.message_dict.items()))
            raise FieldError(name, " ".join(messages)) from None
        source.save()
        audit_event_record(
            actor=actor,
            action=AuditAction.HEALTH_SOURCE_UPDATE,
            target=source,
            details={
                "cluster": cluster.name,
                "created": created,
                "before": None if created else before,
                "after": {key: getattr(source, key) for key in SOURCE_FIELDS},
            },
        )
    return source
