"""ORM reads compiled once and run again with other values.

Compiling a small query (annotations, subqueries, a join) costs more Python than running it
on the database does: reading the signed-in user with both roles took 1.6 ms through the
ORM, of which 0.7 ms was compiling, against 0.4 ms for the round trip
(``bench/web_list_bench.py``'s database, PostgreSQL). Every page and API request reads who
asks, so the identity reads (``core.auth``, ``core.selectors.api_token_find_by_secret``)
compile theirs once per database; so do the reads every job page, poll and job API call
makes (``jobs.selectors.JobReadForUser``: the job as its reader may see it, and its page's
version; ``jobs.page_versions``: its timeline, checkpoints and resumed jobs) and the job
list as it opens (``jobs.list_page``): together they took the job page from 10 to 6 ms.

A ``PreparedRead`` is built from an ORM queryset with a placeholder value (a sentinel) for
each input; the ORM writes the SQL, the parameters and the shape of its rows (columns,
``select_related`` models, annotations, each column's converters) once, and every call runs
that SQL with the sentinels replaced by the call's values, then builds the rows as the ORM's
own iterable does (model objects, ``values()`` dicts, ``values_list()`` tuples). What is
read, and how, stays the ORM's; nothing is formatted into SQL (values are parameters, as
the ORM passes them).

``int_literal``: a number in a grouped expression, for PostgreSQL's server-side binding.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from django.db import DEFAULT_DB_ALIAS, connections, router
from django.db.models import IntegerField, Model, QuerySet
from django.db.models.expressions import RawSQL
from django.db.models.query import (
    FlatValuesListIterable,
    ModelIterable,
    ValuesIterable,
    ValuesListIterable,
)
from django.db.models.sql.compiler import SQLCompiler

# Sentinels no row holds (ids are positive; Gantry's UUIDs are uuid4, whose version digit is
# 4, this one's 0; no time is this far back), one per type: they mark where a value goes in
# the compiled SQL. Two inputs of one type in one read need sentinels of their own.
NO_INT = -(2**31) + 7
NO_UUID = UUID("00000000-0000-0000-0000-00000000a0b5")
NO_TIME = datetime(1901, 2, 3, 4, 5, 6, 789012, tzinfo=UTC)


@dataclass(frozen=True)
class _Compiled:
    sql: str
    params: tuple[Any, ...]
    # Input name -> the positions of its sentinel among the parameters, and how a value
    # becomes the parameter there (as the field prepared the sentinel).
    slots: dict[str, tuple[tuple[int, ...], Callable[[Any], Any]]]
    compiler: SQLCompiler
    converters: dict[int, Any]
    # Builds one result from a converted row: a model object, a dict, a tuple, a value.
    build: Callable[[list[Any]], Any]


def _as_is(value: Any) -> Any:
    return value


def _uuid(value: Any) -> UUID:
    return value if isinstance(value, UUID) else UUID(str(value))


def _hex(value: Any) -> str:
    return _uuid(value).hex


def _slot(
    params: list[Any], sentinel: Any, alias: str
) -> tuple[tuple[int, ...], Callable[[Any], Any]]:
    """Where ``sentinel`` sits among ``params`` and how a value is prepared as it was: as
    it is; a UUID as the database takes one (a native uuid; 32 hex digits on SQLite); a
    datetime as the backend adapts one (as it is on PostgreSQL, text in UTC on SQLite)."""
    ways: list[tuple[Any, Callable[[Any], Any]]] = [(sentinel, _as_is)]
    if isinstance(sentinel, UUID):
        ways = [(sentinel, _uuid), (sentinel.hex, _hex)]
    elif isinstance(sentinel, datetime):
        adapt = connections[alias].ops.adapt_datetimefield_value
        ways = [(adapt(sentinel), adapt)]
    for prepared, way in ways:
        found = tuple(
            i for i, p in enumerate(params) if type(p) is type(prepared) and p == prepared
        )
        if found:
            return found, way
    return (), _as_is


class PreparedRead:
    """``build(**sentinels)`` compiled once per database alias (and thread): ``first``
    answers its first row, ``all`` every row, as the ORM's own iteration of that queryset
    would (model objects with their ``select_related`` objects and annotations set; the
    dicts of ``values()``; the tuples or values of ``values_list()``).

    ``sentinels``: one value per input, of the type the query's field takes, that no other
    parameter of the query can equal; each must appear among the compiled parameters (a
    ``ValueError`` at the first call says which one did not: a field that transforms its
    value before it becomes a parameter cannot take a sentinel, except a UUID or a time,
    which are passed as the database takes them). A queryset that prefetches is refused: its other
    queries would not be compiled once."""

    def __init__(self, build: Callable[..., QuerySet[Any]], **sentinels: Any) -> None:
        self._build = build
        self._sentinels = sentinels
        # Per thread, as database connections are: the converters are bound to one.
        self._local = threading.local()
        self._model: type[Model] | None = None

    def _compile(self, *, one: bool) -> tuple[str, _Compiled]:
        mine: dict[tuple[str, bool], _Compiled] = self._local.__dict__.setdefault("compiled", {})
        if self._model is not None:
            alias = router.db_for_read(self._model) or DEFAULT_DB_ALIAS
            compiled = mine.get((alias, one))
            if compiled is not None:
                return alias, compiled
        queryset = self._build(**self._sentinels)
        if getattr(queryset, "_prefetch_related_lookups", ()):
            raise TypeError("a prepared read cannot prefetch: run its other queries apart")
        if one:
            queryset = queryset[:1]
        self._model = queryset.model
        alias = queryset.db
        compiler = queryset.query.get_compiler(using=alias)
        sql, params = compiler.as_sql()
        slots = {}
        for name, sentinel in self._sentinels.items():
            found, way = _slot(list(params), sentinel, alias)
            if not found:
                raise ValueError(f"{name}: its sentinel is not a parameter of the query")
            slots[name] = (found, way)
        columns = [column for column, _, _ in compiler.select[: compiler.col_count]]
        converters = compiler.get_converters(columns)
        build = _row_builder(queryset, alias, compiler)
        compiled = _Compiled(sql, tuple(params), slots, compiler, converters, build)
        mine[(alias, one)] = compiled
        return alias, compiled

    def _run(self, *, one: bool, values: dict[str, Any]) -> list[Any]:
        if set(values) != set(self._sentinels):
            raise TypeError(f"values for {sorted(self._sentinels)}, got {sorted(values)}")
        alias, compiled = self._compile(one=one)
        params = list(compiled.params)
        for name, (positions, way) in compiled.slots.items():
            value = way(values[name])
            for position in positions:
                params[position] = value
        with connections[alias].cursor() as cursor:
            cursor.execute(compiled.sql, params)
            rows = cursor.fetchall()
        count = compiled.compiler.col_count
        if compiled.compiler.has_extra_select:
            rows = [row[:count] for row in rows]
        if compiled.converters:
            rows = list(compiled.compiler.apply_converters(rows, compiled.converters))
        return [compiled.build(list(row)) for row in rows]

    def first(self, **values: Any) -> Any | None:
        """The first row for ``values``, or None."""
        found = self._run(one=True, values=values)
        return found[0] if found else None

    def all(self, **values: Any) -> list[Any]:
        """Every row for ``values``, in the queryset's order."""
        return self._run(one=False, values=values)


def _row_builder(
    queryset: QuerySet[Any], alias: str, compiler: SQLCompiler
) -> Callable[[list[Any]], Any]:
    """What the queryset's own iterable makes of a row (``django.db.models.query``)."""
    iterable = queryset._iterable_class
    if iterable is ModelIterable:
        return lambda row: _build_objects(alias, compiler, row)
    query = queryset.query
    names = (
        list(query.selected)
        if query.selected
        else [*query.extra_select, *query.values_select, *query.annotation_select]
    )
    if iterable is ValuesIterable:
        return lambda row: dict(zip(names, row, strict=True))
    if iterable is ValuesListIterable:
        return tuple
    if iterable is FlatValuesListIterable:
        return lambda row: row[0]
    raise TypeError(f"a prepared read cannot build {iterable.__name__} rows")


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
