"""The job list page's rows: one page of jobs newest first, by keyset, checked against the
database with one narrow query and rendered only when its rows changed.

A page is the ``PAGE_SIZE`` jobs after a cursor (the last row of the page before: its
``created_at`` and id, newest first), read in the order of the ``(-created_at, id)`` and
``(owner, -created_at)`` indexes: its cost does not grow with how far back it is or with how
many jobs there are (no OFFSET, no COUNT). What a page shows of each job is first read as
row versions (``jobs.selectors.job_list_versions``): they give the page's ETag, and the key
under which its rendered rows are kept in ``core.cache``; only a page not seen before in
this minute (the Age column is in words) reads its jobs and renders them.
"""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db.models import Q, QuerySet

from core import cache
from core.errors import FieldError
from core.prepared import NO_INT, NO_TIME, NO_UUID, PreparedRead
from core.roles import is_operator, stand_in
from core.types import User
from jobs.models import Job
from jobs.selectors import job_list, job_list_versions

PAGE_SIZE = 50
# What the rows show besides the job's own row and what job_list_versions reads.
ALSO_SHOWN = ("parent__name",)


@dataclass(frozen=True)
class Cursor:
    """Where a page starts: after the job created at ``created_at`` with id ``job_id``."""

    created_at: datetime
    job_id: UUID

    def encode(self) -> str:
        text = f"{self.created_at.isoformat()}|{self.job_id}"
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        """The cursor ``text`` holds; FieldError for anything this page did not write."""
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
            created, _, job_id = raw.partition("|")
            cursor = cls(datetime.fromisoformat(created), UUID(job_id))
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise FieldError("cursor", "not a cursor of this list") from None
        if cursor.created_at.tzinfo is None:
            raise FieldError("cursor", "not a cursor of this list")
        return cursor


@dataclass(frozen=True)
class JobListPage:
    """One page: its row versions (in order), and the cursor of the next, older page."""

    versions: list[tuple[Any, ...]]
    ids: list[UUID]
    older: Cursor | None


def job_list_page_read(
    jobs: QuerySet[Job], *, cursor: Cursor | None, size: int = PAGE_SIZE
) -> JobListPage:
    """The page of ``jobs`` (a ``jobs.selectors.job_list``) after ``cursor``: one query."""
    if cursor is None:
        rows = list(_page_versions(jobs, size=size))
    else:
        rows = list(_page_versions(jobs, size=size, after=(cursor.created_at, cursor.job_id)))
    return _page(rows, size)


def job_list_page_read_unfiltered(
    *, user: User, mine: bool, cursor: Cursor | None, size: int = PAGE_SIZE
) -> JobListPage:
    """``job_list_page_read`` of ``job_list(user=user, mine=mine)``, the list as it opens
    (no filter but ``mine``): the read researchers make most, compiled once per role,
    ``mine`` and whether there is a cursor (``core.prepared``)."""
    operator = is_operator(user)
    after = None if cursor is None else (cursor.created_at, cursor.job_id)
    read = _unfiltered_read(operator, mine, after is not None, size)
    return _page(read.all(**_inputs(operator, mine, owner_id=user.pk, after=after)), size)


def _page_versions(
    jobs: QuerySet[Job], *, size: int, after: tuple[datetime, UUID] | None = None
) -> QuerySet[Job, dict[str, Any]]:
    """The row versions of ``jobs`` newest first, after ``after`` (a cursor's created_at
    and job id), one more than ``size`` (whether there is an older page)."""
    ordered = jobs.order_by("-created_at", "-id")
    if after is not None:
        created_at, job_id = after
        # The first condition is implied by the second; it is there for the planner, which
        # makes it the index range (the OR alone would be a filter over every newer row).
        ordered = ordered.filter(created_at__lte=created_at).filter(
            Q(created_at__lt=created_at) | Q(created_at=created_at, id__lt=job_id)
        )
    return job_list_versions(ordered, also=ALSO_SHOWN)[: size + 1]


def _inputs(
    operator: bool, mine: bool, *, owner_id: int, after: tuple[datetime, UUID] | None
) -> dict[str, Any]:
    """The inputs of the compiled read of this shape: the owner where the list keeps to
    one person's jobs, the cursor where there is one."""
    inputs: dict[str, Any] = {}
    if mine or not operator:
        inputs["owner_id"] = owner_id
    if after is not None:
        inputs.update(created_at=after[0], job_id=after[1])
    return inputs


@functools.cache
def _unfiltered_read(operator: bool, mine: bool, after: bool, size: int) -> PreparedRead:
    def build(
        owner_id: int = NO_INT, created_at: datetime = NO_TIME, job_id: UUID = NO_UUID
    ) -> QuerySet[Job, dict[str, Any]]:
        jobs = job_list(user=stand_in(operator=operator, pk=owner_id), mine=mine)
        return _page_versions(jobs, size=size, after=(created_at, job_id) if after else None)

    sentinels = _inputs(
        operator, mine, owner_id=NO_INT, after=(NO_TIME, NO_UUID) if after else None
    )
    return PreparedRead(build, **sentinels)


def _page(rows: list[dict[str, Any]], size: int) -> JobListPage:
    shown = rows[:size]
    older = None
    if len(rows) > size:
        last = shown[-1]
        older = Cursor(last["created_at"], last["id"])
    return JobListPage(
        versions=[tuple(row.values()) for row in shown],
        ids=[row["id"] for row in shown],
        older=older,
    )


def job_list_page_rows(
    page: JobListPage,
    jobs: Callable[[], QuerySet[Job]],
    *,
    minute: int,
    render: Callable[[list[Job]], str],
) -> str:
    """The page's rows rendered by ``render``, kept in ``core.cache`` under their versions
    and ``minute``: only a miss reads the jobs (``jobs()``, one query)."""

    def rows() -> str:
        listed = jobs().select_related("parent").filter(id__in=page.ids)
        found = {job.id: job for job in listed}
        return render([found[job_id] for job_id in page.ids if job_id in found])

    return cache.get_or_set(
        cache.JOB_LIST_PAGE, cache.key_job_list_page(rows=page.versions, minute=minute), rows
    )
