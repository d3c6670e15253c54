"""The job page's version (``jobs.page_versions``): what the header and the page show from
the database is declared once (``JOB_PAGE_SHOWS``); the views render from it, hash it in
Python and PostgreSQL digests it. A poll is answered 304 from that digest, so it must change
whenever anything shown changes and only then, and it must keep the one access rule.

The tests here are generated from the declaration: every declared field is changed and both
digests must move; the templates are rendered and must read no field it does not declare.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.db import connection
from django.db.models import Model
from django.http import Http404
from django.template import engines
from django.template.loader import get_template
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core.conditional import etag_for
from factories import CheckpointFactory, ClusterFactory, JobFactory, UserFactory
from jobs.models import Checkpoint, Job, JobEvent, MetricPoint
from jobs.page_versions import JOB_PAGE_SHOWS, Shown, job_page_rows, job_page_state, job_version
from jobs.script import job_script
from jobs.selectors import job_get_for_user
from jobs.views.pages import _job_live_context, _job_page_context

pytestmark = pytest.mark.django_db

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the database digests rows on PostgreSQL only"
)


@pytest.fixture
def shown_job(researcher: Any) -> Job:
    """A resumed, running job with a row for every entry of the declaration: a timeline,
    checkpoints (proven, sharded, failed), its parent and the checkpoint it resumed from, a
    job resumed from it."""
    cluster = ClusterFactory(name="versioned")
    parent = JobFactory(owner=researcher, cluster=cluster, name="the-parent")
    job = JobFactory(
        owner=researcher,
        cluster=cluster,
        parent=parent,
        resume_from=CheckpointFactory(job=parent, step=500),
        state=Job.State.RUNNING,
        total_steps=1000,
        last_step=120,
        nodelist_requested="n[1-2]",
    )
    JobEvent.objects.create(job=job, kind="state", to_state="running", message="up")
    CheckpointFactory(
        job=job, step=100, manifest={"strategy": "ddp"}, last_proven_at=timezone.now()
    )
    CheckpointFactory(
        job=job,
        step=300,
        manifest={"strategy": "fsdp"},
        integrity=Checkpoint.Integrity.FAILED,
        integrity_detail="a shard is short",
    )
    JobFactory(owner=researcher, cluster=cluster, parent=job, name="the-child")
    return job


def versions(user: Any, job_id: Any, *, page: bool) -> tuple[str, str | None]:
    """The header's (``page``: the page's) version both ways: the ETag of what the views
    hash in Python, and the digest PostgreSQL computes (None elsewhere)."""
    job = job_get_for_user(user=user, job_id=job_id)
    python = etag_for(job_page_state(job_page_rows(job=job, page=page), page=page))
    version = job_version(user=user, job_id=job_id, page=page)
    return python, None if version is None else version.digest


def both_versions(user: Any, job_id: Any) -> dict[str, str | None]:
    """The header's and the page's versions, computed both ways (``versions``)."""
    found = {}
    for what, page in (("header", False), ("page", True)):
        python, database = versions(user, job_id, page=page)
        found.update({f"{what} Python": python, f"{what} PostgreSQL": database})
    return found


def other_value(field: Any, value: Any) -> Any:
    """A value of ``field``'s type that differs from ``value`` (a new row for a key)."""
    kind = field.get_internal_type()
    if field.is_relation:
        return NEW_ROW[field.related_model._meta.model_name]().pk
    if kind == "UUIDField":
        return uuid.uuid4()
    if kind in ("AutoField", "BigAutoField"):
        return value + 1_000_000
    if kind == "CharField":
        return "y" if value == "z" else "z"
    if kind == "TextField":
        return f"{value or ''}x"
    if kind == "BooleanField":
        return not value
    if kind == "FloatField":
        return (value or 0.0) + 0.5
    if "IntegerField" in kind:
        return (value or 0) + 1
    if kind == "DateTimeField":
        return (value or timezone.now()) + timedelta(seconds=1)
    if kind == "JSONField":
        return {"changed": [value]}
    raise AssertionError(f"no other value for {field.name} ({kind}): add one here")


NEW_ROW = {
    "user": UserFactory,
    "cluster": ClusterFactory,
    "job": JobFactory,
    "checkpoint": CheckpointFactory,
}


def change(row: Model, name: str) -> None:
    """Change ``row``'s declared field ``name`` as the watcher does (an update, no save)."""
    field_name, _, key = name.partition("__")
    model = type(row)
    field = model._meta.get_field(field_name)
    attname = field.attname  # type: ignore[union-attr]
    rows = model._default_manager.filter(pk=row.pk)
    value = rows.values_list(attname, flat=True).get()
    if key:
        value = {**value, key: f"{value.get(key)}-changed"}
    else:
        value = other_value(field, value)
    rows.update(**{attname: value})
    setattr(row, attname, value)


def back_key(shown: Shown) -> str:
    """The field of ``shown``'s rows that ties them to the job (none for the job's row and
    the rows its keys point at)."""
    relation = Job._meta.get_field(shown.relation) if shown.relation else None
    if relation is None or relation.concrete:
        return ""
    return relation.field.name  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "shown",
    JOB_PAGE_SHOWS,
    ids=[f"{s.relation or 'job'}{'-page' if s.page else ''}" for s in JOB_PAGE_SHOWS],
)
def test_every_declared_field_moves_the_version(
    shown: Shown, shown_job: Job, operator: Any
) -> None:
    """Generated from ``JOB_PAGE_SHOWS``: each declared field of a shown row, changed in
    turn, moves the page's version (Python and PostgreSQL), and the header's exactly when
    the header shows it."""
    job = job_get_for_user(user=operator, job_id=shown_job.id)
    rows = job_page_rows(job=job, page=True).rows[shown]
    assert rows, f"the test's job shows no {shown.model.__name__} as {shown.relation!r}"
    # The job's id is its identity (the version is looked up by it). A listed row's key to
    # the job goes last: changing it takes the row off the page.
    names = [name for name in shown.names if shown.relation or name != "id"]
    names.sort(key=lambda name: name == back_key(shown))
    # The operator sees every job, whoever owns it.
    seen = both_versions(operator, job.id)
    wrong = []
    for name in names:
        change(rows[0], name)
        now = both_versions(operator, job.id)
        for (what, was), is_now in zip(seen.items(), now.values(), strict=True):
            # The page shows everything declared, the header what is not page-only.
            moves = what.startswith("page") or not shown.page
            if was is not None and (is_now != was) != moves:
                wrong.append(f"{name}: the {what} version {'stayed' if moves else 'moved'}")
        seen = now
    assert not wrong, wrong


def test_what_the_page_does_not_show_leaves_its_version(shown_job: Job, researcher: Any) -> None:
    other = JobFactory(owner=researcher, cluster=shown_job.cluster)
    seen = [versions(researcher, shown_job.id, page=page) for page in (False, True)]
    # Another job of the same cluster, its timeline and checkpoints.
    Job.objects.filter(pk=other.pk).update(last_step=99, name="another")
    JobEvent.objects.create(job=other, kind="note", message="elsewhere")
    CheckpointFactory(job=other, step=700)
    # The cluster's sync time, a checkpoint's integrity report, a new metric point (the
    # charts poll for those on their own).
    cluster = shown_job.cluster
    cluster.last_sync_at = timezone.now()
    cluster.save(update_fields=["last_sync_at"])
    Checkpoint.objects.filter(job=shown_job).update(integrity_report={"files": 3})
    MetricPoint.objects.create(job=shown_job, step=121, wall_time=timezone.now(), loss=1.5)
    assert [versions(researcher, shown_job.id, page=page) for page in (False, True)] == seen


@postgres_only
def test_the_version_keeps_the_access_rule(
    researcher: Any, other_researcher: Any, operator: Any
) -> None:
    job = JobFactory(owner=researcher)
    assert job_version(user=operator, job_id=job.id) is not None
    for job_id in (job.id, "not-a-uuid", "00000000-0000-0000-0000-000000000000"):
        with pytest.raises(Http404):
            job_version(user=other_researcher, job_id=job_id)


def test_without_postgresql_there_is_no_version_and_pages_work_as_before(
    researcher: Any,
) -> None:
    if connection.vendor == "postgresql":
        pytest.skip("PostgreSQL computes versions")
    job = JobFactory(owner=researcher)
    assert job_version(user=researcher, job_id=job.id) is None


@postgres_only
def test_a_current_header_or_page_is_answered_from_its_version_in_two_queries(
    researcher: Any, still_clock: Any
) -> None:
    job = JobFactory(owner=researcher, state=Job.State.RUNNING)
    page = Client()
    page.force_login(researcher)
    for path in (f"/jobs/{job.id}/status/", f"/jobs/{job.id}/"):
        page.get(path)  # the session's CSRF cookie
        first = page.get(path)
        with CaptureQueriesContext(connection) as captured:
            again = page.get(path, HTTP_IF_NONE_MATCH=first["ETag"])
        assert again.status_code == 304, path
        # The user with their roles and the version (the session comes from the cache).
        assert len(captured.captured_queries) == 2, [q["sql"] for q in captured.captured_queries]
        JobEvent.objects.create(job=job, kind="note", message=f"seen at {path}")
        fresh = page.get(path, HTTP_IF_NONE_MATCH=first["ETag"])
        assert fresh.status_code == 200 and f"seen at {path}" in fresh.content.decode()


# What the templates read: every field of a model row read while rendering (a method or
# property counts by the fields it reads), checked against the row's declared fields.


@functools.cache
def _field_names(model: type[Model]) -> dict[str, str]:
    """``model``'s attributes that read a column or a relation, and what they read."""
    found = {}
    for field in model._meta.get_fields():
        if field.concrete:
            found[field.name] = found[field.attname] = field.name  # type: ignore[union-attr]
        elif field.is_relation and field.auto_created:
            name = field.get_accessor_name()  # type: ignore[union-attr]
            if name:
                found[name] = name
    return found


@contextmanager
def reads_of_rows() -> Iterator[list[tuple[Model, str]]]:
    reads: list[tuple[Model, str]] = []

    def reading(row: Model, name: str) -> Any:
        if name[0] != "_" and name in _field_names(type(row)):
            reads.append((row, _field_names(type(row))[name]))
        return object.__getattribute__(row, name)

    with mock.patch.object(Model, "__getattribute__", reading):
        yield reads


def undeclared_reads(source: str, job: Job, researcher: Any, *, page: bool) -> list[str]:
    """What rendering ``source`` (and, for the page, its script) reads of the job's rows
    beyond what ``JOB_PAGE_SHOWS`` declares, rendered as the views do for the job's owner."""
    request = RequestFactory().get(f"/jobs/{job.id}/")
    request.user = researcher
    job = job_get_for_user(user=researcher, job_id=job.id)
    context = (_job_page_context if page else _job_live_context)(request, job)
    declared: dict[int, tuple[str, set[str]]] = {}
    for shown, rows in context["shown"].rows.items():
        names = {name for name in shown.names if "__" not in name} | {back_key(shown)}
        for row in rows:
            label, known = declared.get(id(row), ("", set()))
            declared[id(row)] = (label or shown.relation or "the job", known | names)
    models = {shown.model for shown in JOB_PAGE_SHOWS}
    template = engines["django"].from_string(source)
    with reads_of_rows() as reads:
        template.render(context, request)
        if page:
            job_script(job)
    problems = set()
    for row, name in reads:
        model = type(row).__name__
        if id(row) in declared:
            label, known = declared[id(row)]
            if name not in known:
                problems.add(f"{model}.{name} of {label}")
        elif type(row) in models and row is not researcher:
            problems.add(f"{model}.{name} of a row JOB_PAGE_SHOWS does not read")
    return sorted(problems)


HEADER = "jobs/_job_status.html"


def source_of(name: str) -> str:
    return get_template(name).template.source  # type: ignore[attr-defined,no-any-return]


@pytest.mark.parametrize("state", [Job.State.RUNNING, Job.State.PENDING, Job.State.COMPLETED])
def test_the_header_and_page_read_only_what_is_declared(
    shown_job: Job, researcher: Any, state: str
) -> None:
    Job.objects.filter(pk=shown_job.pk).update(
        state=state, target_loss=0.5, optimal_loss=0.4, exit_code=0
    )
    for name, page in ((HEADER, False), ("jobs/job_detail.html", True)):
        problems = undeclared_reads(source_of(name), shown_job, researcher, page=page)
        assert not problems, f"{name} shows what JOB_PAGE_SHOWS does not declare: {problems}"


@pytest.mark.parametrize(
    ("snippet", "page", "problem"),
    [
        ("{{ job.cluster.ssh_host }}", False, "Cluster.ssh_host of cluster"),
        ("{{ job.cluster.workdir }}", False, "Cluster.workdir of cluster"),
        ("{% for c in checkpoints %}{{ c.path }}{% endfor %}", False, "Checkpoint.path of"),
        ("{% for e in events %}{{ e.from_state }}{% endfor %}", False, "JobEvent.from_state of"),
        ("{{ job.owner.get_username }}", False, "User.username of a row"),
        ("{{ job.parent.name }}", False, "Job.name of a row"),
        ("{{ job.metric_points.count }}", False, "Job.metric_points of the job"),
        # On the page the checkpoint it resumed from shows its step and path only.
        ("{{ job.resume_from.integrity }}", True, "Checkpoint.integrity of resume_from"),
        ("{% for child in children %}{{ child.owner.email }}{% endfor %}", True, "User.email"),
    ],
)
def test_a_field_shown_without_being_declared_fails(
    shown_job: Job, researcher: Any, snippet: str, page: bool, problem: str
) -> None:
    """The check above bites: a header (or page) that shows one more field than
    ``JOB_PAGE_SHOWS`` declares is named, whichever way the template reaches it."""
    problems = undeclared_reads(source_of(HEADER) + snippet, shown_job, researcher, page=page)
    assert any(found.startswith(problem) for found in problems), problems
