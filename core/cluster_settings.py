"""One way an operator changes a cluster's settings row (recovery policy, drill policy, drill
budget): operators only, unknown fields refused, the row locked, validated by the model,
saved, and audited with the values before and after."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import models, transaction

from core.audit import audit_event_record
from core.errors import FieldError
from core.roles import is_operator
from core.types import User

Row = TypeVar("Row", bound=models.Model)


def cluster_settings_update(
    *,
    actor: User,
    model: type[Row],
    cluster: Any,
    fields: Sequence[str],
    values: dict[str, Any],
    action: str,
    what: str,
    prepare: Callable[[Row], None] | None = None,
    details: dict[str, Any] | None = None,
) -> Row:
    """Set ``values`` (each one of ``fields``) on ``cluster``'s ``model`` row, created with its
    defaults if missing. ``what`` names the settings in refusals ("drill budgets");
    ``prepare`` sets what follows from the new values before validation. Refused with the
    field and why (``FieldError``), or ``PermissionDenied`` for anyone but an operator."""
    if not is_operator(actor):
        raise PermissionDenied(f"Only operators may change {what}.")
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise FieldError(unknown[0], f"not a setting of {what}")
    with transaction.atomic():
        row, _ = model._default_manager.select_for_update().get_or_create(cluster=cluster)
        before = {key: getattr(row, key) for key in fields}
        for key, value in values.items():
            setattr(row, key, value)
        if prepare is not None:
            prepare(row)
        row.updated_by = actor  # type: ignore[attr-defined]
        try:
            row.full_clean()
        except ValidationError as error:
            name, messages = next(iter(error.message_dict.items()))
            raise FieldError(name, " ".join(messages)) from None
        row.save()
        after = {key: getattr(row, key) for key in fields}
        audit_event_record(
            actor=actor,
            action=action,
            target=row,
            details={**(details or {}), "before": before, "after": after},
        )
    return row
