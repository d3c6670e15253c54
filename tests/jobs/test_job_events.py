"""A job's timeline kinds are one fixed set: what the generic lifecycle and the trainer
write is in it, and anything else is refused before it is stored."""

from __future__ import annotations

import pytest

from factories import JobFactory
from jobs.ingest import _TIMELINE_EVENTS
from jobs.lifecycle import job_event
from jobs.models import JobEvent
from runs.events import RunEventKind


def test_every_kind_the_generic_lifecycle_writes_is_a_job_event_kind() -> None:
    missing = {kind.value for kind in RunEventKind} - set(JobEvent.Kind.values)
    assert not missing


def test_every_trainer_event_on_the_timeline_is_a_job_event_kind() -> None:
    assert _TIMELINE_EVENTS
    assert not set(_TIMELINE_EVENTS) - set(JobEvent.Kind.values)


@pytest.mark.django_db
def test_a_known_kind_is_stored() -> None:
    job = JobFactory()
    job_event(job, JobEvent.Kind.HOLD, message="held by someone")
    assert list(JobEvent.objects.filter(job=job).values_list("kind", flat=True)) == ["hold"]


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["note", "", "STATE", "state ", "checkpoint_registered"])
def test_an_unknown_kind_is_refused_and_nothing_is_stored(kind: str) -> None:
    job = JobFactory()
    with pytest.raises(ValueError, match="not a job event kind"):
        job_event(job, kind)
    assert not JobEvent.objects.filter(job=job).exists()
