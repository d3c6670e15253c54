"""A person's cancel, hold and release (``runs.lifecycle.requests``): recorded in the web
request without any command or connection, carried out by the worker task as the object's
account, a failure shown on that object only, a lost task sent again by the watcher.

The worker's part is driven by calling the task function itself (``.run``, as a worker
would); the broker is a list (``sent``)."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

import runs.lifecycle.kind
import runs.lifecycle.requests
from controlplane.tasknames import SLURM_REQUEST_CARRY_OUT
from core.audit import AuditAction
from core.models import AuditEvent
from drills.lifecycle import DRILLS
from drills.models import RestoreDrill
from drills.services import restore_drill_cancel
from factories import CheckpointFactory, ClusterFactory, JobFactory
from jobs.lifecycle import JOBS
from jobs.models import Job, JobEvent
from runs.lifecycle.requests import MAX_ATTEMPTS, RESEND_AFTER_SECONDS
from runs.models import SlurmRequest
from runs.tasks import slurm_request_carry_out_task
from slurm import errors as slurm_errors

pytestmark = pytest.mark.django_db


@dataclass
class FakeClient:
    """One account's Slurm client: records what it was asked, raises ``error`` if set."""

    error: Exception | None = None
    calls: list[tuple[str, str]] = field(default_factory=list)

    def _call(self, what: str, job_id: str) -> None:
        self.calls.append((what, job_id))
        if self.error is not None:
            raise self.error

    def cancel(self, job_id: str) -> None:
        self._call("cancel", job_id)

    def hold(self, job_id: str) -> None:
        self._call("hold", job_id)

    def release(self, job_id: str) -> None:
        self._call("release", job_id)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...]]]:
    """The broker: what was enqueued after commit, by name and arguments. (The test's
    transaction never commits: its on-commit callbacks run as they are registered.)"""
    box: list[tuple[str, tuple[Any, ...]]] = []
    monkeypatch.setattr(
        runs.lifecycle.requests, "task_send", lambda name, *args: box.append((name, args))
    )
    monkeypatch.setattr(
        runs.lifecycle.requests.transaction, "on_commit", lambda callback, **_: callback()
    )
    return box


@pytest.fixture
def no_ssh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connection or client as any account fails the test."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a web request opened an SSH connection")

    monkeypatch.setattr(runs.lifecycle.kind, "slurm_client_as", refuse)
    monkeypatch.setattr(runs.lifecycle.kind, "transport_as", refuse)


@pytest.fixture
def clients(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeClient]:
    """One client per cluster account (``run_as``), as the worker would log in."""
    by_account: dict[str, FakeClient] = {}
    monkeypatch.setattr(
        JOBS, "client_of", lambda obj: by_account.setdefault(obj.run_as, FakeClient())
    )
    monkeypatch.setattr(
        DRILLS,
        "client_of",
        lambda obj: by_account.setdefault(DRILLS.run_as(obj) or "service", FakeClient()),
    )
    return by_account


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _running(owner: Any, *, run_as: str = "alice", slurm_job_id: str = "70") -> Job:
    cluster = ClusterFactory(ssh_host="127.0.0.1", ssh_port=_closed_port())
    return JobFactory(
        owner=owner,
        cluster=cluster,
        run_as=run_as,
        state=Job.State.RUNNING,
        slurm_job_id=slurm_job_id,
    )


def _work(sent: list[tuple[str, tuple[Any, ...]]]) -> list[str]:
    """Run every enqueued request task, as a worker would; what each returned."""
    done = []
    while sent:
        name, args = sent.pop(0)
        assert name == SLURM_REQUEST_CARRY_OUT
        done.append(slurm_request_carry_out_task.run(*args))
    return done


# ---------------------------------------------------------------- the web request


def test_a_cancel_is_recorded_and_enqueued_without_any_connection(
    researcher: Any, researcher_api: APIClient, sent: Any, no_ssh: None
) -> None:
    job = _running(researcher)
    started = time.monotonic()
    answer = researcher_api.post(f"/api/v1/jobs/{job.id}/cancel/")
    elapsed = time.monotonic() - started
    assert answer.status_code == 202, answer.json()
    assert answer.json()["request"] == "cancel requested"
    assert answer.json()["state"] == Job.State.RUNNING
    # The cluster's port is closed and no client may be made: nothing waited on it.
    assert elapsed < 5
    request = SlurmRequest.objects.get()
    assert (request.action, request.status, request.slurm_job_id) == ("cancel", "open", "70")
    assert request.requested_by == researcher.get_username()
    assert sent == [(SLURM_REQUEST_CARRY_OUT, (request.id,))]
    event = JobEvent.objects.get(job=job, kind="cancel")
    assert event.message == f"cancel requested by {researcher.get_username()}"
    assert AuditEvent.objects.get(action=AuditAction.JOB_CANCEL).actor == researcher
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING

    # The page shows it at once, on the timeline.
    page = Client()
    page.force_login(researcher)
    assert "cancel requested by" in page.get(f"/jobs/{job.id}/status/").content.decode()

    # Asking again while it is open is the same request: no second task, no second audit.
    again = researcher_api.post(f"/api/v1/jobs/{job.id}/cancel/")
    assert again.status_code == 202 and again.json()["request"] == "cancel requested already"
    assert SlurmRequest.objects.count() == 1 and len(sent) == 1
    assert AuditEvent.objects.filter(action=AuditAction.JOB_CANCEL).count() == 1


def test_the_task_sends_scancel_as_the_jobs_account_once(
    researcher: Any, sent: Any, clients: dict[str, FakeClient]
) -> None:
    from jobs.services import job_cancel

    job = _running(researcher, run_as="alice", slurm_job_id="70")
    assert job_cancel(actor=researcher, job=job) == "cancel requested"
    assert clients == {}  # nothing was sent in the request
    delivered = list(sent)
    assert _work(sent) == ["cancel sent for Slurm job 70"]
    assert clients["alice"].calls == [("cancel", "70")]
    request = SlurmRequest.objects.get()
    assert request.status == "done" and request.attempts == 1
    job.refresh_from_db()
    assert job.state_reason == f"cancel requested by {researcher.get_username()}"
    assert JobEvent.objects.filter(job=job, message__startswith="scancel 70 by").count() == 1
    # A redelivered task finds the request closed and sends nothing.
    sent.extend(delivered)
    assert _work(sent) == ["nothing to do: carried out, superseded or failed already"]
    assert clients["alice"].calls == [("cancel", "70")]


@pytest.mark.parametrize(
    "error",
    [
        slurm_errors.CommandOutputTooLarge(
            "stdout over 1 MiB", argv=["scancel", "71"], stream="stdout", limit=1 << 20
        ),
        slurm_errors.command_error(["scancel", "71"], 1, "", "\x1b[2J garbage from .bashrc"),
        slurm_errors.SshAuthenticationError("the login node refused the certificate"),
    ],
    ids=["flood", "garbage", "refused-login"],
)
def test_a_failing_login_leaves_the_error_on_that_researchers_job_only(
    researcher: Any,
    other_researcher: Any,
    sent: Any,
    clients: dict[str, FakeClient],
    error: Exception,
) -> None:
    from jobs.services import job_cancel

    mallory = _running(researcher, run_as="mallory", slurm_job_id="71")
    bob = _running(other_researcher, run_as="bob", slurm_job_id="72")
    clients["mallory"] = FakeClient(error=error)
    job_cancel(actor=researcher, job=mallory)
    job_cancel(actor=other_researcher, job=bob)
    outcomes = _work(sent)
    assert outcomes[0].startswith("could not cancel: ")
    assert outcomes[1] == "cancel sent for Slurm job 72"
    assert clients["bob"].calls == [("cancel", "72")]
    failed = SlurmRequest.objects.get(object_id=str(mallory.id))
    assert failed.status == "failed" and failed.outcome
    failure = JobEvent.objects.get(job=mallory, message__startswith="could not cancel: ")
    assert failed.outcome in failure.message
    assert not JobEvent.objects.filter(job=bob, message__startswith="could not").exists()
    assert SlurmRequest.objects.get(object_id=str(bob.id)).status == "done"
    # The failure is the request's end: the next cycle sends nothing again.
    assert JOBS.resend_requests(mallory.cluster, timezone.now() + timedelta(hours=1)) == 0


def _timeout() -> slurm_errors.SshCommandTimeout:
    return slurm_errors.SshCommandTimeout("no answer in 60 s", argv=["scancel", "70"], timeout=60)


def test_a_transient_error_is_retried_then_fails_with_the_reason(
    researcher: Any, sent: Any, clients: dict[str, FakeClient]
) -> None:
    from jobs.services import job_cancel
    from runs.lifecycle.requests import slurm_request_gave_up

    job = _running(researcher, run_as="sleepy")
    clients["sleepy"] = FakeClient(error=_timeout())
    job_cancel(actor=researcher, job=job)
    (_name, (request_id,)), *_ = sent
    with pytest.raises(slurm_errors.SshCommandTimeout):
        slurm_request_carry_out_task.run(request_id)
    request = SlurmRequest.objects.get()
    assert request.status == "open" and request.outcome.startswith("retrying: ")
    assert not JobEvent.objects.filter(job=job, message__startswith="could not").exists()
    # The task's retries ran out.
    slurm_request_gave_up(request_id=request_id, error=_timeout())
    request.refresh_from_db()
    assert request.status == "failed"
    assert JobEvent.objects.filter(job=job, message__startswith="could not cancel: ").exists()


def test_a_request_tried_too_often_fails_instead_of_retrying_forever(
    researcher: Any, sent: Any, clients: dict[str, FakeClient]
) -> None:
    from jobs.services import job_cancel

    job = _running(researcher)
    job_cancel(actor=researcher, job=job)
    SlurmRequest.objects.update(attempts=MAX_ATTEMPTS, outcome="retrying: no answer")
    assert _work(sent)[0].startswith("could not cancel: retrying: no answer (gave up")
    assert clients == {}


def test_a_lost_task_is_sent_again_by_the_watcher(
    researcher: Any, sent: Any, clients: dict[str, FakeClient]
) -> None:
    from jobs.services import job_cancel

    job = _running(researcher)
    job_cancel(actor=researcher, job=job)
    request = SlurmRequest.objects.get()
    # Redis restarted: the task is gone; only the database remembers.
    sent.clear()
    now = timezone.now()
    assert JOBS.requeue_stalled(job.cluster, now) == 0
    later = now + timedelta(seconds=RESEND_AFTER_SECONDS + 1)
    assert JOBS.requeue_stalled(job.cluster, later) == 1
    assert sent == [(SLURM_REQUEST_CARRY_OUT, (request.id,))]
    # Not again while the resent one travels; another kind's cycle does not send it.
    assert JOBS.requeue_stalled(job.cluster, later) == 0
    assert DRILLS.resend_requests(job.cluster, later + timedelta(hours=1)) == 0
    assert _work(sent) == ["cancel sent for Slurm job 70"]
    assert clients["alice"].calls == [("cancel", "70")]


def test_a_request_for_a_job_that_ended_meanwhile_sends_nothing(
    researcher: Any, sent: Any, clients: dict[str, FakeClient]
) -> None:
    from jobs.services import job_cancel

    job = _running(researcher)
    job_cancel(actor=researcher, job=job)
    Job.objects.filter(id=job.id).update(state=Job.State.COMPLETED)
    assert _work(sent) == ["nothing to do: it is completed"]
    assert clients == {}
    assert SlurmRequest.objects.get().status == "done"


# ---------------------------------------------------------------- drills share it


def _running_drill() -> RestoreDrill:
    checkpoint = CheckpointFactory(job__run_as="alice")
    drill = RestoreDrill.objects.create(
        checkpoint=checkpoint,
        cluster=checkpoint.job.cluster,
        allocation_key="x",
        state=RestoreDrill.State.RUNNING,
        slurm_job_id="88",
        submitted_at=timezone.now() - timedelta(minutes=2),
    )
    return drill


def test_a_drill_cancel_is_a_request_carried_out_by_the_worker(
    operator: Any, sent: Any, no_ssh: None
) -> None:
    drill = _running_drill()
    assert restore_drill_cancel(actor=operator, drill=drill) == "cancel requested"
    drill.refresh_from_db()
    assert drill.state == RestoreDrill.State.RUNNING
    request = SlurmRequest.objects.get()
    assert request.kind == "drills.restoredrill" and request.object_id == str(drill.id)
    assert AuditEvent.objects.filter(action=AuditAction.DRILL_CANCEL).count() == 1


def test_the_worker_cancels_the_drill_as_its_account(
    operator: Any, sent: Any, clients: dict[str, FakeClient]
) -> None:
    drill = _running_drill()
    restore_drill_cancel(actor=operator, drill=drill)
    assert _work(sent) == ["cancel sent for Slurm job 88"]
    account = DRILLS.run_as(drill) or "service"
    assert clients[account].calls == [("cancel", "88")]
    drill.refresh_from_db()
    assert drill.state == RestoreDrill.State.CANCELLED


# ---------------------------------------------------------------- hold and release


def _pending(owner: Any) -> Job:
    job = _running(owner, slurm_job_id="4242")
    Job.objects.filter(id=job.id).update(state=Job.State.PENDING, state_reason="Resources")
    job.refresh_from_db()
    return job


def test_hold_and_release_are_requests_the_newer_wins(
    researcher: Any, researcher_api: APIClient, sent: Any, no_ssh: None, monkeypatch: Any
) -> None:
    job = _pending(researcher)
    held = researcher_api.post(f"/api/v1/jobs/{job.id}/hold/")
    assert held.status_code == 202 and held.json()["request"] == "hold requested"
    assert JobEvent.objects.filter(job=job, kind="hold", message__contains="hold requested")
    released = researcher_api.post(f"/api/v1/jobs/{job.id}/release/")
    assert released.status_code == 202 and released.json()["request"] == "release requested"
    statuses = dict(SlurmRequest.objects.values_list("action", "status"))
    assert statuses == {"hold": "superseded", "release": "open"}
    assert AuditEvent.objects.filter(action=AuditAction.JOB_HOLD).count() == 1
    assert AuditEvent.objects.filter(action=AuditAction.JOB_RELEASE).count() == 1

    # The worker: the superseded hold sends nothing, the release is sent.
    client = FakeClient()
    monkeypatch.setattr(JOBS, "client_of", lambda obj: client)
    _work(sent)
    assert client.calls == [("release", "4242")]
    assert JobEvent.objects.filter(
        job=job, kind="release", message=f"released by {researcher.get_username()}"
    ).exists()


def test_a_hold_for_a_job_that_started_meanwhile_says_why_on_its_page(
    researcher: Any, sent: Any, clients: dict[str, FakeClient]
) -> None:
    from jobs.pending_queue import job_hold

    job = _pending(researcher)
    assert job_hold(actor=researcher, job=job) == "hold requested"
    Job.objects.filter(id=job.id).update(state=Job.State.RUNNING)
    assert _work(sent) == ["could not hold: it is running, no longer pending in Slurm"]
    assert clients == {}
    assert JobEvent.objects.filter(job=job, kind="hold", message__startswith="could not hold")
