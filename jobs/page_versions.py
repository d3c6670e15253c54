"""What the job page and its polled header show from the database, declared once
(``JOB_PAGE_SHOWS``), and the three things made from that declaration:

- ``job_page_rows``: the rows and fields the views render from;
- ``job_page_state``: those values in Python, for ETags and cache keys where the database
  computes no digest (SQLite);
- ``job_version``: an md5 PostgreSQL computes of the same rows and columns, so that a poll
  whose copy is current is answered ``304`` after one narrow query, without reading the
  job, its timeline and its checkpoints into Python and rendering them.

``job_version`` reads, for a job the user may see (``job_list_for_user``: the one access
rule), that digest plus the few fields the caller needs to judge the rest. On SQLite it
answers None and the views compute their ETag from ``job_page_state``. The SQL is built
once per process from the declaration and the models' metadata (quoted identifiers, JSON
keys as parameters, no values in it). ``tests/jobs/test_page_versions.py`` changes every
declared field and checks that both digests move, and renders the templates to check that
they read nothing undeclared.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from uuid import UUID

from django.db import connections
from django.db.models import Field, ForeignKey, ForeignObject, ManyToOneRel, Model, QuerySet
from django.db.models.expressions import RawSQL
from django.db.models.fields.json import KeyTextTransform

from core.prepared import NO_UUID, PreparedRead
from core.types import User
from jobs.models import Checkpoint, Job, JobEvent
from jobs.selectors import JobReadForUser, job_list_for_user
from nodes.models import Cluster


def _field(model: type[Model], name: str) -> Field[Any, Any]:
    """``model``'s concrete field ``name``."""
    field = model._meta.get_field(name)
    if not isinstance(field, Field) or not field.concrete:
        raise TypeError(f"{model.__name__}.{name} is not a column")
    return field


@dataclass(frozen=True)
class Shown:
    """Rows of ``model`` that the job page shows, and which of their fields.

    ``relation`` says how the rows hang off the job: ``""`` is the job's own row; a foreign
    key of the job (``"cluster"``) is the one row it points at, or none; the related name of
    a foreign key to the job (``"events"``) is every row pointing at it, listed in
    ``order``. ``fields`` are field names, or ``"__all__"`` for every concrete field (a
    column added later included); ``"manifest__strategy"`` is one key of a JSON field, read
    as the attribute ``manifest_strategy``. ``page``: shown on the whole page only, not in
    its polled header.
    """

    model: type[Model]
    fields: tuple[str, ...] | Literal["__all__"]
    relation: str = ""
    order: tuple[str, ...] = ()
    page: bool = False

    def __post_init__(self) -> None:
        # A misspelt field or relation fails when the module is imported, not in a poll.
        related = Job._meta.get_field(self.relation).related_model if self.relation else Job
        if related is not self.model:
            raise TypeError(f"Job.{self.relation} holds {related}, not {self.model.__name__}")
        for name in self.names:
            _field(self.model, name.partition("__")[0])

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        """The declared fields, ``"__all__"`` spelt out."""
        if isinstance(self.fields, str):
            return tuple(field.name for field in self.model._meta.concrete_fields)
        return self.fields

    @functools.cached_property
    def attributes(self) -> tuple[str, ...]:
        """Where a row read by ``job_page_rows`` holds each of ``names``."""
        return tuple(
            f"{field}_{key}" if key else _field(self.model, field).attname
            for field, _, key in (name.partition("__") for name in self.names)
        )


# Where does a new field on the job page go? Here, and nowhere else. Everything the job's
# polled header (jobs/_job_status.html) and its page (jobs/job_detail.html) show from the
# database is declared in this tuple: the views render from the rows and fields it names
# (``job_page_rows``), their ETags hash them (``job_page_state``) and PostgreSQL digests
# them to answer a poll 304 (``job_version``). tests/jobs/test_page_versions.py changes
# every field declared here and checks that the version moves, and fails when a template
# shows a field that is not declared here.
JOB_PAGE_SHOWS: tuple[Shown, ...] = (
    # The job's own row, every column.
    Shown(Job, "__all__"),
    Shown(Cluster, ("name",), relation="cluster"),
    Shown(
        JobEvent, ("id", "at", "kind", "to_state", "message"), relation="events", order=("at", "id")
    ),
    # A checkpoint's manifest is shown only as its strategy (sharded or not).
    Shown(
        Checkpoint,
        (
            "id",
            "step",
            "size_bytes",
            "file_count",
            "world_size",
            "state_keys",
            "integrity",
            "integrity_detail",
            "last_proven_at",
            "state_proven_at",
            "deleted_at",
            "saved_at",
            "manifest__strategy",
        ),
        relation="checkpoints",
        order=("-step",),
    ),
    # The whole page's sbatch script runs the cluster's Python in its work directory and
    # resumes from a checkpoint's path.
    Shown(Cluster, ("workdir", "python"), relation="cluster", page=True),
    Shown(User, (User.USERNAME_FIELD,), relation="owner", page=True),
    Shown(Job, ("name",), relation="parent", page=True),
    # The script holds the resume to the registered manifest's digest; the stack notice
    # compares the manifest's versions with the job's.
    Shown(
        Checkpoint,
        ("step", "path", "manifest_digest", "manifest"),
        relation="resume_from",
        page=True,
    ),
    # The jobs resumed from this one, whole.
    Shown(Job, "__all__", relation="children", order=("-created_at",), page=True),
)


def shown_on(*, page: bool) -> tuple[Shown, ...]:
    """What the header (``page``: the whole page) shows."""
    return tuple(shown for shown in JOB_PAGE_SHOWS if page or not shown.page)


@dataclass(frozen=True)
class ShownRows:
    """What ``job_page_rows`` read: the rows of each declared entry."""

    rows: dict[Shown, list[Any]]

    def of(self, relation: str) -> list[Any]:
        """The rows of ``relation`` (``"events"``, ``"children"``...)."""
        for shown, rows in self.rows.items():
            if shown.relation == relation:
                return rows
        raise KeyError(f"{relation!r} was not read (is it shown on the page only?)")


def job_page_rows(*, job: Job, page: bool = False) -> ShownRows:
    """What the job's header (``page``: its whole page) shows, read as ``JOB_PAGE_SHOWS``
    declares it: ``job`` itself as it was read, a related row read with it
    (``select_related``) as it is, any other related or listed row with just its declared
    fields, in the declared order: a query per relation not read with the job."""
    entries = shown_on(page=page)
    read = {
        relation: _read(job, [shown for shown in entries if shown.relation == relation])
        for relation in dict.fromkeys(shown.relation for shown in entries)
    }
    return ShownRows({shown: read[shown.relation] for shown in entries})


def _read(job: Job, entries: list[Shown]) -> list[Any]:
    """The rows of the job's relation ``entries`` declare (all the same relation)."""
    relation, model = entries[0].relation, entries[0].model
    if not relation:
        return [job]
    field = Job._meta.get_field(relation)
    if isinstance(field, ForeignKey):
        target = getattr(job, field.attname)
        if target is None:
            return []
        if not field.is_cached(job):
            # Just the declared fields: a template that reads another one costs a query.
            plain, keys = _declared(entries)
            rows = model._default_manager.annotate(**keys).only(*plain)
            field.set_cached_value(job, rows.get(**{field.target_field.attname: target}))
        return [getattr(job, field.name)]
    if not isinstance(field, ManyToOneRel):
        raise TypeError(f"Job.{relation} is neither a foreign key nor one to the job")
    rows = _listed_read(tuple(entries), field.field).all(job_id=job.pk)
    for row in rows:
        field.field.set_cached_value(row, job)  # as the related manager sets it
    return rows


def _declared(entries: Sequence[Shown]) -> tuple[list[str], dict[str, KeyTextTransform]]:
    """The columns ``entries`` declare, and the JSON keys they read as annotations."""
    names = dict.fromkeys(name for shown in entries for name in shown.names)
    plain = [name for name in names if "__" not in name]
    keys = {
        f"{field}_{key}": KeyTextTransform(key, field)
        for field, _, key in (name.partition("__") for name in names)
        if key
    }
    return plain, keys


@functools.cache
def _listed_read(entries: tuple[Shown, ...], back: ForeignObject[Any, Any]) -> PreparedRead:
    """The rows pointing at a job (by ``back``) that ``entries`` declare, with just their
    declared fields and their key back to the job, compiled once (``core.prepared``): the
    job page reads three such lists on every full view."""
    model = entries[0].model
    plain, keys = _declared(entries)

    def build(job_id: UUID) -> QuerySet[Any]:
        listed = model._default_manager.filter(**{back.attname: job_id})
        if not any(isinstance(shown.fields, str) for shown in entries):
            listed = listed.only(*plain, back.name)
        return listed.annotate(**keys).order_by(*entries[0].order)

    return PreparedRead(build, job_id=NO_UUID)


def job_page_state(shown: ShownRows, *, page: bool = False) -> list[list[tuple[Any, ...]]]:
    """The values ``shown`` holds of what the header shows (``page``: of all it holds):
    the Python twin of the digest ``job_version`` reads, for ETags and cache keys where
    the database computes none."""
    return [
        [tuple(getattr(row, attribute) for attribute in entry.attributes) for row in rows]
        for entry, rows in shown.rows.items()
        if page or not entry.page
    ]


@dataclass(frozen=True)
class JobVersion:
    """The digest of what a job's header (or page) is rendered from, and what the caller
    needs beside it: the state (a pending job's queue position depends on other jobs),
    the owner (who may act) and the allocation (the placement verdict's key)."""

    digest: str
    state: str
    owner_id: int
    allocated_nodes: str
    nodelist_requested: str
    switches_requested: str
    job_id: UUID


def job_version(*, user: User, job_id: UUID | str, page: bool = False) -> JobVersion | None:
    """The version of job ``job_id``'s header (``page``: of its whole page) for ``user``.

    Raises Http404 like ``job_get_for_user`` (a missing job and someone else's alike);
    None where the database cannot compute it (not PostgreSQL)."""
    jobs = job_list_for_user(user=user)
    if connections[jobs.db].vendor != "postgresql":
        return None
    row = _VERSION_READS[page].one(user=user, job_id=job_id)
    return JobVersion(*row)


def _with_version(jobs: QuerySet[Job], *, page: bool) -> QuerySet[Any]:
    """``jobs`` as the rows ``job_version`` reads: the digest, then ``JobVersion``'s fields."""
    sql, params = _digest_sql(jobs.db, page=page)
    # Identifiers from the models' metadata only, values as parameters (see _digest_sql).
    return jobs.annotate(gantry_version=RawSQL(sql, params)).values_list(  # noqa: S611
        "gantry_version",
        "state",
        "owner_id",
        "allocated_nodes",
        "nodelist_requested",
        "switches_requested",
        "id",
    )


# Compiled once per role and kind (``core.prepared``): every poll reads one.
_VERSION_READS = {
    page: JobReadForUser(functools.partial(_with_version, page=page)) for page in (False, True)
}


@functools.cache
def _digest_sql(alias: str, *, page: bool) -> tuple[str, tuple[str, ...]]:
    """``md5`` of one row constructor of what ``shown_on(page=page)`` declares, and its
    parameters (the JSON keys). Identifiers only, from the models' metadata and quoted."""
    quote = connections[alias].ops.quote_name
    parts: list[str] = []
    params: list[str] = []
    for shown in shown_on(page=page):
        part, keys = _shown_sql(shown, quote)
        parts.append(part)
        params += keys
    return f"md5(ROW({', '.join(parts)})::text)", tuple(params)


def _shown_sql(shown: Shown, quote: Callable[[str], str]) -> tuple[str, list[str]]:
    """The SQL of what ``shown`` declares, for the job row of the outer query, and the JSON
    keys it reads (its parameters, in order)."""
    this = quote(Job._meta.db_table)
    prefix = "r" if shown.relation else this
    columns: list[str] = []
    keys: list[str] = []
    for field, _, key in (name.partition("__") for name in shown.names):
        column = f"{prefix}.{quote(_field(shown.model, field).column)}"
        columns.append(f"{column} ->> %s" if key else column)
        keys += [key] if key else []
    row = f"ROW({', '.join(columns)})"
    table = quote(shown.model._meta.db_table)
    relation = Job._meta.get_field(shown.relation) if shown.relation else None
    if relation is None:
        return row, keys
    if isinstance(relation, ForeignKey):
        # The one row the job's key points at (NULL when none).
        return (
            f"(SELECT {row}::text FROM {table} r "  # noqa: S608
            f"WHERE r.{quote(relation.target_field.column)} = {this}.{quote(relation.column)})"
        ), keys
    if not isinstance(relation, ManyToOneRel):
        raise TypeError(f"Job.{shown.relation} is neither a foreign key nor one to the job")
    # Every row whose key points at the job, in id order.
    back = relation.field
    pk = quote(_field(shown.model, shown.model._meta.pk.name).column)
    return (
        f"(SELECT string_agg({row}::text, ',' ORDER BY r.{pk}) FROM {table} r "  # noqa: S608
        f"WHERE r.{quote(back.column)} = {this}.{quote(back.target_field.column)})"
    ), keys
