"""Sign-in: Django's model backend, loading a session's user with its roles in one query.

Every page and session-authenticated API call loads the signed-in user, then asks for
its roles (``core.access.RoleRequiredMiddleware``, the API's permission classes); here the
two group checks are subqueries of the query that loads the user (``core.roles``).

It is the one query every signed-in request runs, so its SQL is built once per process
from the models' metadata and sent as a raw query: building it with the ORM on each request
(annotations, subqueries) cost 1.5 ms of Python against 0.6 ms for the whole raw query
(PostgreSQL, same machine). The answer is the same: ``tests/core/test_auth_backend.py``.
An API call with a DRF authtoken reads its user the same way, in one query with the token
(``authtoken_user``, used by ``core.ratelimit.ThrottledTokenAuthentication``).
"""

from __future__ import annotations

import functools
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.db import connections
from django.db.models.expressions import Col
from rest_framework.authtoken.models import Token

from core.roles import OPERATORS, RESEARCHERS, remember_roles


@functools.cache
def _user_with_roles_sql(alias: str, *, by_token: bool = False) -> str:
    """SELECT the user's row and, per role, whether they are in its group (parameters:
    the two group names, then the user's primary key). ``by_token``: the user of a DRF
    authtoken, with the token's creation time as ``gantry_token_created`` (parameters:
    the group names, then the token's key)."""
    quote = connections[alias].ops.quote_name
    model = get_user_model()
    groups = model._meta.get_field("groups")
    through = groups.remote_field.through._meta.db_table  # type: ignore[union-attr]
    group_model = groups.related_model._meta  # type: ignore[union-attr]
    user_pk = quote(model._meta.pk.column)  # type: ignore[union-attr]
    # Only identifiers from the models' metadata, quoted; the values are parameters.
    member = (
        f"EXISTS(SELECT 1 FROM {quote(through)} m JOIN {quote(group_model.db_table)} g "  # noqa: S608
        f"ON g.{quote(group_model.pk.column)} = m.{quote(groups.m2m_reverse_name())} "  # type: ignore[attr-defined]
        f"WHERE m.{quote(groups.m2m_column_name())} = u.{user_pk} "  # type: ignore[attr-defined]
        f"AND g.{quote('name')} = %s)"
    )
    roles = (
        f"{member} AS {quote(f'gantry_in_{OPERATORS}')}, "
        f"{member} AS {quote(f'gantry_in_{RESEARCHERS}')}"
    )
    if not by_token:
        return (
            f"SELECT u.*, {roles} FROM {quote(model._meta.db_table)} u "  # noqa: S608
            f"WHERE u.{user_pk} = %s"
        )
    token = Token._meta
    token_user = token.get_field("user")
    return (
        f"SELECT u.*, {roles}, t.{quote(token.get_field('created').column)} "  # noqa: S608
        f"AS {quote('gantry_token_created')} FROM {quote(token.db_table)} t "
        f"JOIN {quote(model._meta.db_table)} u ON u.{user_pk} = t.{quote(token_user.column)} "
        f"WHERE t.{quote(token.pk.column)} = %s"  # type: ignore[union-attr]
    )


def authtoken_user(key: str) -> tuple[Any, Token] | None:
    """The user of DRF authtoken ``key`` with their roles remembered, and the token; None
    when no token has this key. One query, as for a session's user."""
    model = get_user_model()
    manager = model._default_manager
    sql = _user_with_roles_sql(manager.db, by_token=True)
    rows = list(manager.raw(sql, [OPERATORS, RESEARCHERS, key]))
    if not rows:
        return None
    user = remember_roles(rows[0], rows[0])
    raw_created = rows[0].gantry_token_created  # type: ignore[attr-defined]
    created = _from_db(Token._meta.get_field("created"), raw_created, manager.db)
    token = Token(key=key, user_id=user.pk, created=created)
    # The token's user is the row just read: no second query for it.
    token.user = user
    return user, token


def _from_db(field: Any, value: Any, alias: str) -> Any:
    """``value`` of ``field`` as the ORM would have read it (a raw query's extra column
    gets no converters: SQLite's datetimes would stay naive)."""
    connection = connections[alias]
    column = Col(field.model._meta.db_table, field)
    for converter in connection.ops.get_db_converters(column) + field.get_db_converters(connection):
        value = converter(value, column, connection)
    return value


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
