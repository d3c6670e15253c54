"""The lifecycle's decisions, with a stand-in Slurm client: an unknown sbatch outcome is
resolved only by finding the tag or by proving absence after the grace; an extra Slurm job
with a taken tag is cancelled; without accounting, jobs finish from exit records."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from factories import ClusterFactory, JobFactory
from jobs.lifecycle import JOBS
from jobs.models import Job, JobEvent
from runs.lifecycle import (
    ACCOUNTING_DOWN,
    ACCOUNTING_NONE,
    SlurmViews,
    slurm_views,
)
from runs.rundir import RunDirectory
from slurm import commands as slurm_commands
from slurm.client import TagLookup
from slurm.errors import SlurmCommandError
from slurm.parsers import SlurmJob

pytestmark = pytest.mark.django_db


@dataclass
class FakeClient:
    cancelled: list[str] = field(default_factory=list)

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)


def _unknown_job(sent_ago: float, **extra: Any) -> Job:
    return JobFactory(
        state=Job.State.SUBMIT_UNKNOWN,
        sbatch_sent_at=timezone.now() - timedelta(seconds=sent_ago),
        cluster=ClusterFactory(accounting_available=extra.pop("accounting", True)),
        **extra,
    )


def _lookup(job: Job, found: list[SlurmJob], *, accounting_ok: bool = True) -> TagLookup:
    return TagLookup(
        found={slurm_commands.job_tag(job.id): found},
        accounting_ok=accounting_ok,
        accounting_error="" if accounting_ok else "down",
    )


def _resolve(job: Job, lookup: TagLookup, evidence: dict[str, Any] | None = None) -> FakeClient:
    client = FakeClient()
    job = Job.objects.select_related("cluster").get(id=job.id)
    JOBS.resolve_by_tag([job], lookup, evidence or {}, client, timezone.now())  # type: ignore[arg-type]
    return client


def test_an_unknown_outcome_is_adopted_when_the_tag_shows_up(settings: Any) -> None:
    job = _unknown_job(5)
    landed = SlurmJob(job_id="41", state="RUNNING")
    _resolve(job, _lookup(job, [landed]))
    job.refresh_from_db()
    assert (job.state, job.slurm_job_id) == ("running", "41")


def test_two_slurm_jobs_with_one_tag_keep_the_first_and_cancel_the_other() -> None:
    job = _unknown_job(5)
    client = _resolve(
        job,
        _lookup(
            job, [SlurmJob(job_id="41", state="PENDING"), SlurmJob(job_id="42", state="PENDING")]
        ),
    )
    job.refresh_from_db()
    assert job.slurm_job_id == "41" and client.cancelled == ["42"]
    assert JobEvent.objects.filter(job=job, kind="duplicate", message__contains="42").exists()


def test_absence_needs_the_grace_and_both_squeue_and_sacct(settings: Any) -> None:
    settings.SUBMIT_UNKNOWN_GRACE_SECONDS = 60
    young = _unknown_job(30)
    _resolve(young, _lookup(young, []))
    assert Job.objects.get(id=young.id).state == "submit_unknown"
    accounting_down = _unknown_job(90)
    _resolve(accounting_down, _lookup(accounting_down, [], accounting_ok=False))
    assert Job.objects.get(id=accounting_down.id).state == "submit_unknown"
    proven = _unknown_job(90)
    _resolve(proven, _lookup(proven, []))
    proven.refresh_from_db()
    assert proven.state == "queued" and proven.sbatch_sent_at is None
    assert "never reached Slurm" in JobEvent.objects.filter(job=proven).last().message


def test_without_accounting_absence_needs_no_output_in_the_run_directory(settings: Any) -> None:
    settings.SUBMIT_UNKNOWN_GRACE_SECONDS = 60
    ran = _unknown_job(90, accounting=False)
    directory = JOBS.run_directory(ran)
    _resolve(ran, _lookup(ran, [], accounting_ok=False), {directory: RunDirectory(outputs={"77"})})
    assert Job.objects.get(id=ran.id).state == "submit_unknown"
    # Its directory could not be listed (the account's login failed): no proof either.
    unread = _unknown_job(90, accounting=False)
    _resolve(unread, _lookup(unread, [], accounting_ok=False), {})
    assert Job.objects.get(id=unread.id).state == "submit_unknown"
    never = _unknown_job(90, accounting=False)
    listed = {JOBS.run_directory(never): RunDirectory()}
    _resolve(never, _lookup(never, [], accounting_ok=False), listed)
    assert Job.objects.get(id=never.id).state == "queued"


def test_an_orphan_of_a_cancelled_job_is_cancelled() -> None:
    job = JobFactory(state=Job.State.CANCELLED, sbatch_sent_at=timezone.now(), slurm_job_id="")
    client = _resolve(job, _lookup(job, [SlurmJob(job_id="55", state="PENDING")]))
    assert client.cancelled == ["55"]


def _running(slurm_job_id: str = "70", **extra: Any) -> Job:
    return JobFactory(
        state=Job.State.RUNNING,
        slurm_job_id=slurm_job_id,
        submitted_at=timezone.now() - timedelta(hours=2),
        last_seen_in_slurm_at=timezone.now() - timedelta(hours=1),
        **extra,
    )


def _apply(job: Job, views: SlurmViews) -> Job:
    job = Job.objects.select_related("cluster").get(id=job.id)
    JOBS.apply_views([job], views, now=timezone.now(), errors=[])
    job.refresh_from_db()
    return job


def test_without_accounting_a_job_finishes_from_its_exit_record() -> None:
    ok, failed, signalled = _running("70"), _running("71"), _running("72")
    views = SlurmViews(
        queue={"71": SlurmJob(job_id="71", state="FAILED")},
        accounted={},
        accounting=ACCOUNTING_NONE,
        exits={
            "70": {"slurm_job_id": "70", "exit_code": 0, "signal": None},
            "71": {"slurm_job_id": "71", "exit_code": 3, "signal": None},
            "72": {"slurm_job_id": "72", "exit_code": 143, "signal": "TERM"},
        },
    )
    assert (_apply(ok, views).state, ok.refresh_from_db()) == ("completed", None)
    assert Job.objects.get(id=ok.id).exit_code == 0
    assert (_apply(failed, views).state, Job.objects.get(id=failed.id).exit_code) == ("failed", 3)
    # Stopped by a signal nobody asked for: the time limit.
    assert _apply(signalled, views).state == "timeout"


def test_accounting_down_never_declares_a_job_lost(settings: Any) -> None:
    settings.JOB_LOST_AFTER_SECONDS = 60
    job = _running("80")
    down = SlurmViews(queue={}, accounted={}, accounting=ACCOUNTING_DOWN)
    assert _apply(job, down).state == "running"
    answered = SlurmViews(queue={}, accounted={})
    assert _apply(job, answered).state == "lost"


@dataclass
class ViewsClient:
    queue: dict[str, SlurmJob]
    accounted: dict[str, SlurmJob]
    asked: list[list[str]] = field(default_factory=list)

    def jobs_in_queue(self, ids: list[str]) -> dict[str, SlurmJob]:
        return {i: self.queue[i] for i in ids if i in self.queue}

    def jobs_accounting(self, ids: list[str], *, start: Any) -> dict[str, SlurmJob]:
        self.asked.append(sorted(ids))
        return {i: self.accounted[i] for i in ids if i in self.accounted}


@dataclass
class ListingTransport:
    answers: dict[str, str]
    scripts: list[str] = field(default_factory=list)

    def exec_shell(self, script: str, **_: Any) -> Any:
        self.scripts.append(script)
        lines = [f"D {d}\n{answer}" for d, answer in self.answers.items() if d in script]

        @dataclass
        class Result:
            stdout: str

        return Result("\n".join(lines))


def test_early_kinds_finish_from_the_exit_record_before_sacct_has_caught_up() -> None:
    # Both Slurm jobs left the queue; sacct still says RUNNING (it lags the scheduler).
    late, early = _running("90"), _running("91")
    client = ViewsClient(
        queue={},
        accounted={i: SlurmJob(job_id=i, state="RUNNING") for i in ("90", "91")},
    )
    transport = ListingTransport(
        {
            "/runs/90": 'X gantry-exit-90.json {"slurm_job_id": "90", "exit_code": 0, "signal": null}',
            "/runs/91": 'X gantry-exit-91.json {"slurm_job_id": "91", "exit_code": 0, "signal": null}',
        }
    )
    tracked = [(late, "/runs/90"), (early, "/runs/91")]
    views = slurm_views(client, transport, tracked, early=frozenset({"91"}))  # type: ignore[arg-type]
    assert set(views.exits) == {"91"} and views.accounting_ok
    # One listing (only the early one's directory); sacct only for the other.
    assert len(transport.scripts) == 1 and "/runs/90" not in transport.scripts[0]
    assert client.asked == [["90"]]
    # The early kind finishes now; the other waits for sacct's final record.
    assert _apply(early, views).state == "completed"
    assert _apply(late, views).state == "running"


def test_an_early_kind_without_an_exit_record_is_settled_by_sacct() -> None:
    # No exit record (the node died before the script could write one): sacct decides.
    job = _running("92")
    client = ViewsClient(queue={}, accounted={"92": SlurmJob(job_id="92", state="NODE_FAIL")})
    transport = ListingTransport({})
    views = slurm_views(client, transport, [(job, "/runs/92")], early=frozenset({"92"}))  # type: ignore[arg-type]
    assert len(transport.scripts) == 1 and client.asked == [["92"]] and views.exits == {}
    assert _apply(job, views).state == "node_fail"


def test_sacct_down_lists_the_other_kinds_once_more() -> None:
    late, early = _running("94"), _running("95")

    class Down(ViewsClient):
        def jobs_accounting(self, ids: list[str], *, start: Any) -> dict[str, SlurmJob]:
            from slurm.errors import SlurmCommandError

            raise SlurmCommandError("sacct failed", argv=["sacct"], rc=1, stderr="slurmdbd down")

    transport = ListingTransport(
        {"/runs/94": 'X gantry-exit-94.json {"slurm_job_id": "94", "exit_code": 3, "signal": null}'}
    )
    tracked = [(late, "/runs/94"), (early, "/runs/95")]
    views = slurm_views(Down({}, {}), transport, tracked, early=frozenset({"95"}))  # type: ignore[arg-type]
    assert not views.accounting_ok and set(views.exits) == {"94"}
    assert len(transport.scripts) == 2 and "/runs/95" not in transport.scripts[1]
    assert _apply(late, views).state == "failed"


def test_a_running_early_job_is_not_finished_by_a_stale_exit_record() -> None:
    # Still in the queue and running: nothing is listed, whatever the directory holds.
    job = _running("93")
    client = ViewsClient(queue={"93": SlurmJob(job_id="93", state="RUNNING")}, accounted={})
    transport = ListingTransport(
        {"/runs/93": 'X gantry-exit-93.json {"slurm_job_id": "93", "exit_code": 0}'}
    )
    views = slurm_views(client, transport, [(job, "/runs/93")], early=frozenset({"93"}))  # type: ignore[arg-type]
    assert transport.scripts == [] and _apply(job, views).state == "running"


def test_only_drills_finish_early_and_keep_the_watcher_close() -> None:
    from drills.lifecycle import DRILLS

    assert DRILLS.FINISH_FROM_EXIT_RECORD and DRILLS.LATENCY_SENSITIVE
    assert not JOBS.FINISH_FROM_EXIT_RECORD and not JOBS.LATENCY_SENSITIVE


@dataclass
class FailingLogin:
    """An account whose login fails (its ``~/.ssh/rc`` floods or exits): nothing listed."""

    config: Any = field(default_factory=lambda: type("Config", (), {"user": "flooded"})())

    def exec_shell(self, script: str, **_: Any) -> Any:
        raise SlurmCommandError("login printed garbage", argv=["sh"], rc=1)


def test_without_accounting_an_unlisted_directory_never_makes_a_job_lost(settings: Any) -> None:
    settings.JOB_LOST_AFTER_SECONDS = 60
    cluster = ClusterFactory(accounting_available=False)
    unlisted = _running("90", cluster=cluster, run_as="flooded")
    listed = _running("91", cluster=cluster, run_as="tidy")
    jobs = list(Job.objects.select_related("cluster").filter(id__in=[unlisted.id, listed.id]))
    transports = {
        "flooded": FailingLogin(),
        "tidy": ListingTransport({JOBS.run_directory(listed): ""}),
    }
    views = slurm_views(
        ViewsClient(queue={}, accounted={}),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        [(job, JOBS.run_directory(job)) for job in jobs],
        accounting=ACCOUNTING_NONE,
        owner_of=lambda job: transports[job.run_as],  # type: ignore[arg-type,return-value]
    )
    assert views.unlisted == {"90"} and any("garbage" in error for error in views.errors)
    JOBS.apply_views(jobs, views, now=timezone.now(), errors=[])
    # Listed with no exit record, gone from squeue past the grace: lost. Its directory
    # unknown this cycle: still running, waiting for a cycle that can list it.
    assert Job.objects.get(id=listed.id).state == "lost"
    assert Job.objects.get(id=unlisted.id).state == "running"
