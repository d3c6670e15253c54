"""ORM reads compiled once and run again with other values.

Compiling a small query (annotations, subqueries, a join) costs more Python than running it
on the database does: reading the signed-in user with both roles took 1.6 ms through the
ORM, of which 0.7 ms was compiling, against 0.4 ms for the round trip
(``bench/web_list_bench.py``'s database, PostgreSQL). Every page and API request reads who
asks, so the identity reads (``core.auth``, ``core.selectors.api_token_find_by_secret``)
compile theirs once per database.

A ``PreparedRead`` is built from an ORM queryset with a placeholder value (a sentinel) for
each input; the ORM writes the SQL, the parameters and the shape of its rows (columns,
``select_related`` models, annotations, each column's converters) once, and every call runs
that SQL with the sentinels replaced by the call's values, then builds the model objects as
the ORM's own iterable does. What is read, and how, stays the ORM's; nothing is formatted
into SQL (values are parameters, as the ORM passes them).

``int_literal``: a number in a grouped expression, for PostgreSQL's server-side binding.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, router
from django.db.models import IntegerField, Model, QuerySet
from django.db.models.expressions import RawSQL
from django.db.models.sql.compiler import SQLCompiler


@dataclass(frozen=True)
class _Compiled:
    sql: str
    params: tuple[Any, ...]
    # Input name -> the positions of its sentinel among the parameters.
    slots: dict[str, tuple[int, ...]]
    compiler: SQLCompiler
    converters: dict[int, Any]


class PreparedRead:
    """The first row of ``build(**sentinels)`` as a model object (its ``select_related``
    objects and annotations set), compiled once per database alias (and thread).

    ``sentinels``: one value per input, of the type the query's field takes, that no other
    parameter of the query can equal; each must appear among the compiled parameters (a
    ``ValueError`` at the first call says which one did not: a field that transforms its
    value before it becomes a parameter cannot take a sentinel)."""

    def __init__(self, build: Callable[..., QuerySet[Any]], **sentinels: Any) -> None:
        self._build = build
        self._sentinels = sentinels
        # Per thread, as database connections are: the converters are bound to one.
        self._local = threading.local()
        self._model: type[Model] | None = None

    def _compile(self) -> tuple[str, _Compiled]:
        mine: dict[str, _Compiled] = self._local.__dict__.setdefault("compiled", {})
        if self._model is not None:
            alias = router.db_for_read(self._model) or DEFAULT_DB_ALIAS
            compiled = mine.get(alias)
            if compiled is not None:
                return alias, compiled
        queryset = self._build(**self._sentinels)[:1]
        self._model = queryset.model
        alias = queryset.db
        compiler = queryset.query.get_compiler(using=alias)
        sql, params = compiler.as_sql()
        slots = {}
        for name, sentinel in self._sentinels.items():
            found = tuple(
                i for i, p in enumerate(params) if type(p) is type(sentinel) and p == sentinel
            )
            if not found:
                raise ValueError(f"{name}: its sentinel is not a parameter of the query")
            slots[name] = found
        columns = [column for column, _, _ in compiler.select]
        converters = compiler.get_converters(columns)
        compiled = _Compiled(sql, tuple(params), slots, compiler, converters)
        mine[alias] = compiled
        return alias, compiled

    def first(self, **values: Any) -> Any | None:
        if set(values) != set(self._sentinels):
            raise TypeError(f"values for {sorted(self._sentinels)}, got {sorted(values)}")
        alias, compiled = self._compile()
        params = list(compiled.params)
        for name, positions in compiled.slots.items():
            for position in positions:
                params[position] = values[name]
        with connections[alias].cursor() as cursor:
            cursor.execute(compiled.sql, params)
            row = cursor.fetchone()
        if row is None:
            return None
        if compiled.converters:
            row = next(iter(compiled.compiler.apply_converters([row], compiled.converters)))
        return _build_objects(alias, compiled.compiler, list(row))


def _build_objects(alias: str, compiler: SQLCompiler, row: list[Any]) -> Model:
    """The row's model object as ``ModelIterable`` builds it: its fields, then each
    ``select_related`` object (set both ways where the relation is one-to-one), then the
    annotations."""
    klass_info = compiler.klass_info
    assert klass_info is not None
    obj = _model_from_row(alias, compiler, klass_info, row)
    for name, position in compiler.annotation_col_map.items():
        setattr(obj, name, row[position])
    return obj


def _model_from_row(
    alias: str, compiler: SQLCompiler, klass_info: dict[str, Any], row: list[Any]
) -> Model:
    positions = klass_info["select_fields"]
    names = [compiler.select[i][0].target.attname for i in positions]
    obj = klass_info["model"].from_db(alias, names, [row[i] for i in positions])
    for related in klass_info.get("related_klass_infos", []):
        child: Model | None = _model_from_row(alias, compiler, related, row)
        if child is not None and child.pk is None:
            child = None  # a nullable relation that is not there
        related["local_setter"](obj, child)
        if child is not None:
            related["remote_setter"](child, obj)
    return obj


def int_literal(value: int) -> RawSQL:
    """``value`` written into the SQL as a number, not bound as a parameter. PostgreSQL
    binds values on the server (``controlplane.env``: prepared statements), where
    ``GROUP BY step / $2`` is not the ``step / $1`` the select list holds: an expression
    grouped on must carry its numbers in its text. ``int()`` first: nothing but digits
    (and a sign) reaches the SQL."""
    number = int(value)
    # Identifiers none, input none: the text is an integer's digits.
    return RawSQL(str(number), (), output_field=IntegerField())  # noqa: S611
