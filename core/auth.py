"""Sign-in: Django's model backend, loading a session's user with its roles in one query.

Every page and session-authenticated API call loads the signed-in user, then asks for
its roles (``core.access.RoleRequiredMiddleware``, the API's permission classes); here the
two group checks are subqueries of the query that loads the user (``core.roles``), so a
role check costs no query of its own. An API call with a token reads its user the same way,
in one query with the token (``core.selectors.api_token_find_by_secret``).

Both are ORM queries with annotations, compiled once (``core.prepared``): compiling them
cost more than running them, on every request (issue 30's first views). The ORM still
writes the SQL and builds the objects. ``tests/core/test_auth_backend.py`` holds each to
one query, with the same user as the ORM reads.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import ValidationError

from core.prepared import NO_INT, PreparedRead
from core.roles import remember_roles, role_annotations


def _user_with_roles(user_id: int) -> Any:
    return get_user_model()._default_manager.annotate(**role_annotations("pk")).filter(pk=user_id)


_USER_WITH_ROLES = PreparedRead(_user_with_roles, user_id=NO_INT)


class RoleAwareModelBackend(ModelBackend):
    def get_user(self, user_id: Any) -> Any:
        model = get_user_model()
        try:
            pk = model._meta.pk.to_python(user_id)  # type: ignore[union-attr]
        except ValidationError:
            return None
        # A user model keyed by anything but an integer is read without the compiled query.
        user = (
            _USER_WITH_ROLES.first(user_id=pk)
            if isinstance(pk, int)
            else _user_with_roles(pk).first()
        )
        if user is None:
            return None
        remember_roles(user, user)
        return user if self.user_can_authenticate(user) else None
