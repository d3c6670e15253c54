"""How Slurm's final states reach recovery now that Gantry submits with ``--no-requeue``: a
preempted job is resumed and names no node, and uses up no attempt; a boot failure names
its allocation's nodes; a time limit names none; a cancelled job is never recovered,
whoever cancelled it and however Gantry learnt of it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from jobs.lifecycle import JOBS, final_values, job_event
from jobs.models import Job, JobEvent
from nodes.models import Cluster, Node
from recovery.cycle import recovery_cycle
from recovery.models import Incident, RecoveryPolicy, SuspectNode
from runs.lifecycle import ACCOUNTING_NONE, SlurmViews
from runs.rundir import RunDirectory
from slurm.parsers import SlurmJob

from .test_recovery import _checkpoint, _failed_job

pytestmark = pytest.mark.django_db


def _cycle(cluster: Cluster, listed: dict[Any, RunDirectory] | None = None) -> Any:
    return recovery_cycle(cluster=cluster, seen=set(), now=timezone.now(), listed=listed)


def _srun_blamed(job: Job, node: str = "gpu-b-01") -> dict[Any, RunDirectory]:
    """What srun writes when Slurm stops the tasks (a preemption or the time limit sends
    them SIGTERM): a line per node that reads like a crash."""
    directory = RunDirectory()
    directory.srun_errors[job.slurm_job_id] = [(node, "0", "Terminated")]
    return {job.id: directory}


@pytest.mark.parametrize(
    "reason, signal, suspects",
    [
        ("preempted", Incident.Signal.PREEMPTED, []),
        ("preempted (signal 15)", Incident.Signal.PREEMPTED, []),
        # The control: the same lines after a crash name the node.
        ("", Incident.Signal.CRASH, ["gpu-b-01"]),
    ],
)
def test_a_preempted_job_is_resumed_from_a_proven_checkpoint_naming_no_node(
    cluster: Cluster, researcher: Any, reason: str, signal: str, suspects: list[str]
) -> None:
    job = _failed_job(cluster, researcher, state_reason=reason)
    proven = _checkpoint(job, 600, proven=True)
    _checkpoint(job, 700, proven=False)
    _cycle(cluster, listed=_srun_blamed(job))
    incident = Incident.objects.get(job=job)
    assert incident.signal == signal
    assert incident.suspect_nodes == suspects
    assert sorted(SuspectNode.objects.values_list("node__name", flat=True)) == suspects
    if signal != Incident.Signal.PREEMPTED:
        return
    assert (
        "Slurm preempted job 4242" in incident.detail and "no node is suspected" in incident.detail
    )
    # The newer, unproven checkpoint is drilled first, as after a crash.
    assert incident.outcome == Incident.Outcome.PROVING
    Incident.objects.filter(pk=incident.pk).update(proving_drill_id=None, skipped={"700": "x"})
    _cycle(cluster)
    incident.refresh_from_db()
    assert incident.outcome == Incident.Outcome.RECOVERED
    assert incident.resumed_from_id == proven.pk
    assert incident.resumed_job is not None and incident.resumed_job.exclude_nodes == ""
    told = JobEvent.objects.filter(job=job, kind="incident").values_list("message", flat=True)
    assert any("Slurm preempted job 4242" in message for message in told)
    page = Client()
    page.force_login(researcher)
    assert "preempted (not requeued by Slurm)" in page.get("/recovery/").content.decode()


def test_preemptions_use_up_no_attempt_and_are_never_held_for_no_progress(
    cluster: Cluster, researcher: Any
) -> None:
    RecoveryPolicy.objects.create(cluster=cluster, max_attempts=1)
    first = _failed_job(cluster, researcher, state_reason="preempted")
    _checkpoint(first, 600, proven=True)
    _cycle(cluster)
    again = Incident.objects.get(job=first).resumed_job
    assert again is not None

    def ends(job: Job, slurm_job_id: str, reason: str) -> None:
        # Before saving anything newer than step 600, on the same nodes.
        Job.objects.filter(pk=job.pk).update(
            state="failed",
            state_reason=reason,
            slurm_job_id=slurm_job_id,
            ended_at=timezone.now(),
            files_final=True,
        )
        _cycle(cluster)

    ends(again, "4243", "preempted")
    second = Incident.objects.get(job=again)
    assert second.signal == Incident.Signal.PREEMPTED
    assert second.outcome == Incident.Outcome.RECOVERED and second.resumed_from.step == 600
    third_job = second.resumed_job
    assert third_job is not None
    # A crash now is the lineage's first failed attempt: it is recovered.
    ends(third_job, "4244", "")
    third = Incident.objects.get(job=third_job)
    assert third.signal == Incident.Signal.CRASH
    assert third.outcome == Incident.Outcome.RECOVERED
    fourth_job = third.resumed_job
    assert fourth_job is not None
    # A second crash: the policy's one attempt is used up.
    ends(fourth_job, "4245", "")
    fourth = Incident.objects.get(job=fourth_job)
    assert fourth.outcome == Incident.Outcome.HELD
    assert "most its policy allows (1)" in fourth.reason


def _apply(job: Job, views: SlurmViews) -> Job:
    job = Job.objects.select_related("cluster").get(id=job.id)
    JOBS.apply_views([job], views, now=timezone.now(), errors=[])
    job.refresh_from_db()
    return job


def _running(cluster: Cluster, owner: Any, **values: Any) -> Job:
    fields: dict[str, Any] = {
        "state": "running",
        "ended_at": None,
        "files_final": False,
        "started_at": timezone.now() - timedelta(minutes=10),
        "last_seen_in_slurm_at": timezone.now(),
        "time_limit_minutes": 30,
    }
    fields.update(values)
    return _failed_job(cluster, owner, **fields)


@pytest.mark.parametrize(
    "slurm_state, job_state, signal, suspects",
    [
        ("PREEMPTED", "failed", Incident.Signal.PREEMPTED, []),
        ("BOOT_FAIL", "failed", Incident.Signal.BOOT_FAILURE, ["gpu-b-01", "gpu-b-02"]),
        ("OUT_OF_MEMORY", "failed", Incident.Signal.OUT_OF_MEMORY, ["gpu-b-01"]),
        ("FAILED", "failed", Incident.Signal.CRASH, ["gpu-b-01"]),
        ("TIMEOUT", "timeout", Incident.Signal.TIMEOUT, []),
        ("DEADLINE", "timeout", Incident.Signal.TIMEOUT, []),
        ("CANCELLED", "cancelled", None, []),
        ("REVOKED", "cancelled", None, []),
    ],
)
def test_slurms_final_record_is_the_signal(
    cluster: Cluster,
    researcher: Any,
    slurm_state: str,
    job_state: str,
    signal: str | None,
    suspects: list[str],
) -> None:
    job = _running(cluster, researcher)
    _checkpoint(job, 600, proven=True)
    record = SlurmJob(
        job_id="4242",
        state=slurm_state,
        exit_code=1,
        end_time=timezone.now(),
        node_list_expr="gpu-b-[01-02]",
    )
    job = _apply(job, SlurmViews(queue={}, accounted={"4242": record}))
    assert job.state == job_state and job.allocated_nodes == "gpu-b-[01-02]"
    Job.objects.filter(pk=job.pk).update(files_final=True)
    _cycle(cluster, listed=_srun_blamed(job))
    incident = Incident.objects.filter(job=job).first()
    if signal is None:
        assert incident is None and not Job.objects.filter(parent=job).exists()
        return
    assert incident is not None and incident.signal == signal
    assert sorted(SuspectNode.objects.values_list("node__name", flat=True)) == suspects
    assert incident.outcome == Incident.Outcome.RECOVERED


def test_slurm_states_folded_into_gantrys_are_kept_in_the_reason() -> None:
    def reason(state: str) -> str:
        return str(final_values(SlurmJob(job_id="1", state=state)).get("state_reason", ""))

    assert reason("PREEMPTED") == "preempted"
    assert reason("BOOT_FAIL") == "boot failure"
    assert reason("OUT_OF_MEMORY") == "out of memory"
    assert reason("DEADLINE") == "deadline reached"


def test_a_boot_failure_names_the_node_the_inventory_shows_failing(
    cluster: Cluster, researcher: Any
) -> None:
    Node.objects.filter(cluster=cluster, name="gpu-b-04").update(state=Node.State.DOWN)
    job = _failed_job(
        cluster, researcher, state_reason="boot failure", allocated_nodes="gpu-b-[03-04]"
    )
    _checkpoint(job, 600, proven=True)
    _cycle(cluster)
    incident = Incident.objects.get(job=job)
    assert incident.signal == Incident.Signal.BOOT_FAILURE
    assert incident.suspect_nodes == ["gpu-b-04"]
    assert "BOOT_FAIL" in SuspectNode.objects.get().evidence
    assert incident.resumed_job is not None and incident.resumed_job.exclude_nodes == "gpu-b-04"


# --------------------------------------------------------------------------- cancels


def _exit(signal: str | None = "TERM") -> dict[str, Any]:
    return {"slurm_job_id": "4242", "exit_code": 143, "signal": signal}


def test_a_job_its_owner_cancelled_through_gantry_is_never_recovered(
    cluster: Cluster, researcher: Any
) -> None:
    job = _running(cluster, researcher)
    _checkpoint(job, 600, proven=True)
    job_event(job, JobEvent.Kind.CANCEL, message="scancel 4242 by rita-researcher")
    views = SlurmViews(queue={}, accounted={}, accounting=ACCOUNTING_NONE, exits={"4242": _exit()})
    assert _apply(job, views).state == "cancelled"
    Job.objects.filter(pk=job.pk).update(files_final=True)
    _cycle(cluster)
    assert not Incident.objects.exists()


def test_a_scancel_on_the_cluster_that_squeue_shows_is_a_cancel_not_a_time_out(
    cluster: Cluster, researcher: Any
) -> None:
    # No accounting: squeue still shows the job CANCELLED (an operator's scancel on the
    # login node), and its exit record says a signal stopped it.
    job = _running(cluster, researcher)
    _checkpoint(job, 600, proven=True)
    views = SlurmViews(
        queue={"4242": SlurmJob(job_id="4242", state="CANCELLED")},
        accounted={},
        accounting=ACCOUNTING_NONE,
        exits={"4242": _exit()},
    )
    assert _apply(job, views).state == "cancelled"
    Job.objects.filter(pk=job.pk).update(files_final=True)
    _cycle(cluster)
    assert not Incident.objects.exists()


@pytest.mark.parametrize("ran_minutes, recovered", [(10, False), (31, True)])
def test_a_time_out_only_a_signal_shows_is_recovered_only_at_the_time_limit(
    cluster: Cluster, researcher: Any, ran_minutes: int, recovered: bool
) -> None:
    # No accounting and squeue no longer shows it: the exit record's signal is all there
    # is. Well before the time limit that is someone's scancel or a preemption, not a
    # time-out: Gantry cannot tell which, so it does not recover it.
    job = _running(cluster, researcher, started_at=timezone.now() - timedelta(minutes=ran_minutes))
    _checkpoint(job, 600, proven=True)
    views = SlurmViews(queue={}, accounted={}, accounting=ACCOUNTING_NONE, exits={"4242": _exit()})
    job = _apply(job, views)
    assert job.state == "timeout" and job.state_reason == "stopped by SIGTERM"
    Job.objects.filter(pk=job.pk).update(files_final=True)
    _cycle(cluster)
    incident = Incident.objects.filter(job=job).first()
    assert (incident is not None) is recovered
    if incident is not None:
        assert incident.signal == Incident.Signal.TIMEOUT and incident.suspect_nodes == []


def test_a_cancelled_run_whose_loss_went_nan_is_not_recovered(
    cluster: Cluster, researcher: Any
) -> None:
    job = _failed_job(cluster, researcher, state="cancelled", nonfinite_loss_step=650)
    _checkpoint(job, 600, proven=True)
    _cycle(cluster)
    assert not Incident.objects.exists()
