"""``core.prepared``: a read compiled once answers as the ORM's own read would, for every
value it is run with (fields converted, ``select_related`` objects, annotations, a missing
relation), and refuses an input it cannot place."""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid4

import pytest
from django.db import connection
from django.db.models import Count, QuerySet
from django.test.utils import CaptureQueriesContext

from core.prepared import PreparedRead, int_literal
from factories import CheckpointFactory, JobFactory
from jobs.models import Checkpoint, Job

pytestmark = pytest.mark.django_db

NO_NAME = "<no job is named this>"


def jobs_named(name: str) -> QuerySet[Job]:
    return (
        Job.objects.select_related("parent", "owner")
        .annotate(resumed=Count("children"))
        .filter(name=name)
    )


def fields(obj: Any) -> list[Any]:
    return [getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields]


def test_each_value_reads_what_the_orm_reads(researcher: Any) -> None:
    parent = JobFactory(owner=researcher, name="first")
    child = JobFactory(owner=researcher, name="second", parent=parent)
    JobFactory(owner=researcher, name="third", parent=child)
    prepared = PreparedRead(jobs_named, name=NO_NAME)
    for name in ("first", "second", "first", "third"):
        with CaptureQueriesContext(connection) as captured:
            got = prepared.first(name=name)
            # Related objects came with it.
            parent_got, owner_got = got.parent, got.owner
        assert len(captured.captured_queries) == 1
        want = jobs_named(name).get()
        assert fields(got) == fields(want)  # datetimes, JSON, UUIDs converted alike
        assert got.resumed == want.resumed
        assert fields(owner_got) == fields(want.owner)
        if want.parent is None:
            assert parent_got is None
        else:
            assert fields(parent_got) == fields(want.parent)
    assert prepared.first(name="nobody") is None


NO_JOB = UUID("00000000-0000-0000-0000-0000000000ee")


def checkpoints_of(job_id: UUID) -> QuerySet[Checkpoint]:
    return Checkpoint.objects.filter(job_id=job_id).only("step", "job").order_by("-step")


def test_every_row_reads_as_the_orm_reads_it_whatever_the_shape(researcher: Any) -> None:
    job, other = JobFactory(owner=researcher), JobFactory(owner=researcher)
    for step in (10, 30, 20):
        CheckpointFactory(job=job, step=step)
    CheckpointFactory(job=other, step=99)
    shapes = {
        "models": checkpoints_of,
        "dicts": lambda job_id: checkpoints_of(job_id).values("id", "step"),
        "tuples": lambda job_id: checkpoints_of(job_id).values_list("step", "job_id"),
        "flat": lambda job_id: checkpoints_of(job_id).values_list("step", flat=True),
    }
    for shape, build in shapes.items():
        prepared = PreparedRead(build, job_id=NO_JOB)
        # A UUID goes in as the database takes it (hex digits on SQLite), a str id too.
        for job_id in (job.id, str(other.id), job.id):
            with CaptureQueriesContext(connection) as captured:
                got = prepared.all(job_id=job_id)
            assert len(captured.captured_queries) == 1, shape
            want = list(build(UUID(str(job_id))))
            if shape == "models":
                assert [fields(c) for c in got] == [fields(c) for c in want]
                assert all(c.get_deferred_fields() == want[0].get_deferred_fields() for c in got)
            else:
                assert got == want, shape
        assert prepared.all(job_id=uuid4()) == []
        first, want_first = prepared.first(job_id=job.id), build(job.id)[0]
        if shape == "models":
            assert fields(first) == fields(want_first)
        else:
            assert first == want_first
    assert [c.step for c in PreparedRead(checkpoints_of, job_id=NO_JOB).all(job_id=job.id)] == [
        30,
        20,
        10,
    ]


def test_a_read_that_prefetches_is_refused() -> None:
    prepared = PreparedRead(
        lambda job_id: Job.objects.prefetch_related("events").filter(id=job_id), job_id=NO_JOB
    )
    with pytest.raises(TypeError, match="prefetch"):
        prepared.all(job_id=uuid4())


def test_an_input_it_cannot_place_is_refused() -> None:
    # The sentinel never reaches the parameters: the filter is on another field.
    prepared = PreparedRead(lambda name: Job.objects.filter(name="x"), name=NO_NAME)
    with pytest.raises(ValueError, match="name"):
        prepared.first(name="x")
    with pytest.raises(TypeError):
        PreparedRead(jobs_named, name=NO_NAME).first(title="x")


def test_a_number_in_a_grouped_expression_is_written_as_digits_only() -> None:
    assert int_literal(64).sql == "64" and int_literal(-3).sql == "-3"
    with pytest.raises(ValueError):
        int_literal("1) OR (1=1")  # type: ignore[arg-type]
