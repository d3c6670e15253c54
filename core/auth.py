"""Sign-in: Django's model backend, loading a session's user with its roles in one query.

Every page and session-authenticated API call loads the signed-in user, then asks for
its roles (``core.access.RoleRequiredMiddleware``, the API's permission classes); here the
two group checks are subqueries of the query that loads the user (``core.roles``), so a
role check costs no query of its own. An API call with a token reads its user the same way,
in one query with the token (``core.selectors.api_token_find_by_secret``).

Both are ORM queries with annotations. Raw SQL built once from the models' metadata was
cheaper in Python per request, but the web bench's target (capacity, bench/README.md) does
not need that saving, and one way of reading a user is easier to keep right than two.
``tests/core/test_auth_backend.py`` holds each to one query.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend

from core.roles import remember_roles, role_annotations


class RoleAwareModelBackend(ModelBackend):
    def get_user(self, user_id: Any) -> Any:
        model = get_user_model()
        user = (
            model._default_manager.annotate(**role_annotations("pk"))
            .filter(pk=model._meta.pk.to_python(user_id))  # type: ignore[union-attr]
            .first()
        )
        if user is None:
            return None
        remember_roles(user, user)
        return user if self.user_can_authenticate(user) else None
