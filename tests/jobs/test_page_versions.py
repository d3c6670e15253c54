"""The job page's version (``jobs.page_versions``): a digest the database computes of what
the header and the page are rendered from. A poll is answered 304 from it, so it must
change whenever anything shown changes (every column of the job, each timeline entry and
checkpoint, the names around it) and only then; and it must keep the one access rule."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.http import Http404
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from factories import CheckpointFactory, ClusterFactory, JobFactory
from jobs.models import Checkpoint, Job, JobEvent
from jobs.page_versions import CHECKPOINT_FIELDS, EVENT_FIELDS, job_version

pytestmark = pytest.mark.django_db

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the database digests rows on PostgreSQL only"
)


def other_value(field: Any, value: Any) -> Any:
    """A value of ``field``'s type that differs from ``value``."""
    kind = field.get_internal_type()
    if kind == "CharField":
        return "y" if value == "z" else "z"
    if kind == "TextField":
        return f"{value or ''}x"
    if kind == "BooleanField":
        return not value
    if kind in ("FloatField",):
        return (value or 0.0) + 0.5
    if "IntegerField" in kind:
        return (value or 0) + 1
    if kind == "DateTimeField":
        return (value or timezone.now()) + timedelta(seconds=1)
    if kind == "JSONField":
        return {"changed": [value]}
    raise AssertionError(f"no other value for {field.name} ({kind})")


@postgres_only
def test_every_column_of_the_job_changes_its_version(researcher: Any) -> None:
    job = JobFactory(owner=researcher)
    replacements = {
        "owner": researcher,
        "cluster": ClusterFactory(name="elsewhere"),
        "parent": JobFactory(owner=researcher),
        "resume_from": CheckpointFactory(job=JobFactory(owner=researcher), step=10),
    }
    changed = []
    for field in Job._meta.concrete_fields:
        if field.primary_key or field.name == "owner":
            continue  # the row's identity; its owner is the access rule's (tested below)
        before = job_version(user=researcher, job_id=job.id)
        if field.is_relation:
            value = replacements[field.name].pk
        else:
            value = other_value(field, getattr(job, field.attname))
        Job.objects.filter(pk=job.pk).update(**{field.attname: value})
        after = job_version(user=researcher, job_id=job.id)
        assert before is not None and after is not None
        assert after.digest != before.digest, field.name
        changed.append(field.name)
    assert len(changed) == len(Job._meta.concrete_fields) - 2


@postgres_only
def test_the_timeline_checkpoints_and_names_it_shows_change_it_and_nothing_else(
    researcher: Any,
) -> None:
    cluster = ClusterFactory(name="versioned")
    job = JobFactory(owner=researcher, cluster=cluster, state=Job.State.RUNNING)
    other = JobFactory(owner=researcher, cluster=cluster)

    def digest(page: bool = False) -> str:
        version = job_version(user=researcher, job_id=job.id, page=page)
        assert version is not None
        return version.digest

    seen = {digest()}

    def changes(page: bool = False) -> None:
        now = digest(page)
        assert now not in seen
        seen.add(now)

    def change_each(row: Any, fields: tuple[str, ...]) -> None:
        """Each shown column of ``row`` in turn, as the watcher changes them (updates)."""
        for name in fields:
            if name != "id":
                value = other_value(row._meta.get_field(name), getattr(row, name))
                type(row).objects.filter(pk=row.pk).update(**{name: value})
                changes()

    event = JobEvent.objects.create(job=job, kind="state", to_state="running", message="up")
    changes()
    change_each(event, EVENT_FIELDS)
    checkpoint = CheckpointFactory(job=job, step=100)
    changes()
    change_each(checkpoint, CHECKPOINT_FIELDS)
    # The manifest shows as its strategy only.
    Checkpoint.objects.filter(pk=checkpoint.pk).update(manifest={"strategy": "fsdp"})
    changes()
    cluster.name = "renamed"
    cluster.save(update_fields=["name"])
    changes()
    # What the header does not show: another job, the cluster's sync time.
    unchanged = digest()
    Job.objects.filter(pk=other.pk).update(last_step=99)
    cluster.last_sync_at = timezone.now()
    cluster.save(update_fields=["last_sync_at"])
    assert digest() == unchanged
    # The page also shows its script (the cluster's Python and work directory), the owner,
    # the parent and the jobs resumed from it.
    page = digest(page=True)
    assert page != unchanged
    seen.add(page)
    cluster.python = "/opt/python3/bin/python"
    cluster.save(update_fields=["python"])
    changes(page=True)
    researcher.username = "renamed-researcher"
    researcher.save(update_fields=["username"])
    changes(page=True)
    child = JobFactory(owner=researcher, parent=job)
    changes(page=True)
    Job.objects.filter(pk=child.pk).update(state=Job.State.RUNNING)
    changes(page=True)


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
