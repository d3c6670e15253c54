"""Why pending, the rest: expected start and queue position from squeue --start (one
command per watcher cycle at most, only while jobs wait), and hold / release."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from core.audit import AuditAction
from core.models import AuditEvent
from factories import ClusterFactory, JobFactory
from jobs.lifecycle import JOBS
from jobs.models import Job, JobEvent
from jobs.pending_queue import job_pending_summary, pending_estimates_refresh
from slurm import errors as slurm_errors
from slurm.parsers import parse_squeue_start

pytestmark = pytest.mark.django_db

RECORDED = Path(__file__).resolve().parents[1] / "slurm/data/slurm-22.05.8"


@dataclass
class FakeClient:
    """The Slurm client, answering squeue --start from a recorded output."""

    text: str = ""
    error: Exception | None = None
    calls: list[Any] = field(default_factory=list)

    def pending_starts(self, partitions: Any) -> Any:
        self.calls.append(("pending_starts", sorted(partitions)))
        if self.error is not None:
            raise self.error
        return parse_squeue_start(self.text)

    def hold(self, job_id: str) -> None:
        self.calls.append(("hold", job_id))
        if self.error is not None:
            raise self.error

    def release(self, job_id: str) -> None:
        self.calls.append(("release", job_id))
        if self.error is not None:
            raise self.error


def recorded_ids() -> dict[str, str]:
    text = (RECORDED / "jobs_pending.txt").read_text()
    return dict(line.split("=", 1) for line in text.split())


@pytest.fixture
def recorded_queue(researcher: Any) -> dict[str, Any]:
    """Gantry jobs for the recorded pending jobs of the gpu and batch partitions."""
    ids = recorded_ids()
    cluster = ClusterFactory()
    jobs = {
        name: JobFactory(
            owner=researcher,
            cluster=cluster,
            partition="batch" if name == "rec-pend-begin" else "gpu",
            state=Job.State.PENDING,
            slurm_job_id=ids[name],
            state_reason="Resources",
        )
        for name in ("rec-pend-resources", "rec-pend-priority", "rec-pend-begin")
    }
    return {"cluster": cluster, "jobs": jobs}


def test_one_squeue_start_for_every_pending_job(recorded_queue: dict[str, Any]) -> None:
    client = FakeClient(text=(RECORDED / "squeue_start.txt").read_text())
    now = timezone.now()
    assert (
        pending_estimates_refresh(cluster=recorded_queue["cluster"], client=client, now=now) == []
    )
    assert client.calls == [("pending_starts", ["batch", "gpu"])]
    jobs = {name: Job.objects.get(pk=job.pk) for name, job in recorded_queue["jobs"].items()}
    waiting = jobs["rec-pend-resources"]
    assert waiting.expected_start_at is not None and waiting.expected_start_at.tzinfo is not None
    # The recorded squeue --start (epoch seconds): the estimate is in it, not made up.
    starts = {job.job_id: job for job in parse_squeue_start(client.text)}
    assert waiting.expected_start_at == starts[waiting.slurm_job_id].expected_start
    assert (waiting.queue_position, waiting.queue_length) == (1, 4)
    assert (jobs["rec-pend-priority"].queue_position, jobs["rec-pend-priority"].queue_length) == (
        2,
        4,
    )
    assert (jobs["rec-pend-begin"].queue_position, jobs["rec-pend-begin"].queue_length) == (1, 1)
    assert all(job.pending_checked_at == now for job in jobs.values())

    # Fresh estimates: no command until the refresh interval has passed.
    assert (
        pending_estimates_refresh(cluster=recorded_queue["cluster"], client=client, now=now) == []
    )
    assert len(client.calls) == 1
    later = now + timedelta(seconds=31)
    pending_estimates_refresh(cluster=recorded_queue["cluster"], client=client, now=later)
    assert len(client.calls) == 2


def test_no_command_while_no_job_is_pending(researcher: Any) -> None:
    cluster = ClusterFactory()
    JobFactory(owner=researcher, cluster=cluster, state=Job.State.RUNNING, slurm_job_id="5")
    client = FakeClient()
    assert pending_estimates_refresh(cluster=cluster, client=client, now=timezone.now()) == []
    assert client.calls == []


def test_a_failing_squeue_start_is_reported_not_raised(recorded_queue: dict[str, Any]) -> None:
    error = slurm_errors.command_error(["squeue"], 1, "", "slurm_load_jobs error: timeout")
    client = FakeClient(error=error)
    errors = pending_estimates_refresh(
        cluster=recorded_queue["cluster"], client=client, now=timezone.now()
    )
    assert len(errors) == 1 and "squeue --start" in errors[0]
    # A lost link is the cycle's failure, like any other command.
    client = FakeClient(error=slurm_errors.SshTransientError("link lost"))
    with pytest.raises(slurm_errors.SshError):
        pending_estimates_refresh(
            cluster=recorded_queue["cluster"], client=client, now=timezone.now()
        )


def test_the_summary_prefers_slurms_order_and_falls_back_to_gantrys(researcher: Any) -> None:
    cluster = ClusterFactory()
    first = JobFactory(owner=researcher, cluster=cluster, state=Job.State.PENDING, slurm_job_id="1")
    second = JobFactory(
        owner=researcher, cluster=cluster, state=Job.State.PENDING, slurm_job_id="2"
    )
    summary = job_pending_summary(job=second)
    assert summary is not None and summary["queue_position"]["basis"] == "gantry"
    assert summary["expected_start"] is None and summary["checked_at"] is None
    start = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    Job.objects.filter(pk=second.pk).update(
        expected_start_at=start, queue_position=7, queue_length=9, pending_checked_at=timezone.now()
    )
    second.refresh_from_db()
    summary = job_pending_summary(job=second)
    assert summary is not None
    assert summary["queue_position"] == {
        "position": 7,
        "of": 9,
        "partition": "batch",
        "basis": "slurm",
    }
    assert summary["expected_start"] == start
    assert job_pending_summary(job=JobFactory(state=Job.State.RUNNING)) is None
    assert first.pk != second.pk


def _pending_job(owner: Any) -> Job:
    return JobFactory(
        owner=owner, state=Job.State.PENDING, slurm_job_id="4242", state_reason="Resources"
    )


@pytest.fixture
def fake_slurm(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    """The job's account's client, used by the request task; each enqueued request is
    carried out at once, as a worker would (the web request itself sends nothing)."""
    import runs.lifecycle.requests
    from runs.tasks import slurm_request_carry_out_task

    client = FakeClient()
    monkeypatch.setattr(JOBS, "client_of", lambda obj: client)
    monkeypatch.setattr(
        runs.lifecycle.requests,
        "task_send",
        lambda name, request_id: slurm_request_carry_out_task.run(request_id),
    )
    monkeypatch.setattr(
        runs.lifecycle.requests.transaction, "on_commit", lambda callback, **_: callback()
    )
    return client


def test_owner_holds_and_releases_with_audit(
    researcher: Any, researcher_api: APIClient, fake_slurm: FakeClient
) -> None:
    job = _pending_job(researcher)
    held = researcher_api.post(f"/api/v1/jobs/{job.id}/hold/")
    assert held.status_code == 202, held.json()
    assert held.json()["poll"] == f"/api/v1/jobs/{job.id}/"
    assert fake_slurm.calls == [("hold", "4242")]
    event = AuditEvent.objects.get(action=AuditAction.JOB_HOLD)
    assert event.actor == researcher and event.target_id == str(job.id)
    assert JobEvent.objects.filter(job=job, kind="hold", message="held by rita-researcher").exists()
    assert JobEvent.objects.filter(job=job, message="hold requested by rita-researcher").exists()

    # Slurm's reason once the watcher has read it: held in Gantry, in words.
    Job.objects.filter(pk=job.pk).update(state_reason="JobHeldAdmin")
    detail = researcher_api.get(f"/api/v1/jobs/{job.id}/").json()["pending_reason"]
    assert detail["held"] is True and detail["code"] == "JobHeldAdmin"
    assert detail["expected_start"] is None
    assert detail["explanation"].startswith("Held in Gantry (held by rita-researcher")
    page = Client()
    page.force_login(researcher)
    html = page.get(f"/jobs/{job.id}/").content.decode()
    assert 'id="release-button"' in html and 'id="hold-button"' not in html

    released = researcher_api.post(f"/api/v1/jobs/{job.id}/release/")
    assert released.status_code == 202
    assert fake_slurm.calls[-1] == ("release", "4242")
    assert AuditEvent.objects.filter(action=AuditAction.JOB_RELEASE, actor=researcher).exists()


def test_an_outsider_cannot_hold_anothers_job(
    researcher: Any,
    other_researcher: Any,
    outsider: Any,
    operator: Any,
    fake_slurm: FakeClient,
) -> None:
    job = _pending_job(researcher)
    other = APIClient()
    other.force_authenticate(other_researcher)
    assert other.post(f"/api/v1/jobs/{job.id}/hold/").status_code == 404
    page = Client()
    page.force_login(other_researcher)
    assert page.post(f"/jobs/{job.id}/hold/").status_code == 404
    nobody = APIClient()
    nobody.force_authenticate(outsider)
    assert nobody.post(f"/api/v1/jobs/{job.id}/hold/").status_code == 403
    assert APIClient().post(f"/api/v1/jobs/{job.id}/hold/").status_code == 401
    assert fake_slurm.calls == []
    assert not AuditEvent.objects.filter(action=AuditAction.JOB_HOLD).exists()

    boss = APIClient()
    boss.force_authenticate(operator)
    assert boss.post(f"/api/v1/jobs/{job.id}/hold/").status_code == 202
    assert AuditEvent.objects.get(action=AuditAction.JOB_HOLD).actor == operator


def test_only_a_pending_job_can_be_held(
    researcher: Any, researcher_api: APIClient, fake_slurm: FakeClient
) -> None:
    running = JobFactory(owner=researcher, state=Job.State.RUNNING, slurm_job_id="77")
    refused = researcher_api.post(f"/api/v1/jobs/{running.id}/hold/")
    assert refused.status_code == 409
    assert set(refused.json()) == {"message", "extra"}
    queued = JobFactory(owner=researcher, state=Job.State.QUEUED)
    assert researcher_api.post(f"/api/v1/jobs/{queued.id}/release/").status_code == 409
    assert fake_slurm.calls == []


def test_slurm_refusing_a_hold_shows_on_the_jobs_timeline(
    researcher: Any, researcher_api: APIClient, fake_slurm: FakeClient
) -> None:
    job = _pending_job(researcher)
    stderr = (RECORDED / "scontrol_hold_unknown.txt").read_text()
    fake_slurm.error = slurm_errors.command_error(["scontrol", "hold", "4242"], 1, "", stderr)
    # Recorded and audited in the request; the worker's scontrol failed: the job says why.
    accepted = researcher_api.post(f"/api/v1/jobs/{job.id}/hold/")
    assert accepted.status_code == 202 and accepted.json()["request"] == "hold requested"
    assert fake_slurm.calls == [("hold", "4242")]
    failure = JobEvent.objects.get(job=job, kind="hold", message__startswith="could not hold: ")
    assert "Invalid job id" in failure.message
    assert not JobEvent.objects.filter(job=job, message__startswith="held by").exists()
    # A hold that was asked and failed is not "held in Gantry".
    job.refresh_from_db()
    summary = job_pending_summary(job=job)
    assert summary is not None and summary["held"] is False


def test_the_page_shows_the_reason_expected_start_and_position(researcher: Any) -> None:
    job = _pending_job(researcher)
    Job.objects.filter(pk=job.pk).update(
        expected_start_at=timezone.now() + timedelta(hours=2),
        queue_position=3,
        queue_length=5,
        pending_checked_at=timezone.now(),
    )
    page = Client()
    page.force_login(researcher)
    html = page.get(f"/jobs/{job.id}/status/").content.decode()
    assert "Waiting for resources" in html
    assert "Expected start:</strong> <time" in html
    assert "Position 3 of 5 pending jobs in partition batch, in Slurm's priority order" in html
    assert 'id="hold-button"' in html
