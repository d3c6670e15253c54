"""Recovery on proof: detection on positive evidence only, resumes from the newest proven
checkpoint (a newer one drilled first), suspects excluded, restart loops stopped.

A cluster of a shape the dev cluster does not have (node and partition names, GPU type), so
nothing here leans on the dev cluster's names. Cancelling a Slurm job needs a cluster: the
lifecycle's cancel is replaced by a recorder (the dev-cluster fault tests cancel for real).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from core.models import AuditEvent
from drills.models import RestoreDrill
from factories import (
    CheckpointFactory,
    JobFactory,
)
from jobs.models import Checkpoint, Job, JobEvent, MetricPoint, StateFingerprint
from jobs.script import job_script
from nodes.models import Cluster, Node
from recovery.cycle import recovery_cycle
from recovery.detect import hang_budget
from recovery.models import Incident, JobProgress, RecoveryPolicy, SuspectNode

pytestmark = pytest.mark.django_db


def _failed_job(cluster: Cluster, owner: Any, *, state: str = "failed", **values: Any) -> Job:
    now = timezone.now()
    defaults: dict[str, Any] = {
        "owner": owner,
        "cluster": cluster,
        "partition": "train",
        "nodes": 2,
        "gpus_per_node": 1,
        "run_as": "alice",
        "slurm_job_id": "4242",
        "state": state,
        "started_at": now - timedelta(hours=2),
        "ended_at": now - timedelta(seconds=20),
        "files_final": True,
        "last_step": 730,
        "allocated_nodes": "gpu-b-[01-02]",
        "config": {"preset": "tiny", "steps": 1000, "checkpoint_every": 100},
    }
    defaults.update(values)
    return JobFactory(**defaults)


def _checkpoint(job: Job, step: int, *, proven: bool) -> Checkpoint:
    """A checkpoint a drill can judge: Gantry holds its fingerprint and the losses the
    run logged after it."""
    StateFingerprint.objects.create(
        job=job, step=step, data={"tensors": {}}, tensors=0, source="event"
    )
    MetricPoint.objects.bulk_create(
        MetricPoint(job=job, step=step + i, wall_time=timezone.now(), loss=2.5) for i in range(1, 6)
    )
    return CheckpointFactory(
        job=job,
        step=step,
        saved_at=timezone.now() - timedelta(minutes=30),
        last_proven_at=timezone.now() - timedelta(minutes=5) if proven else None,
        state_keys=["model", "optimizer", "scheduler", "rng", "data"],
        world_size=2,
    )


def _cycle(cluster: Cluster, seen: set[Any] | None = None, now: Any = None) -> Any:
    return recovery_cycle(cluster=cluster, seen=seen or set(), now=now or timezone.now())


# ------------------------------------------------------------------------- hang budget


def test_the_hang_budget_comes_from_the_jobs_own_steps_without_warm_up() -> None:
    # Three slow warm-up steps, then a step logged every 2 s with one slower one.
    wall = [0.0, 60.0, 120.0, 180.0] + [180.0 + 2 * i for i in range(1, 40)] + [262.0]
    budget = hang_budget(
        wall_times=wall, blocking_times=[0.0], factor=10, floor_s=5, startup_grace_s=900
    )
    assert not budget.startup and budget.p95_interval_s == 2.0
    assert budget.seconds == pytest.approx(20.0)


def test_the_floor_and_a_measured_save_are_added_never_a_false_hang_during_a_save() -> None:
    wall = [float(i) for i in range(50)]
    quick = hang_budget(
        wall_times=wall, blocking_times=[0.2], factor=10, floor_s=300, startup_grace_s=900
    )
    assert quick.seconds == pytest.approx(300 + 2.0)
    saving = hang_budget(
        wall_times=wall, blocking_times=[0.1, 45.0], factor=10, floor_s=30, startup_grace_s=900
    )
    assert saving.save_allowance_s == pytest.approx(450.0)
    assert saving.seconds == pytest.approx(30 + 450.0)


def test_a_job_without_steady_steps_gets_the_start_up_grace() -> None:
    budget = hang_budget(
        wall_times=[0.0, 10.0, 20.0], blocking_times=[], factor=10, floor_s=60, startup_grace_s=900
    )
    assert budget.startup and budget.seconds == 900


# ------------------------------------------------------------------------- crashes


def test_a_crash_resumes_from_the_newest_proven_checkpoint(
    cluster: Cluster, researcher: Any
) -> None:
    job = _failed_job(cluster, researcher)
    _checkpoint(job, 500, proven=False)
    newest_proven = _checkpoint(job, 600, proven=True)
    older = _checkpoint(job, 400, proven=True)
    # The unproven 500 is older than the proven 600: nothing to drill.
    result = _cycle(cluster)
    incident = Incident.objects.get(job=job)
    assert result.opened == 1 and incident.signal == Incident.Signal.CRASH
    assert incident.outcome == Incident.Outcome.RECOVERED
    resumed = incident.resumed_job
    assert resumed is not None and resumed.resume_from_id == newest_proven.pk
    assert resumed.parent_id == job.id and resumed.run_as == "alice"
    assert resumed.resume_from_id != older.pk
    assert incident.lost_steps == 130 and incident.lost_gpu_hours and incident.lost_gpu_hours > 0
    assert AuditEvent.objects.filter(action="recovery.resume", actor__isnull=True).count() == 1
    kinds = set(JobEvent.objects.filter(job=job).values_list("kind", flat=True))
    assert {"incident", "recovery"} <= kinds
    # Seen again next cycle: nothing more happens.
    again = _cycle(cluster)
    assert again.opened == 0 and Job.objects.filter(parent=job).count() == 1


def test_a_newer_unproven_checkpoint_is_drilled_first_and_used_when_it_passes(
    cluster: Cluster, researcher: Any
) -> None:
    job = _failed_job(cluster, researcher)
    _checkpoint(job, 600, proven=True)
    newer = _checkpoint(job, 700, proven=False)
    _cycle(cluster)
    incident = Incident.objects.get(job=job)
    assert incident.outcome == Incident.Outcome.PROVING
    drill = RestoreDrill.objects.get(pk=incident.proving_drill_id)
    assert drill.checkpoint_id == newer.pk and drill.trigger == RestoreDrill.Trigger.RECOVERY
    assert not Job.objects.filter(parent=job).exists()
    # Still drilling: nothing resumes.
    _cycle(cluster)
    assert not Job.objects.filter(parent=job).exists()
    RestoreDrill.objects.filter(pk=drill.pk).update(state="finished", verdict="passed")
    Checkpoint.objects.filter(pk=newer.pk).update(last_proven_at=timezone.now())
    _cycle(cluster)
    incident.refresh_from_db()
    assert incident.outcome == Incident.Outcome.RECOVERED
    assert incident.resumed_from_id == newer.pk


def test_a_newer_checkpoint_whose_drill_fails_is_skipped_for_the_proven_one_below(
    cluster: Cluster, researcher: Any
) -> None:
    job = _failed_job(cluster, researcher)
    proven = _checkpoint(job, 600, proven=True)
    damaged = _checkpoint(job, 700, proven=False)
    _cycle(cluster)
    incident = Incident.objects.get(job=job)
    RestoreDrill.objects.filter(pk=incident.proving_drill_id).update(
        state="finished", verdict="failed", reason="loss diverged at step 703"
    )
    # As the drill's end does: a failed drill fails the checkpoint's integrity, which
    # takes it out of the candidates (the skip is still written down, with the reason).
    Checkpoint.objects.filter(pk=damaged.pk).update(integrity=Checkpoint.Integrity.FAILED)
    _cycle(cluster)
    incident.refresh_from_db()
    assert incident.outcome == Incident.Outcome.RECOVERED
    assert incident.resumed_from_id == proven.pk
    assert "700" in incident.skipped and "diverged" in incident.skipped["700"]
    assert incident.resumed_job is not None
    assert incident.resumed_job.resume_from_id != damaged.pk


def test_without_a_proven_checkpoint_nothing_resumes(cluster: Cluster, researcher: Any) -> None:
    job = _failed_job(cluster, researcher)
    _checkpoint(job, 700, proven=False)
    _cycle(cluster)
    incident = Incident.objects.get(job=job)
    RestoreDrill.objects.filter(pk=incident.proving_drill_id).update(
        state="finished", verdict="inconclusive", reason="reference incomplete"
    )
    _cycle(cluster)
    incident.refresh_from_db()
    assert incident.outcome == Incident.Outcome.NOT_RECOVERED
    assert "never resumes from an unproven checkpoint" in incident.reason
    assert not Job.objects.filter(parent=job).exists()


def test_a_failed_integrity_check_or_a_removed_checkpoint_is_never_a_candidate(
    cluster: Cluster, researcher: Any
) -> None:
    job = _failed_job(cluster, researcher)
    good = _checkpoint(job, 300, proven=True)
    bad = _checkpoint(job, 600, proven=True)
    Checkpoint.objects.filter(pk=bad.pk).update(integrity=Checkpoint.Integrity.FAILED)
    gone = _checkpoint(job, 500, proven=True)
    Checkpoint.objects.filter(pk=gone.pk).update(deleted_at=timezone.now())
    _cycle(cluster)
    assert Incident.objects.get(job=job).resumed_from_id == good.pk


@pytest.mark.parametrize("state", ["completed", "cancelled", "lost", "running"])
def test_no_incident_without_a_failure_of_the_jobs_own(
    cluster: Cluster, researcher: Any, state: str
) -> None:
    # "lost" rests on Gantry's view of Slurm, not on the job: never evidence.
    job = _failed_job(cluster, researcher, state=state)
    _checkpoint(job, 600, proven=True)
    _cycle(cluster)
    assert not Incident.objects.filter(job=job).exists()


def test_a_job_whose_recovery_is_off_gets_an_incident_and_no_resume(
    cluster: Cluster, researcher: Any
) -> None:
    job = _failed_job(cluster, researcher, recovery={"enabled": False})
    _checkpoint(job, 600, proven=True)
    _cycle(cluster)
    incident = Incident.objects.get(job=job)
    assert incident.outcome == Incident.Outcome.NOT_RECOVERED
    assert not Job.objects.filter(parent=job).exists()


# ------------------------------------------------------------------------- loops


def test_attempts_are_counted_per_lineage_and_stop_at_the_policy(
    cluster: Cluster, researcher: Any
) -> None:
    RecoveryPolicy.objects.create(cluster=cluster, max_attempts=1)
    first = _failed_job(cluster, researcher)
    _checkpoint(first, 600, proven=True)
    _cycle(cluster)
    resumed = Incident.objects.get(job=first).resumed_job
    assert resumed is not None
    # The resumed job fails as well, having saved and proven a newer checkpoint.
    Job.objects.filter(pk=resumed.pk).update(
        state="failed",
        slurm_job_id="4243",
        ended_at=timezone.now(),
        files_final=True,
        last_step=820,
    )
    _checkpoint(resumed, 800, proven=True)
    _cycle(cluster)
    second = Incident.objects.get(job=resumed)
    assert second.outcome == Incident.Outcome.HELD and "most its policy allows (1)" in second.reason
    assert not Job.objects.filter(parent=resumed).exists()


def test_two_attempts_from_the_same_step_on_the_same_nodes_stop(
    cluster: Cluster, researcher: Any
) -> None:
    first = _failed_job(cluster, researcher)
    _checkpoint(first, 600, proven=True)
    _cycle(cluster)
    resumed = Incident.objects.get(job=first).resumed_job
    assert resumed is not None
    # It fails again before saving anything newer.
    Job.objects.filter(pk=resumed.pk).update(
        state="failed", slurm_job_id="4243", ended_at=timezone.now(), files_final=True
    )
    _cycle(cluster)
    second = Incident.objects.get(job=resumed)
    assert second.outcome == Incident.Outcome.HELD and "no progress" in second.reason


def test_the_resume_keeps_what_the_job_already_left_out(cluster: Cluster, researcher: Any) -> None:
    # The researcher left gpu-b-04 out themselves; recovery adds its suspect to that,
    # never replaces it.
    Node.objects.filter(cluster=cluster, name="gpu-b-02").update(state=Node.State.DOWN)
    job = _failed_job(cluster, researcher, state="node_fail", exclude_nodes="gpu-b-04")
    _checkpoint(job, 600, proven=True)
    _cycle(cluster)
    incident = Incident.objects.get(job=job)
    resumed = incident.resumed_job
    assert resumed is not None, incident.reason
    assert resumed.exclude_nodes == "gpu-b-02,gpu-b-04"
    assert "#SBATCH --exclude=gpu-b-02,gpu-b-04" in job_script(resumed)
    # What recovery itself left out, and why, is the suspect alone.
    assert incident.excluded_nodes == ["gpu-b-02"]


def test_a_node_failure_names_the_failed_node_and_the_resume_excludes_it(
    cluster: Cluster, researcher: Any
) -> None:
    Node.objects.filter(cluster=cluster, name="gpu-b-02").update(state=Node.State.DOWN)
    job = _failed_job(cluster, researcher, state="node_fail")
    _checkpoint(job, 600, proven=True)
    _cycle(cluster)
    incident = Incident.objects.get(job=job)
    assert incident.signal == Incident.Signal.NODE_FAILURE
    assert incident.suspect_nodes == ["gpu-b-02"]
    assert SuspectNode.objects.get(incident=incident).node.name == "gpu-b-02"
    resumed = incident.resumed_job
    assert resumed is not None and resumed.exclude_nodes == "gpu-b-02"
    assert "#SBATCH --exclude=gpu-b-02" in job_script(resumed)
    assert incident.excluded_nodes == ["gpu-b-02"]
    # The resumed job's page says what it leaves out and why.
    from django.test import Client

    page = Client()
    page.force_login(researcher)
    html = page.get(f"/jobs/{resumed.id}/").content.decode()
    assert "leaving out gpu-b-02" in html
    assert "NODE_FAIL; gpu-b-02 was down" in html


def test_a_failure_with_no_node_at_fault_names_no_suspect(
    cluster: Cluster, researcher: Any
) -> None:
    job = _failed_job(cluster, researcher, state="node_fail")
    _checkpoint(job, 600, proven=True)
    now = timezone.now()
    _cycle(cluster, now=now)
    incident = Incident.objects.get(job=job)
    # No node shows down yet: it asks for a fresh view of the nodes and waits for it.
    assert incident.resumed_job is None and incident.evidence["node_sync_requested"]
    Cluster.objects.filter(pk=cluster.pk).update(last_sync_ok_at=now + timedelta(seconds=5))
    _cycle(cluster, now=now + timedelta(seconds=6))
    incident.refresh_from_db()
    assert incident.suspect_nodes == [] and not SuspectNode.objects.exists()
    assert incident.resumed_job is not None and incident.resumed_job.exclude_nodes == ""


def test_a_node_the_sync_after_the_failure_shows_down_is_named_and_left_out(
    cluster: Cluster, researcher: Any
) -> None:
    job = _failed_job(cluster, researcher, state="node_fail")
    _checkpoint(job, 600, proven=True)
    now = timezone.now()
    _cycle(cluster, now=now)
    # The sync Gantry asked for sees what Slurm saw (slurmd stopped answering on gpu-b-01).
    Node.objects.filter(cluster=cluster, name="gpu-b-01").update(state=Node.State.DOWN)
    Cluster.objects.filter(pk=cluster.pk).update(last_sync_ok_at=now + timedelta(seconds=5))
    _cycle(cluster, now=now + timedelta(seconds=6))
    incident = Incident.objects.get(job=job)
    assert incident.suspect_nodes == ["gpu-b-01"]
    assert incident.resumed_job is not None and incident.resumed_job.exclude_nodes == "gpu-b-01"


def test_without_a_fresh_view_of_the_nodes_a_node_failure_resumes_after_the_wait(
    cluster: Cluster, researcher: Any
) -> None:
    job = _failed_job(cluster, researcher, state="node_fail")
    _checkpoint(job, 600, proven=True)
    now = timezone.now()
    _cycle(cluster, now=now)
    _cycle(cluster, now=now + timedelta(minutes=3))
    incident = Incident.objects.get(job=job)
    assert incident.resumed_job is not None and incident.suspect_nodes == []


def test_a_second_watcher_advancing_the_same_incident_resumes_once(
    cluster: Cluster, researcher: Any
) -> None:
    from recovery.resume import _resume

    job = _failed_job(cluster, researcher)
    checkpoint = _checkpoint(job, 600, proven=True)
    RecoveryPolicy.objects.create(cluster=cluster, enabled=False)
    _cycle(cluster)
    incident = Incident.objects.get(job=job)
    Incident.objects.filter(pk=incident.pk).update(outcome=Incident.Outcome.OPEN)
    one = Incident.objects.get(pk=incident.pk)
    two = Incident.objects.get(pk=incident.pk)
    now = timezone.now()
    assert _resume(one, job, checkpoint, [], now) is True
    assert _resume(two, job, checkpoint, [], now) is False
    assert Job.objects.filter(parent=job).count() == 1


# ------------------------------------------------------------------------- hangs


def _running_job(cluster: Cluster, owner: Any, **values: Any) -> Job:
    job = _failed_job(
        cluster,
        owner,
        state="running",
        ended_at=None,
        files_final=False,
        metrics_offset=5000,
        **values,
    )
    start = timezone.now() - timedelta(hours=1)
    MetricPoint.objects.bulk_create(
        MetricPoint(
            job=job,
            step=10 * i,
            wall_time=start + timedelta(seconds=2 * i),
            loss=3.0,
            checkpoint_blocking_s=0.0,
        )
        for i in range(1, 60)
    )
    return job


def test_a_job_quiet_past_its_budget_while_gantry_sees_its_directory_is_a_hang(
    cluster: Cluster, researcher: Any, cancels: list[str]
) -> None:
    RecoveryPolicy.objects.create(cluster=cluster, hang_floor_seconds=60)
    job = _running_job(cluster, researcher)
    _checkpoint(job, 500, proven=True)
    start = timezone.now()
    _cycle(cluster, seen={job.id}, now=start)
    assert JobProgress.objects.get(job=job).grew_at == start
    # Within the budget (max(10 × 2 s, 60 s) = 60 s): no hang.
    _cycle(cluster, seen={job.id}, now=start + timedelta(seconds=50))
    assert not Incident.objects.exists()
    later = start + timedelta(seconds=90)
    _cycle(cluster, seen={job.id}, now=later)
    incident = Incident.objects.get(job=job)
    assert incident.signal == Incident.Signal.HANG
    assert incident.time_to_detect_s == pytest.approx(90)
    assert incident.evidence["budget_s"] == pytest.approx(60)
    assert incident.evidence["p95_interval_s"] == pytest.approx(2.0)
    # What is left of it is cancelled; it resumes once Slurm has ended it.
    assert cancels == [str(job.id)]
    assert AuditEvent.objects.filter(action="recovery.cancel").count() == 1
    Job.objects.filter(pk=job.pk).update(state="cancelled", ended_at=later, files_final=True)
    # Nobody named: it waits for a view of the nodes newer than the hang (one sync asked).
    _cycle(cluster, seen=set(), now=later + timedelta(seconds=5))
    incident.refresh_from_db()
    assert incident.outcome == Incident.Outcome.OPEN and incident.evidence["node_sync_requested"]
    Cluster.objects.filter(pk=cluster.pk).update(last_sync_ok_at=later + timedelta(seconds=6))
    _cycle(cluster, seen=set(), now=later + timedelta(seconds=7))
    incident.refresh_from_db()
    assert incident.outcome == Incident.Outcome.RECOVERED and incident.cancelled_at == later
    assert incident.suspect_nodes == []


def test_a_job_gantry_could_not_see_is_never_a_hang(
    cluster: Cluster, researcher: Any, cancels: list[str]
) -> None:
    """SSH time-outs, a listing that did not reach the directory: the job is not in
    ``seen``; however long that lasts, it is no evidence."""
    RecoveryPolicy.objects.create(cluster=cluster, hang_floor_seconds=60)
    job = _running_job(cluster, researcher)
    start = timezone.now()
    _cycle(cluster, seen={job.id}, now=start)
    for minutes in range(1, 120, 7):
        _cycle(cluster, seen=set(), now=start + timedelta(minutes=minutes))
    assert not Incident.objects.exists() and cancels == []


def test_growing_metrics_keep_a_slow_job_alive(
    cluster: Cluster, researcher: Any, cancels: list[str]
) -> None:
    RecoveryPolicy.objects.create(cluster=cluster, hang_floor_seconds=60)
    job = _running_job(cluster, researcher)
    start = timezone.now()
    for minute in range(0, 30):
        Job.objects.filter(pk=job.pk).update(metrics_offset=5000 + minute)
        _cycle(cluster, seen={job.id}, now=start + timedelta(seconds=55 * minute))
    assert not Incident.objects.exists()


def test_notify_only_leaves_a_hung_job_running(
    cluster: Cluster, researcher: Any, cancels: list[str]
) -> None:
    RecoveryPolicy.objects.create(cluster=cluster, hang_floor_seconds=60, on_hang="notify")
    job = _running_job(cluster, researcher)
    start = timezone.now()
    _cycle(cluster, seen={job.id}, now=start)
    _cycle(cluster, seen={job.id}, now=start + timedelta(seconds=120))
    incident = Incident.objects.get(job=job)
    assert incident.outcome == Incident.Outcome.NOTIFIED and cancels == []


def test_a_diverged_run_resumes_from_a_proven_checkpoint_before_the_divergence(
    cluster: Cluster, researcher: Any, cancels: list[str]
) -> None:
    from jobs.ingest import metrics_ingest

    job = _running_job(cluster, researcher)
    _checkpoint(job, 600, proven=True)
    # Saved after the loss went NaN: never a candidate, proven or not.
    _checkpoint(job, 620, proven=True)
    line = b'{"step": 610, "time": 1700000000.0, "loss": NaN, "step_time": 0.1}\n'
    job.refresh_from_db()
    metrics_ingest(job=job, data=line, start_offset=job.metrics_offset)
    job.refresh_from_db()
    assert job.nonfinite_loss_step == 610
    now = timezone.now()
    _cycle(cluster, seen={job.id}, now=now)
    incident = Incident.objects.get(job=job)
    assert incident.signal == Incident.Signal.NONFINITE_LOSS and cancels == [str(job.id)]
    Job.objects.filter(pk=job.pk).update(state="cancelled", ended_at=now, files_final=True)
    _cycle(cluster, now=now + timedelta(seconds=2))
    incident.refresh_from_db()
    assert incident.outcome == Incident.Outcome.RECOVERED
    assert incident.resumed_from is not None and incident.resumed_from.step == 600


def test_a_straggler_is_named_with_its_node_and_left_out_of_the_resume(
    cluster: Cluster, researcher: Any, cancels: list[str]
) -> None:
    from jobs.stragglers import STRAGGLER_STREAK

    job = _running_job(cluster, researcher)
    _checkpoint(job, 500, proven=True)
    Job.objects.filter(pk=job.pk).update(
        rank_timing={
            "streaks": {
                "1": {
                    "node": "gpu-b-02",
                    "streak": STRAGGLER_STREAK,
                    "ratio": 2.1,
                    "since_step": 400,
                }
            }
        }
    )
    now = timezone.now()
    _cycle(cluster, seen={job.id}, now=now)
    incident = Incident.objects.get(job=job)
    assert incident.signal == Incident.Signal.STRAGGLER and "rank 1 on gpu-b-02" in incident.detail
    assert incident.suspect_nodes == ["gpu-b-02"] and cancels == [str(job.id)]
    Job.objects.filter(pk=job.pk).update(state="cancelled", ended_at=now, files_final=True)
    _cycle(cluster, now=now + timedelta(seconds=3))
    incident.refresh_from_db()
    assert incident.resumed_job is not None and incident.resumed_job.exclude_nodes == "gpu-b-02"


def test_a_straggler_is_only_reported_where_suspects_are_not_left_out(
    cluster: Cluster, researcher: Any, cancels: list[str]
) -> None:
    from jobs.stragglers import STRAGGLER_STREAK

    job = _running_job(cluster, researcher, recovery={"exclude_suspects": False})
    Job.objects.filter(pk=job.pk).update(
        rank_timing={"streaks": {"0": {"node": "gpu-b-01", "streak": STRAGGLER_STREAK}}}
    )
    _cycle(cluster, seen={job.id})
    incident = Incident.objects.get(job=job)
    assert incident.outcome == Incident.Outcome.NOTIFIED and cancels == []


def test_a_job_recovery_stopped_counts_as_an_interruption_only_on_health_evidence(
    cluster: Cluster, researcher: Any, cancels: list[str]
) -> None:
    """A hang is the job's own metrics going quiet: by itself it does not move everyone's
    checkpoint advice; with the health probe finding one of its nodes critical meanwhile,
    it does."""
    from health.models import HealthEvent
    from jobs.goodput.selectors import _failure_history

    RecoveryPolicy.objects.create(cluster=cluster, hang_floor_seconds=60)
    job = _running_job(cluster, researcher)
    before = _failure_history(cluster_id=cluster.pk).interruptions
    start = timezone.now()
    _cycle(cluster, seen={job.id}, now=start)
    _cycle(cluster, seen={job.id}, now=start + timedelta(seconds=120))
    Job.objects.filter(pk=job.pk).update(state="cancelled", ended_at=start + timedelta(seconds=121))
    assert Incident.objects.filter(job=job, signal=Incident.Signal.HANG).exists()
    assert _failure_history(cluster_id=cluster.pk).interruptions == before
    HealthEvent.objects.create(
        node=Node.objects.get(cluster=cluster, name="gpu-b-02"),
        at=start + timedelta(seconds=60),
        from_state="ok",
        to_state="critical",
        reason="XID 79: GPU fell off the bus",
    )
    assert _failure_history(cluster_id=cluster.pk).interruptions == before + 1


def test_a_self_attested_pass_is_no_proof_to_resume_from(cluster: Cluster, researcher: Any) -> None:
    job = _failed_job(cluster, researcher)
    proven = _checkpoint(job, 600, proven=True)
    _checkpoint(job, 700, proven=False)
    _cycle(cluster)
    incident = Incident.objects.get(job=job)
    # The drill ran as the owner (no verifier): it passed, and nothing was proven by it.
    RestoreDrill.objects.filter(pk=incident.proving_drill_id).update(
        state="finished", verdict="passed", attestation="self"
    )
    _cycle(cluster)
    incident.refresh_from_db()
    assert incident.resumed_from_id == proven.pk
    assert "self-attested" in incident.skipped["700"]
