"""What the job page and its polled header are rendered from, as one digest the database
computes: a poll whose copy is current is answered ``304`` after one narrow query, without
reading the job, its timeline and its checkpoints into Python and rendering them.

The header (``jobs.views.pages._job_live_context``) shows the job's row, its cluster's name, its
timeline and its checkpoints; the page adds the owner's name and the jobs resumed from it.
``job_version`` reads, for a job the user may see (``job_list_for_user``: the one access
rule), an md5 of exactly those rows and columns (the same ones ``jobs.views.pages._job_state``
hashes in Python), plus the few fields the caller needs to judge the rest. The ETag built
from it changes whenever the rendered part could (``tests/jobs/test_page_versions.py``
changes each column and checks).

PostgreSQL only (a whole-row reference turned into text); on SQLite ``job_version`` answers
None and the views compute their ETag from what they render, as before. The SQL is built
once per process from the models' metadata (identifiers quoted, no values in it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.db import connections
from django.db.models.expressions import RawSQL

from jobs.models import Checkpoint, Job, JobEvent
from jobs.selectors import job_list_for_user, job_one

# What the header shows of each timeline entry and checkpoint (``jobs.views.pages._job_state``
# reads the same columns). A checkpoint's manifest is shown only as its strategy.
EVENT_FIELDS = ("id", "at", "kind", "to_state", "message")
CHECKPOINT_FIELDS = (
    "id",
    "step",
    "size_bytes",
    "file_count",
    "world_size",
    "state_keys",
    "integrity",
    "integrity_detail",
    "last_proven_at",
    "deleted_at",
    "saved_at",
)


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


def job_version(*, user: Any, job_id: UUID | str, page: bool = False) -> JobVersion | None:
    """The version of job ``job_id``'s header (``page``: of its whole page) for ``user``.

    Raises Http404 like ``job_get_for_user`` (a missing job and someone else's alike);
    None where the database cannot compute it (not PostgreSQL)."""
    jobs = job_list_for_user(user=user)
    if connections[jobs.db].vendor != "postgresql":
        return None
    row = job_one(
        jobs
        # Identifiers from the models' metadata only, no values (see _digest_sql).
        .annotate(gantry_version=RawSQL(_digest_sql(jobs.db, page=page), ())).values_list(  # noqa: S611
            "gantry_version",
            "state",
            "owner_id",
            "allocated_nodes",
            "nodelist_requested",
            "switches_requested",
            "id",
        ),
        job_id,
    )
    return JobVersion(*row)


def _column(model: Any, name: str) -> str:
    """The database column of ``model``'s field ``name`` (a concrete field)."""
    column = getattr(model._meta.get_field(name), "column", None)
    if not isinstance(column, str):
        raise TypeError(f"{model.__name__}.{name} has no column")
    return column


@functools.cache
def _digest_sql(alias: str, *, page: bool) -> str:
    """``md5`` of one row constructor: the job's whole row, its cluster's name, its
    timeline and checkpoints (the header's columns, in id order) and, for the page, what
    its script is made from (the cluster's work directory and Python, the checkpoint it
    resumes), its owner's and its parent's names and the whole rows of the jobs resumed
    from it. Identifiers only, from the models' metadata and quoted."""
    quote = connections[alias].ops.quote_name
    this = quote(Job._meta.db_table)
    job_pk = f"{this}.{quote(_column(Job, 'id'))}"

    def rows_of(model: Any, fields: tuple[str, ...], extra: str = "") -> str:
        """The job's rows of ``model`` (these columns), in id order."""
        columns = [f"r.{quote(_column(model, name))}" for name in fields]
        return (
            f"(SELECT string_agg(ROW({', '.join([*columns, extra] if extra else columns)})"  # noqa: S608
            f"::text, ',' ORDER BY r.{quote(_column(model, 'id'))}) "
            f"FROM {quote(model._meta.db_table)} r "
            f"WHERE r.{quote(_column(model, 'job'))} = {job_pk})"
        )

    def related(field: str, *columns: str) -> str:
        """Columns of the row the job's ``field`` points at (NULL when none)."""
        target = Job._meta.get_field(field).related_model
        named = ", ".join(f"o.{quote(_column(target, name))}" for name in columns)
        return (
            f"(SELECT ROW({named})::text FROM {quote(target._meta.db_table)} o "  # type: ignore[union-attr]  # noqa: S608
            f"WHERE o.{quote(_column(target, 'id'))} = {this}.{quote(_column(Job, field))})"
        )

    strategy = f"r.{quote(_column(Checkpoint, 'manifest'))} ->> 'strategy'"
    parts = [
        f"{this}.*",
        related("cluster", "name"),
        rows_of(JobEvent, EVENT_FIELDS),
        rows_of(Checkpoint, CHECKPOINT_FIELDS, strategy),
    ]
    if page:
        parts += [
            # The page's script runs the cluster's Python in its work directory.
            related("cluster", "workdir", "python"),
            related("owner", "username"),
            related("parent", "name"),
            related("resume_from", "step", "path"),
            # The jobs resumed from this one, whole.
            f"(SELECT string_agg(r::text, ',' ORDER BY r.{quote(_column(Job, 'id'))}) "  # noqa: S608
            f"FROM {this} r WHERE r.{quote(_column(Job, 'parent'))} = {job_pk})",
        ]
    return f"md5(ROW({', '.join(parts)})::text)"
