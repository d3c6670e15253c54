"""Moving a model to another app keeps its permissions and their grants (for migrations)."""

from __future__ import annotations

from typing import Any


def move_content_types(apps: Any, old_label: str, new_label: str, models: list[str]) -> None:
    """Relabel the content types of ``models`` from ``old_label`` to ``new_label``, so the
    permissions on them keep their ids and grants. When the new one exists already (a
    partial migrate created it), the grants move over to its permissions instead."""
    content_type_model = apps.get_model("contenttypes", "ContentType")
    permission_model = apps.get_model("auth", "Permission")
    for model in models:
        old = content_type_model.objects.filter(app_label=old_label, model=model).first()
        if old is None:
            continue
        new = content_type_model.objects.filter(app_label=new_label, model=model).first()
        if new is None:
            old.app_label = new_label
            old.save(update_fields=["app_label"])
            continue
        for permission in permission_model.objects.filter(content_type=old):
            target = permission_model.objects.filter(
                content_type=new, codename=permission.codename
            ).first()
            if target is None:
                permission.content_type = new
                permission.save(update_fields=["content_type"])
                continue
            for group in permission.group_set.all():
                group.permissions.add(target)
            for user in permission.user_set.all():
                user.user_permissions.add(target)
            permission.delete()
        old.delete()
