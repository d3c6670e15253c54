"""The log tail on the job page: served from what a worker last read (bounded bytes, with
its age), never read from the cluster inside the web request; a stale tail asks a worker
for a new read, once however many people look."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

import jobs.services
from controlplane.tasknames import JOB_LOG_TAIL_READ
from factories import JobFactory
from jobs.lifecycle import JOBS
from jobs.models import Job, JobLogTail
from jobs.services import LOG_TAIL_BYTES, LOG_TAIL_FRESH_SECONDS, job_log_tail_read
from jobs.tasks import job_log_tail_read_task
from slurm import errors as slurm_errors

pytestmark = pytest.mark.django_db


@dataclass
class Stat:
    size: int


@dataclass
class FakeTransport:
    """The job's account's SFTP: one file, reads recorded; ``error`` raised if set."""

    files: dict[str, bytes] = field(default_factory=dict)
    error: Exception | None = None
    reads: list[tuple[str, int, int]] = field(default_factory=list)

    def stat(self, path: str) -> Stat | None:
        if self.error is not None:
            raise self.error
        return Stat(len(self.files[path])) if path in self.files else None

    def read_from(self, path: str, offset: int, max_bytes: int) -> bytes:
        self.reads.append((path, offset, max_bytes))
        return self.files[path][offset : offset + max_bytes]


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...]]]:
    box: list[tuple[str, tuple[Any, ...]]] = []
    monkeypatch.setattr(jobs.services, "task_send", lambda name, *args: box.append((name, args)))
    monkeypatch.setattr(jobs.services.transaction, "on_commit", lambda callback, **_: callback())
    return box


@pytest.fixture
def transport(monkeypatch: pytest.MonkeyPatch) -> FakeTransport:
    fake = FakeTransport()
    monkeypatch.setattr(JOBS, "transport_of", lambda obj: fake)
    return fake


def _job(owner: Any) -> Job:
    return JobFactory(owner=owner, run_as="alice", state=Job.State.RUNNING, slurm_job_id="777")


def _log_path(job: Job) -> str:
    return f"{JOBS.run_directory(job)}/slurm-777.out"


def test_the_page_asks_a_worker_and_reads_nothing_itself(
    researcher: Any, researcher_api: APIClient, sent: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(obj: Any) -> Any:
        raise AssertionError("the web request read the cluster")

    monkeypatch.setattr(JOBS, "transport_of", refuse)
    job = _job(researcher)
    first = researcher_api.get(f"/api/v1/jobs/{job.id}/logs/").json()
    assert first["reading"] is True and first["read_at"] is None and first["text"] == ""
    assert sent == [(JOB_LOG_TAIL_READ, (str(job.id),))]
    # Another look (another tab, another person) while the read is on its way: no second.
    assert researcher_api.get(f"/api/v1/jobs/{job.id}/logs/").json()["reading"] is True
    assert len(sent) == 1


def test_the_worker_reads_a_bounded_tail_the_page_shows_with_its_age(
    researcher: Any, researcher_api: APIClient, sent: Any, transport: FakeTransport
) -> None:
    job = _job(researcher)
    path = _log_path(job)
    # A log far over the bound, ending in lines the page must show.
    transport.files[path] = b"x" * (3 * LOG_TAIL_BYTES) + b"\nstep 9 loss 0.5\nlast line\n"
    researcher_api.get(f"/api/v1/jobs/{job.id}/logs/")
    (_name, (job_id,)), *_ = sent
    assert job_log_tail_read_task.run(job_id).startswith("read ")
    # One read, of at most the bound, from the end.
    [(read_path, offset, length)] = transport.reads
    assert read_path == path and length == LOG_TAIL_BYTES
    assert offset == len(transport.files[path]) - LOG_TAIL_BYTES
    stored = JobLogTail.objects.get(job=job)
    assert len(stored.text.encode()) <= LOG_TAIL_BYTES and stored.truncated

    tail = researcher_api.get(f"/api/v1/jobs/{job.id}/logs/").json()
    assert tail["text"].endswith("step 9 loss 0.5\nlast line\n")
    assert tail["truncated"] is True and tail["size"] == len(transport.files[path])
    assert tail["read_at"] is not None and 0 <= tail["age_s"] < LOG_TAIL_FRESH_SECONDS
    assert tail["reading"] is False and tail["error"] == ""
    # Fresh: looking again asks for nothing.
    assert len(sent) == 1
    small = researcher_api.get(f"/api/v1/jobs/{job.id}/logs/?max_bytes=20").json()
    assert small["text"] == "last line\n" and small["truncated"] is True


def test_a_stale_tail_is_shown_and_read_again(
    researcher: Any, researcher_api: APIClient, sent: Any, transport: FakeTransport
) -> None:
    job = _job(researcher)
    old = timezone.now() - timedelta(minutes=3)
    JobLogTail.objects.create(job=job, text="old line\n", size=9, read_at=old, requested_at=old)
    tail = researcher_api.get(f"/api/v1/jobs/{job.id}/logs/").json()
    assert tail["text"] == "old line\n" and tail["age_s"] >= 180 and tail["reading"] is True
    assert sent == [(JOB_LOG_TAIL_READ, (str(job.id),))]


def test_a_failing_read_is_stored_and_shown_for_that_job_only(
    researcher: Any, other_researcher: Any, researcher_api: APIClient, transport: FakeTransport
) -> None:
    mine = _job(researcher)
    theirs = JobFactory(
        owner=other_researcher, run_as="bob", state=Job.State.RUNNING, slurm_job_id="778"
    )
    transport.error = slurm_errors.CommandOutputTooLarge(
        "stdout over 1 MiB", argv=["sftp"], stream="stdout", limit=1 << 20
    )
    assert job_log_tail_read(job_id=str(mine.id)).startswith("could not read the log: ")
    assert not JobLogTail.objects.filter(job=theirs).exists()
    shown = researcher_api.get(f"/api/v1/jobs/{mine.id}/logs/").json()
    assert shown["error"].startswith("could not read the log: ")


def test_a_job_without_a_slurm_job_asks_for_nothing(
    researcher: Any, researcher_api: APIClient, sent: Any
) -> None:
    job = JobFactory(owner=researcher)
    tail = researcher_api.get(f"/api/v1/jobs/{job.id}/logs/").json()
    assert tail["text"] == "" and tail["reading"] is False and sent == []
