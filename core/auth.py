"""Sign-in: Django's model backend, loading a session's user with its roles in one query.

Every page and session-authenticated API call loads the signed-in user, then asks for
its roles (``core.access.RoleRequiredMiddleware``, the API's permission classes); here the
two group checks are subqueries of the query that loads the user (``core.roles``).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend

from core.roles import remember_roles, role_annotations


class RoleAwareModelBackend(ModelBackend):
    def get_user(self, user_id: Any) -> Any:
        model = get_user_model()
        try:
            user = model._default_manager.annotate(**role_annotations("pk")).get(pk=user_id)
        except model.DoesNotExist:
            return None
        remember_roles(user, user)
        return user if self.user_can_authenticate(user) else None
