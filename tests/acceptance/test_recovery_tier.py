"""The recovery tier's state machine: the training job it submits through the jobs app
(as the operator's account, on the set, with the rank fault and recovery on), then what
recovery does with it (incidents written here as the recovery app writes them), the drill
it asks the drills service for, its criteria, the time bound, and the clean-up of the
lineage at the end and on cancel. No Slurm here: cancelling a job that reached Slurm is
recorded instead (the dev-cluster test cancels for real)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from acceptance_support import a100_cluster
from django.test import Client
from django.utils import timezone
from recovery_support import crash_incident

from acceptance.models import AcceptanceRun, Certificate, RecoveryTrial
from acceptance.orchestrate import run_advance
from acceptance.recovery_tier import FAULT_STEP, TOTAL_STEPS
from acceptance.services import RunRequest, acceptance_run_cancel, acceptance_run_start
from core.errors import FieldError
from core.models import AuditEvent
from drills.models import RestoreDrill
from factories import CheckpointFactory, NodeFactory
from jobs.lifecycle import JOBS
from jobs.models import Checkpoint, Job, MetricPoint, StateFingerprint
from jobs.services import job_resume
from nodes.models import Cluster
from recovery.models import Incident, SuspectNode

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster() -> Cluster:
    cluster = a100_cluster()
    # A node of the partition outside the set: the job (and its resume) must leave it out.
    NodeFactory(cluster=cluster, name="n5", partitions=["train"])
    Cluster.objects.filter(pk=cluster.pk).update(verifier_account="verifier")
    cluster.refresh_from_db()
    return cluster


@pytest.fixture
def cancels(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Jobs that reached Slurm are cancelled with scancel: recorded here instead."""
    sent: list[str] = []
    real = JOBS.cancel

    def cancel(obj: Job, *, by: str, audit: Any) -> str:
        if not obj.slurm_job_id:
            return real(obj, by=by, audit=audit)
        sent.append(str(obj.id))
        audit(obj)
        return "scancel sent"

    monkeypatch.setattr(JOBS, "cancel", cancel)
    return sent


def _start(operator: Any, cluster: Cluster, **options: Any) -> AcceptanceRun:
    request = RunRequest(
        cluster_id=cluster.pk, scope="nodes", value="n[1-4]", tiers=["recovery"], options=options
    )
    return acceptance_run_start(actor=operator, request=request)


def _advance(run: AcceptanceRun, now: Any = None) -> AcceptanceRun:
    run_advance(run_id=run.id, now=now or timezone.now())
    run.refresh_from_db()
    return run


def _crashed(job: Job) -> Job:
    """The job ran, its last rank died at the fault step: Slurm ended it failed."""
    Job.objects.filter(pk=job.pk).update(
        state=Job.State.FAILED,
        slurm_job_id="5001",
        started_at=timezone.now() - timedelta(minutes=5),
        ended_at=timezone.now() - timedelta(seconds=30),
        exit_code=42,
        last_step=FAULT_STEP - 1,
        files_final=True,
        allocated_nodes="n[1-4]",
    )
    job.refresh_from_db()
    return job


def _checkpoint(job: Job, step: int, *, proven: bool = False) -> Checkpoint:
    StateFingerprint.objects.create(
        job=job, step=step, data={"tensors": {}}, tensors=0, source="event"
    )
    return CheckpointFactory(
        job=job,
        step=step,
        saved_at=timezone.now() - timedelta(minutes=2),
        last_proven_at=timezone.now() if proven else None,
        state_keys=["model", "optimizer", "scheduler", "rng", "data"],
        world_size=8,
    )


def _incident(job: Job, **values: Any) -> Incident:
    now = timezone.now()
    timing = {"stopped_at": now - timedelta(seconds=30), "detected_at": now - timedelta(seconds=20)}
    return crash_incident(job, **{**timing, **values})  # type: ignore[no-any-return]


def _recovered(job: Job, operator: Any) -> tuple[Incident, Job]:
    """What recovery does: the newest checkpoint proven by its drill, a resume of it."""
    for step in range(1, FAULT_STEP):
        MetricPoint.objects.create(job=job, step=step, wall_time=timezone.now(), loss=2.0)
    proven = _checkpoint(job, 40, proven=True)
    RestoreDrill.objects.create(
        checkpoint=proven,
        cluster=job.cluster,
        trigger=RestoreDrill.Trigger.RECOVERY,
        state=RestoreDrill.State.FINISHED,
        verdict=RestoreDrill.Verdict.PASSED,
        allocation_key="proving",
    )
    incident = _incident(job)
    suspicion = SuspectNode.objects.create(
        node=job.cluster.nodes.get(name="n4"),
        incident=incident,
        evidence="job 5001: srun reported task 7 on n4 first: Exited with exit code 42 "
        "(the job's output file)",
    )
    incident.suspect_nodes = ["n4"]
    resumed = job_resume(
        actor=operator,
        checkpoint=proven,
        name=f"{job.name} (recovered @40)",
        origin={"by": "recovery", "incident": incident.pk},
    )
    Job.objects.filter(pk=resumed.pk).update(state=Job.State.RUNNING, slurm_job_id="5002")
    Incident.objects.filter(pk=incident.pk).update(
        outcome=Incident.Outcome.RECOVERED,
        resumed_from=proven,
        resumed_job=resumed,
        lost_steps=9,
        lost_gpu_hours=0.0125,
        resumed_at=timezone.now(),
        closed_at=timezone.now(),
        reason=f"resumed from step 40 (proven) as job {resumed.id}",
    )
    assert suspicion.cleared_at is None
    incident.refresh_from_db()
    resumed.refresh_from_db()
    return incident, resumed


def test_the_tier_submits_a_real_job_on_the_set_as_the_operator(
    operator: Any, cluster: Cluster
) -> None:
    run = _start(operator, cluster)
    assert run.current_tier == "recovery"
    trial = RecoveryTrial.objects.get(run=run)
    job = Job.objects.get(pk=trial.job_id)
    assert (job.owner, job.run_as, job.state) == (operator, "carol", Job.State.QUEUED)
    assert (job.nodes, job.tasks_per_node, job.gpus_per_node) == (4, 2, 2)
    assert job.nodelist_requested == "n[1-4]" and job.exclude_nodes == "n5"
    assert job.environment == {"TRAINER_FAULT": f"exit_rank@{FAULT_STEP}"}
    assert job.recovery == {"enabled": True, "exclude_suspects": False, "max_attempts": 1}
    assert job.config["steps"] == TOTAL_STEPS and job.config["log_every"] == 1
    assert job.config["checkpoint_async"] is False
    submitted = AuditEvent.objects.get(action="job.submit", target_id=str(job.id))
    assert submitted.actor == operator and submitted.details["acceptance_run"] == str(run.id)
    # Advancing again submits nothing more: one job per run.
    _advance(run)
    assert Job.objects.count() == 1 and "reach step 50" in RecoveryTrial.objects.get(run=run).stage


def test_recovered_and_drilled_passes_with_its_figures_and_cleans_up(
    operator: Any, cluster: Cluster, cancels: list[str]
) -> None:
    run = _start(operator, cluster, recovery_max_seconds=600, recovery_max_lost_steps=20)
    job = _crashed(Job.objects.get(pk=RecoveryTrial.objects.get(run=run).job_id))
    incident = _incident(job, outcome=Incident.Outcome.PROVING)
    _advance(run)
    assert "settle its incident" in RecoveryTrial.objects.get(run=run).stage
    incident.delete()
    incident, resumed = _recovered(job, operator)
    _advance(run)
    assert RecoveryTrial.objects.get(run=run).stage == "the resumed job's first step"
    first_step_at = incident.detected_at + timedelta(seconds=95)
    for step in range(41, 86):
        MetricPoint.objects.create(
            job=resumed, step=step, wall_time=first_step_at + timedelta(seconds=step - 41), loss=2.0
        )
    _advance(run)
    assert "checkpoint of the resumed job" in RecoveryTrial.objects.get(run=run).stage
    drilled = _checkpoint(resumed, 60)
    _advance(run)
    # One checkpoint only and the job still running: wait for the next (the drill's end).
    assert RecoveryTrial.objects.get(run=run).drill_id is None
    _checkpoint(resumed, 80)
    _advance(run)
    trial = RecoveryTrial.objects.get(run=run)
    drill = RestoreDrill.objects.get(pk=trial.drill_id)
    assert drill.checkpoint == drilled and drill.replay_to_step == 80
    assert drill.requested_by == operator and drill.attestation == "verifier"
    assert run.state == "running"
    RestoreDrill.objects.filter(pk=drill.pk).update(
        state=RestoreDrill.State.FINISHED, verdict=RestoreDrill.Verdict.PASSED
    )
    run = _advance(run)
    assert (run.state, run.verdict) == ("finished", "passed"), run.reason
    outcome = run.outcomes["recovery"]
    criteria = {c["name"]: c for c in outcome["criteria"]}
    assert criteria["recovered"]["verdict"] == "passed"
    assert criteria["time_to_recover_s"]["measured"] == pytest.approx(95.0)
    assert criteria["time_to_recover_s"]["threshold"] == 600
    assert (criteria["lost_steps"]["measured"], criteria["lost_steps"]["verdict"]) == (9, "passed")
    assert criteria["lost_steps"]["lost_gpu_hours"] == 0.0125
    assert criteria["restore_drill"]["verdict"] == "passed"
    assert outcome["resumed_from_step"] == 40 and outcome["proving_drill"]["verdict"] == "passed"
    # The lineage is ended: the resumed job (in Slurm) cancelled, audited for the run.
    assert cancels == [str(resumed.id)]
    cancel = AuditEvent.objects.get(action="job.cancel", target_id=str(resumed.id))
    assert cancel.details["acceptance_run"] == str(run.id)
    # The node the injected crash named is no suspect.
    assert SuspectNode.objects.get(incident=incident).cleared_at is not None
    assert AuditEvent.objects.filter(action="suspect_node.clear").exists()
    document = Certificate.objects.get(run=run).document["recovery"]
    assert document["verdict"] == "passed" and document["fault"] == f"exit_rank@{FAULT_STEP}"
    assert document["figures"]["time_to_recover_s"] == pytest.approx(95.0)
    assert [c["name"] for c in document["criteria"]] == [
        "recovered",
        "time_to_recover_s",
        "lost_steps",
        "restore_drill",
    ]


def test_without_thresholds_the_figures_are_recorded_but_not_judged(
    operator: Any, cluster: Cluster, cancels: list[str]
) -> None:
    run = _start(operator, cluster)
    job = _crashed(Job.objects.get(pk=RecoveryTrial.objects.get(run=run).job_id))
    _, resumed = _recovered(job, operator)
    MetricPoint.objects.create(job=resumed, step=41, wall_time=timezone.now(), loss=2.0)
    Job.objects.filter(pk=resumed.pk).update(state=Job.State.COMPLETED)
    # It ended (completed) with one checkpoint after the one it resumed from: drilled over
    # the steps it logged after it (by loss: no later checkpoint holds the state).
    for step in range(42, 71):
        MetricPoint.objects.create(job=resumed, step=step, wall_time=timezone.now(), loss=2.0)
    _checkpoint(resumed, 60)
    _advance(run)
    drill = RestoreDrill.objects.get(pk=RecoveryTrial.objects.get(run=run).drill_id)
    RestoreDrill.objects.filter(pk=drill.pk).update(
        state=RestoreDrill.State.FINISHED,
        verdict=RestoreDrill.Verdict.FAILED,
        reason="loss diverged",
    )
    run = _advance(run)
    criteria = {c["name"]: c for c in run.outcomes["recovery"]["criteria"]}
    assert criteria["time_to_recover_s"]["verdict"] == "inconclusive"
    assert criteria["time_to_recover_s"]["measured"] is not None
    assert criteria["restore_drill"]["verdict"] == "failed"
    assert run.verdict == "failed" and "loss diverged" in run.reason


def test_held_is_a_failure_with_recoverys_reason(
    operator: Any, cluster: Cluster, cancels: list[str]
) -> None:
    run = _start(operator, cluster)
    job = _crashed(Job.objects.get(pk=RecoveryTrial.objects.get(run=run).job_id))
    _incident(
        job,
        outcome=Incident.Outcome.NOT_RECOVERED,
        reason="no checkpoint of this run is proven to restore",
        closed_at=timezone.now(),
    )
    run = _advance(run)
    assert (run.state, run.verdict) == ("finished", "failed")
    assert run.outcomes["recovery"]["verdict"] == "failed"
    assert "no checkpoint of this run is proven" in run.reason
    assert run.outcomes["recovery"]["criteria"][0]["verdict"] == "failed"
    assert cancels == []


def test_no_incident_long_after_the_crash_fails(operator: Any, cluster: Cluster) -> None:
    run = _start(operator, cluster)
    job = _crashed(Job.objects.get(pk=RecoveryTrial.objects.get(run=run).job_id))
    assert _advance(run).state == "running"
    run = _advance(run, now=job.ended_at + timedelta(minutes=11))
    assert run.verdict == "failed" and "opened no incident" in run.reason


def test_past_its_time_the_tier_is_inconclusive_and_ends_the_lineage(
    operator: Any, cluster: Cluster, cancels: list[str]
) -> None:
    run = _start(operator, cluster, recovery_minutes=10)
    job = _crashed(Job.objects.get(pk=RecoveryTrial.objects.get(run=run).job_id))
    incident = _incident(job, outcome=Incident.Outcome.PROVING)
    run = _advance(run, now=timezone.now() + timedelta(minutes=5))
    assert run.state == "running"
    run = _advance(run, now=timezone.now() + timedelta(minutes=11))
    assert (run.state, run.verdict) == ("finished", "inconclusive")
    assert "timed out after 10 minutes waiting for recovery to settle its incident" in run.reason
    # Nothing more is resumed after the tier: the open incident is held.
    incident.refresh_from_db()
    assert incident.outcome == Incident.Outcome.HELD and "acceptance run" in incident.reason
    assert RecoveryTrial.objects.get(run=run).cleaned_up_at is not None


def test_cancelling_the_run_ends_the_lineage_and_the_drill(
    operator: Any, cluster: Cluster, cancels: list[str]
) -> None:
    run = _start(operator, cluster)
    trial = RecoveryTrial.objects.get(run=run)
    job = _crashed(Job.objects.get(pk=trial.job_id))
    _, resumed = _recovered(job, operator)
    drill = RestoreDrill.objects.create(
        checkpoint=_checkpoint(resumed, 60),
        cluster=cluster,
        allocation_key="tier",
        requested_by=operator,
    )
    RecoveryTrial.objects.filter(pk=trial.pk).update(drill=drill)
    assert acceptance_run_cancel(actor=operator, run=run) == "cancelled"
    assert cancels == [str(resumed.id)]
    drill.refresh_from_db()
    assert drill.state == RestoreDrill.State.CANCELLED
    assert AuditEvent.objects.get(action="drill.cancel", target_id=str(drill.id)).actor == operator
    assert RecoveryTrial.objects.get(pk=trial.pk).cleaned_up_at is not None
    # A second cancel, or a cycle, cleans nothing twice.
    assert acceptance_run_cancel(actor=operator, run=run).startswith("already")
    assert cancels == [str(resumed.id)]


def test_a_queued_job_is_cancelled_with_the_run(operator: Any, cluster: Cluster) -> None:
    run = _start(operator, cluster)
    job = Job.objects.get(pk=RecoveryTrial.objects.get(run=run).job_id)
    acceptance_run_cancel(actor=operator, run=run)
    job.refresh_from_db()
    assert job.state == Job.State.CANCELLED


def test_the_recovery_tier_is_refused_at_start_without_what_it_needs(
    operator: Any, operator_api: Any
) -> None:
    cluster = a100_cluster()
    with pytest.raises(FieldError) as refused:
        _start(operator, cluster)
    assert refused.value.field == "tiers" and "verifier" in refused.value.why
    Cluster.objects.filter(pk=cluster.pk).update(verifier_account="verifier")
    url = "/api/v1/acceptance/runs/start/"
    body = {"cluster": cluster.pk, "scope": "nodes", "value": "n[1-2]", "tiers": ["recovery"]}
    for bad in ({"recovery_minutes": 5}, {"recovery_max_seconds": "60"}, {"recovery_x": 1}):
        response = operator_api.post(url, {**body, "options": bad}, format="json")
        assert response.status_code == 400, (bad, response.json())
    for bad in ({"sustained_minutes": 0}, {"sustained_minutes": 61}, {"sustained_minutes": True}):
        response = operator_api.post(url, {**body, "options": bad}, format="json")
        assert response.status_code == 400
        assert "options.sustained_minutes" in response.json()["extra"]["fields"]
    assert not AcceptanceRun.objects.exists()


def test_the_run_page_shows_the_recovery_stage_and_criteria(
    operator: Any, cluster: Cluster, cancels: list[str]
) -> None:
    run = _start(operator, cluster)
    client = Client()
    client.force_login(operator)
    html = client.get(f"/acceptance/{run.id}/").content.decode()
    assert "waiting for the training job to reach step 50" in html
    job = _crashed(Job.objects.get(pk=RecoveryTrial.objects.get(run=run).job_id))
    _incident(
        job, outcome=Incident.Outcome.HELD, reason="two attempts in a row", closed_at=timezone.now()
    )
    _advance(run)
    html = client.get(f"/acceptance/{run.id}/").content.decode()
    section = html.split('id="acceptance-recovery-criteria"')[1]
    assert 'data-criterion="recovered"' in section and "two attempts in a row" in section
    assert f"/jobs/{job.id}/" in html
