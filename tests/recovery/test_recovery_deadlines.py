"""Recovery, II: the newest checkpoint proven even when the run died right after saving it
(the level state-exact, no replay), and every step of an incident with a deadline and an
exit (cancel, node view, proving drill, resume), told to people when a deadline passes.

A cluster of a shape the dev cluster does not have (``conftest.cluster``); the lifecycle's
cancel is replaced by a recorder (``cancels``) where a job must be cancelled.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from drills.lifecycle import DRILLS, drill_script_spec
from drills.models import RestoreDrill
from factories import CheckpointFactory, JobFactory
from jobs import checkpoint_state
from jobs.models import Checkpoint, Job, MetricPoint, StateFingerprint
from nodes.models import Cluster, Node
from notifications.sources import incidents as incident_events
from notifications.topics import EventKind
from recovery.cycle import recovery_cycle
from recovery.models import Incident, RecoveryPolicy
from runs.runtime import render_sbatch

pytestmark = pytest.mark.django_db


def _failed_job(cluster: Cluster, owner: Any, **values: Any) -> Job:
    now = timezone.now()
    defaults: dict[str, Any] = {
        "owner": owner,
        "cluster": cluster,
        "partition": "train",
        "nodes": 2,
        "gpus_per_node": 1,
        "run_as": "alice",
        "slurm_job_id": "5151",
        "state": "failed",
        "started_at": now - timedelta(hours=1),
        "ended_at": now - timedelta(seconds=10),
        "files_final": True,
        "last_step": 800,
        "allocated_nodes": "gpu-b-[03-04]",
        "config": {"preset": "tiny", "steps": 1000, "checkpoint_every": 100},
    }
    defaults.update(values)
    return JobFactory(**defaults)


def _checkpoint(job: Job, step: int, *, logged_after: int, proven: bool = False) -> Checkpoint:
    """A checkpoint whose fingerprint Gantry holds, with ``logged_after`` steps logged after
    it (0: the run died right after saving it)."""
    StateFingerprint.objects.create(
        job=job, step=step, data={"tensors": {}}, tensors=0, source="event"
    )
    MetricPoint.objects.bulk_create(
        MetricPoint(job=job, step=step + i, wall_time=timezone.now(), loss=2.5)
        for i in range(1, logged_after + 1)
    )
    return CheckpointFactory(
        job=job,
        step=step,
        saved_at=timezone.now() - timedelta(minutes=3),
        last_proven_at=timezone.now() - timedelta(minutes=20) if proven else None,
        state_keys=["model", "optimizer", "scheduler", "rng", "data"],
        world_size=2,
    )


def _cycle(cluster: Cluster, now: Any = None) -> Any:
    return recovery_cycle(cluster=cluster, seen=set(), now=now or timezone.now())


def _pass(drill: RestoreDrill) -> None:
    """The drill's verifier-attested pass, recorded as ``DRILLS.apply_report`` does."""
    RestoreDrill.objects.filter(pk=drill.pk).update(state="finished", verdict="passed")
    if drill.level == RestoreDrill.Level.STATE_EXACT:
        checkpoint_state.checkpoint_state_proof_record(
            checkpoint_id=drill.checkpoint_id, now=timezone.now()
        )
    else:
        checkpoint_state.checkpoint_proof_record(
            checkpoint_id=drill.checkpoint_id, now=timezone.now()
        )


def _policy(cluster: Cluster, **values: Any) -> RecoveryPolicy:
    policy, _ = RecoveryPolicy.objects.get_or_create(cluster=cluster)
    for key, value in values.items():
        setattr(policy, key, value)
    policy.save()
    return policy


# ----------------------------------------------------------- state-exact, no replay


def test_a_checkpoint_with_nothing_logged_after_it_is_proven_state_exact_and_resumed_from(
    cluster: Cluster, researcher: Any
) -> None:
    job = _failed_job(cluster, researcher, last_step=800)
    _checkpoint(job, 700, logged_after=5, proven=True)
    newest = _checkpoint(job, 800, logged_after=0)
    _cycle(cluster)
    incident = Incident.objects.get(job=job)
    assert incident.outcome == Incident.Outcome.PROVING, incident.reason
    drill = RestoreDrill.objects.get(pk=incident.proving_drill_id)
    assert drill.checkpoint_id == newest.pk
    assert drill.level == RestoreDrill.Level.STATE_EXACT and drill.steps == 0
    assert drill.replay_to_step is None
    step = incident.steps[-1]
    assert step["name"] == "prove step 800" and step["deadline_at"] and not step["ended_at"]
    _pass(drill)
    _cycle(cluster)
    incident.refresh_from_db()
    newest.refresh_from_db()
    assert incident.outcome == Incident.Outcome.RECOVERED, incident.reason
    assert incident.resumed_from_id == newest.pk and incident.lost_steps == 0
    assert incident.resumed_proof == "state_exact"
    assert "state-exact, no replay" in incident.reason
    # Never blurred with a full pass: the checkpoint holds the level apart.
    assert newest.last_proven_at is None and newest.state_proven_at is not None
    assert newest.proof_level == "state_exact"
    assert not checkpoint_state.proven(Checkpoint.objects.filter(pk=newest.pk)).exists()
    names = [s["name"] for s in incident.steps]
    assert names == ["prove step 800", "resume"]
    assert incident.steps[0]["outcome"].startswith("proven (state-exact, no replay)")


def test_a_few_steps_logged_after_it_are_replayed_and_compared_at_that_level(
    cluster: Cluster, researcher: Any
) -> None:
    job = _failed_job(cluster, researcher, last_step=802)
    _checkpoint(job, 700, logged_after=5, proven=True)
    _checkpoint(job, 800, logged_after=2)
    _cycle(cluster)
    drill = RestoreDrill.objects.get(pk=Incident.objects.get(job=job).proving_drill_id)
    assert drill.level == RestoreDrill.Level.STATE_EXACT and drill.steps == 2


def test_operators_can_require_a_replay(cluster: Cluster, researcher: Any) -> None:
    _policy(cluster, state_exact_resume=False)
    job = _failed_job(cluster, researcher)
    older = _checkpoint(job, 700, logged_after=5, proven=True)
    _checkpoint(job, 800, logged_after=0)
    _cycle(cluster)
    incident = Incident.objects.get(job=job)
    assert incident.outcome == Incident.Outcome.RECOVERED, incident.reason
    assert incident.resumed_from_id == older.pk and incident.resumed_proof == "replay"
    assert "logged 0 step(s) after step 800" in incident.skipped["800"]


def test_a_state_exact_proof_counts_only_for_the_failed_runs_newest_checkpoint(
    cluster: Cluster, researcher: Any
) -> None:
    job = _failed_job(cluster, researcher)
    older = _checkpoint(job, 600, logged_after=5, proven=True)
    middle = _checkpoint(job, 700, logged_after=5)
    Checkpoint.objects.filter(pk=middle.pk).update(state_proven_at=timezone.now())
    newest = _checkpoint(job, 800, logged_after=0)
    Checkpoint.objects.filter(pk=newest.pk).update(integrity=Checkpoint.Integrity.FAILED)
    _cycle(cluster)
    incident = Incident.objects.get(job=job)
    # 700's state-exact proof is not enough (it is not the newest): it is drilled in full.
    drill = RestoreDrill.objects.get(pk=incident.proving_drill_id)
    assert drill.checkpoint_id == middle.pk and drill.level == RestoreDrill.Level.REPLAY
    assert older.pk != drill.checkpoint_id


# ----------------------------------------------------------- deadlines and exits


def test_a_proving_drill_that_does_not_start_by_its_deadline_falls_back(
    cluster: Cluster, researcher: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cancelled: list[str] = []
    monkeypatch.setattr(
        DRILLS, "cancel", lambda drill, *, by, audit: cancelled.append(str(drill.pk)) or "sent"
    )
    _policy(cluster, proving_start_deadline_seconds=60)
    job = _failed_job(cluster, researcher)
    older = _checkpoint(job, 700, logged_after=5, proven=True)
    _checkpoint(job, 800, logged_after=0)
    now = timezone.now()
    _cycle(cluster, now=now)
    incident = Incident.objects.get(job=job)
    drill = RestoreDrill.objects.get(pk=incident.proving_drill_id)
    # Slurm keeps it pending (a reason that never clears, or a busy partition).
    RestoreDrill.objects.filter(pk=drill.pk).update(state="pending", slurm_job_id="991")
    _cycle(cluster, now=now + timedelta(seconds=30))
    assert Incident.objects.get(pk=incident.pk).outcome == Incident.Outcome.PROVING
    later = now + timedelta(seconds=90)
    _cycle(cluster, now=later)
    incident.refresh_from_db()
    assert incident.outcome == Incident.Outcome.RECOVERED, incident.reason
    assert incident.resumed_from_id == older.pk
    assert "did not start within 60 s" in incident.skipped["800"]
    prove = next(s for s in incident.steps if s["name"] == "prove step 800")
    assert prove["outcome"].startswith("deadline passed") and prove["ended_at"]
    assert incident.deadline_passed_at == later
    assert cancelled == [str(drill.pk)]
    # The owner and operators are told (the notifications collector's event).
    events = incident_events(since=now)
    assert [e.kind for e in events if e.kind == EventKind.INCIDENT_DEADLINE] == [
        EventKind.INCIDENT_DEADLINE
    ]


def test_a_partition_that_cannot_host_the_shape_without_the_suspects_holds_at_once(
    cluster: Cluster, researcher: Any
) -> None:
    """Six nodes in the partition, a six-node job, one of them dead: no allocation without
    the suspect exists, so nothing is drilled and the incident is held with the reason."""
    Node.objects.filter(cluster=cluster, name="gpu-b-05").update(state=Node.State.DOWN)
    job = _failed_job(
        cluster, researcher, state="node_fail", nodes=6, allocated_nodes="gpu-b-[01-06]"
    )
    _checkpoint(job, 700, logged_after=5, proven=True)
    _checkpoint(job, 800, logged_after=0)
    _cycle(cluster)
    incident = Incident.objects.get(job=job)
    assert incident.suspect_nodes == ["gpu-b-05"]
    assert incident.outcome == Incident.Outcome.HELD, incident.reason
    assert "partition train has 5 node(s)" in incident.reason and "needs 6" in incident.reason
    assert not RestoreDrill.objects.exists() and incident.resumed_job is None


def test_the_proving_drill_leaves_out_the_suspects(cluster: Cluster, researcher: Any) -> None:
    Node.objects.filter(cluster=cluster, name="gpu-b-04").update(state=Node.State.DOWN)
    job = _failed_job(cluster, researcher, state="node_fail")
    _checkpoint(job, 700, logged_after=5, proven=True)
    _checkpoint(job, 800, logged_after=0)
    _cycle(cluster)
    incident = Incident.objects.get(job=job)
    drill = RestoreDrill.objects.get(pk=incident.proving_drill_id)
    assert drill.allocation["exclude"] == "gpu-b-04"
    script = render_sbatch(drill_script_spec(drill, trainer_path="/opt/gantry/trainer"))
    assert "#SBATCH --exclude=gpu-b-04" in script


def test_a_job_slurm_does_not_end_after_the_cancel_is_held_by_the_deadline(
    cluster: Cluster, researcher: Any, cancels: list[str]
) -> None:
    _policy(cluster, cancel_deadline_seconds=60)
    job = _failed_job(cluster, researcher, state="running", ended_at=None, files_final=False)
    _checkpoint(job, 700, logged_after=5, proven=True)
    now = timezone.now()
    incident = Incident.objects.create(
        job=job,
        lineage_root=job,
        cluster=cluster,
        signal=Incident.Signal.HANG,
        stopped_at=now,
        detected_at=now,
    )
    _cycle(cluster, now=now)
    incident.refresh_from_db()
    assert cancels == [str(job.id)] and incident.steps[0]["name"] == "cancel"
    _cycle(cluster, now=now + timedelta(seconds=30))
    assert Incident.objects.get(pk=incident.pk).outcome == Incident.Outcome.OPEN
    _cycle(cluster, now=now + timedelta(seconds=61))
    incident.refresh_from_db()
    assert incident.outcome == Incident.Outcome.HELD
    assert "within 60 s of recovery's cancel" in incident.reason
    assert incident.steps[0]["outcome"].startswith("deadline passed")


def test_the_incident_api_shows_each_step(
    cluster: Cluster, researcher: Any, researcher_api: Any
) -> None:
    job = _failed_job(cluster, researcher)
    _checkpoint(job, 800, logged_after=0)
    _cycle(cluster)
    assert Incident.objects.filter(job=job).exists()
    body = researcher_api.get(f"/api/v1/incidents/?job={job.id}").json()
    [shown] = body["results"]
    assert [s["name"] for s in shown["steps"]] == ["prove step 800"]
    assert set(shown["steps"][0]) >= {"started_at", "deadline_at", "ended_at", "outcome"}


def test_the_recovery_page_shows_the_steps_and_the_level(
    cluster: Cluster, researcher: Any, client: Any
) -> None:
    job = _failed_job(cluster, researcher, last_step=800)
    _checkpoint(job, 800, logged_after=0)
    _cycle(cluster)
    incident = Incident.objects.get(job=job)
    _pass(RestoreDrill.objects.get(pk=incident.proving_drill_id))
    _cycle(cluster)
    client.force_login(researcher)
    html = client.get("/recovery/").content.decode()
    assert 'data-step="prove step 800"' in html and 'data-step="resume"' in html
    assert "state-exact, no replay" in html
    checkpoint_page = client.get(f"/jobs/{job.id}/checkpoints/800/").content.decode()
    assert 'data-testid="state-exact-badge"' in checkpoint_page
