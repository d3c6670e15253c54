"""Sign-in: Django's model backend, loading a session's user with its roles in one query.

Every page and session-authenticated API call loads the signed-in user, then asks for
its roles (``core.access.RoleRequiredMiddleware``, the API's permission classes); here the
two group checks are subqueries of the query that loads the user (``core.roles``).

It is the one query every signed-in request runs, so its SQL is built once per process
from the models' metadata and sent as a raw query: building it with the ORM on each request
(annotations, subqueries) cost 1.5 ms of Python against 0.6 ms for the whole raw query
(PostgreSQL, same machine). The answer is the same: ``tests/core/test_auth_backend.py``.
"""

from __future__ import annotations

import functools
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.db import connections

from core.roles import OPERATORS, RESEARCHERS, remember_roles


@functools.cache
def _user_with_roles_sql(alias: str) -> str:
    """SELECT the user's row and, per role, whether they are in its group (parameters:
    the two group names, then the user's primary key)."""
    quote = connections[alias].ops.quote_name
    model = get_user_model()
    groups = model._meta.get_field("groups")
    through = groups.remote_field.through._meta.db_table  # type: ignore[union-attr]
    group_model = groups.related_model._meta  # type: ignore[union-attr]
    # Only identifiers from the models' metadata, quoted; the values are parameters.
    member = (
        f"EXISTS(SELECT 1 FROM {quote(through)} m JOIN {quote(group_model.db_table)} g "  # noqa: S608
        f"ON g.{quote(group_model.pk.column)} = m.{quote(groups.m2m_reverse_name())} "  # type: ignore[attr-defined]
        f"WHERE m.{quote(groups.m2m_column_name())} = u.{quote(model._meta.pk.column)} "  # type: ignore[attr-defined]
        f"AND g.{quote('name')} = %s)"
    )
    return (
        f"SELECT u.*, {member} AS {quote(f'gantry_in_{OPERATORS}')}, "  # noqa: S608
        f"{member} AS {quote(f'gantry_in_{RESEARCHERS}')} "
        f"FROM {quote(model._meta.db_table)} u WHERE u.{quote(model._meta.pk.column)} = %s"
    )


class RoleAwareModelBackend(ModelBackend):
    def get_user(self, user_id: Any) -> Any:
        model = get_user_model()
        manager = model._default_manager
        key = model._meta.pk.to_python(user_id)
        rows = list(manager.raw(_user_with_roles_sql(manager.db), [OPERATORS, RESEARCHERS, key]))
        if not rows:
            return None
        user = rows[0]
        remember_roles(user, user)
        return user if self.user_can_authenticate(user) else None
