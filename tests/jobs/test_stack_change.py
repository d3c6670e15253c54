"""A resume onto another software stack than the checkpoint's is said: on the job page and
in its timeline."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from factories import CheckpointFactory, JobFactory
from jobs.models import Job, JobEvent
from jobs.rundir import acceptance_store
from jobs.stack_change import stack_changes

pytestmark = pytest.mark.django_db

WRITTEN = {
    "python": "3.11.2",
    "torch": "2.4.0",
    "cuda": "12.4",
    "nccl": "2.21.5",
    "trainer": "0.1.0",
}


def _resumed(researcher: Any) -> Job:
    parent = JobFactory(owner=researcher)
    checkpoint = CheckpointFactory(job=parent, step=300, manifest={"versions": WRITTEN})
    return JobFactory(owner=researcher, parent=parent, resume_from=checkpoint)


def test_a_resume_onto_another_torch_is_on_the_timeline_and_the_page(researcher: Any) -> None:
    job = _resumed(researcher)
    acceptance_store(job, {"versions": {**WRITTEN, "torch": "2.5.1", "platform": "other"}})
    job.refresh_from_db()
    assert stack_changes(job) == ["torch 2.4.0 → 2.5.1"]
    event = JobEvent.objects.get(job=job, kind=JobEvent.Kind.RESUMED)
    assert "torch 2.4.0 → 2.5.1" in event.message
    page = Client()
    page.force_login(researcher)
    html = page.get(f"/jobs/{job.id}/").content.decode()
    assert 'data-testid="stack-change"' in html and "torch 2.4.0 → 2.5.1" in html


def test_the_same_stack_or_no_resume_says_nothing(researcher: Any) -> None:
    job = _resumed(researcher)
    acceptance_store(job, {"versions": {**WRITTEN, "platform": "another host"}})
    job.refresh_from_db()
    assert stack_changes(job) == [] and not JobEvent.objects.filter(job=job).exists()
    fresh = JobFactory(owner=researcher)
    acceptance_store(fresh, {"versions": WRITTEN})
    fresh.refresh_from_db()
    assert stack_changes(fresh) == []


def test_a_hostile_acceptance_without_versions_is_no_change(researcher: Any) -> None:
    job = _resumed(researcher)
    acceptance_store(job, {"versions": "torch 9"})
    job.refresh_from_db()
    assert stack_changes(job) == []
