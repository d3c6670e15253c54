"""Silent data corruption: a restore drill that failed its bit-exact comparison on one
allocation while a drill of the same checkpoint passed the same comparison on another is
evidence against the first allocation's nodes, and nothing else is: both drills scheduled
by Gantry (a policy, recovery), on one partition, GPU model and software stack.

The drills are rows as the watcher leaves them (verdict, reason code, the report as
evidence, the nodes Slurm ran them on); the cluster has a shape the dev cluster does not.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from recovery_support import crash_incident
from rest_framework.test import APIClient

from core.models import AuditEvent
from drills.models import RestoreDrill
from factories import CheckpointFactory, JobFactory
from health.models import NodeHealth
from jobs.models import Checkpoint, Job, JobEvent, MetricPoint, StateFingerprint
from nodes.models import Cluster, Gpu, Node
from notifications.sdc_source import sdc_suspicions
from notifications.topics import Audience, EventKind, Subscriber, Topic, subscription_wants
from recovery.cycle import recovery_cycle
from recovery.models import Incident, SuspectNode
from recovery.operators import suspect_node_clear
from recovery.sdc import sdc_record
from recovery.selectors import suspect_nodes

from .test_recovery import _failed_job

pytestmark = pytest.mark.django_db

STACK = "0123456789abcdef"


@pytest.fixture(autouse=True)
def _probed(cluster: Cluster) -> None:
    """Every node of the cluster probed by Gantry's health check, one software stack."""
    for node in Node.objects.filter(cluster=cluster):
        NodeHealth.objects.create(node=node, state="ok", stack_fingerprint=STACK)


STEP = 600
STEPS = 5
REPLAY_TO = STEP + STEPS
TRAINER = "7" * 64
REFERENCE = "8" * 64
ALLOCATION = {
    "partition": "train",
    "nodes": 2,
    "tasks_per_node": 1,
    "gpus_per_node": 1,
    "gpu_type": "h200",
    "cpus_per_task": 1,
}


def _loss(step: int) -> float:
    return 2.5 - 0.01 * (step - STEP)


def _fingerprint(step: int, total: Any = 12.5) -> dict[str, Any]:
    return {
        "format": "gantry-state-fingerprint/1",
        "step": step,
        "tensors": {"model.w": {"lhash": 7, "sum": total, "sumsq": 40.0, "sketch": [1.0]}},
    }


def _checkpoint(job: Job, *, proven: bool = True) -> Checkpoint:
    """The checkpoint at ``STEP`` with what a drill of it compares with: its fingerprint,
    the next one at ``REPLAY_TO``, and the run's losses in between."""
    for step in (STEP, REPLAY_TO):
        StateFingerprint.objects.create(
            job=job, step=step, data=_fingerprint(step), tensors=1, source="event"
        )
    MetricPoint.objects.bulk_create(
        MetricPoint(job=job, step=step, wall_time=timezone.now(), loss=_loss(step))
        for step in range(STEP + 1, REPLAY_TO + 1)
    )
    return CheckpointFactory(
        job=job,
        step=STEP,
        saved_at=timezone.now() - timedelta(minutes=30),
        last_proven_at=timezone.now() - timedelta(minutes=5) if proven else None,
        state_keys=["model", "optimizer", "scheduler", "rng", "data"],
        world_size=2,
    )


def _passed() -> dict[str, Any]:
    return {
        "mode": "exact",
        "steps_compared": STEPS,
        "first_divergence": None,
        "state": {
            "at_load": {"step": STEP, "exact": True, "compared": True, "problems": []},
            "at_end": {"step": REPLAY_TO, "exact": True, "compared": True, "problems": []},
        },
    }


def _diverged(step: int = STEP + 3, loss: Any = 2.4700000000000006) -> dict[str, Any]:
    return {
        "mode": "exact",
        "steps_compared": STEPS,
        "first_divergence": {
            "step": step,
            "loss": loss,
            "reference": _loss(step),
            "abs_diff": 1e-16,
            "rel_diff": 1e-16,
            "ok": False,
        },
        "state": {
            "at_load": {"step": STEP, "exact": True, "compared": True, "problems": []},
            "at_end": None,
        },
    }


def _drill(checkpoint: Checkpoint, nodes: str, **values: Any) -> RestoreDrill:
    fields: dict[str, Any] = {
        "checkpoint": checkpoint,
        "cluster": checkpoint.job.cluster,
        "steps": STEPS,
        "replay_to_step": REPLAY_TO,
        "trainer": RestoreDrill.Trainer.RECORDED,
        "trainer_digest": TRAINER,
        "reference_digest": REFERENCE,
        "allocation": dict(ALLOCATION),
        "allocation_key": "train:2x1:gpu1h200:cpu1",
        "state": RestoreDrill.State.FINISHED,
        "verdict": RestoreDrill.Verdict.PASSED,
        "evidence": _passed(),
        "attestation": RestoreDrill.Attestation.VERIFIER,
        "verifier_account": "gverify",
        "allocated_nodes": nodes,
        "finished_at": timezone.now(),
        # Scheduled by Gantry's drill policy: only such drills are evidence.
        "trigger": RestoreDrill.Trigger.POLICY_RUNNING,
    }
    fields.update(values)
    return RestoreDrill.objects.create(**fields)


def _failed_drill(checkpoint: Checkpoint, nodes: str, **values: Any) -> RestoreDrill:
    fields: dict[str, Any] = {
        "verdict": RestoreDrill.Verdict.FAILED,
        "reason_code": "loss_diverged",
        "reason": "loss diverged at step 603",
        "evidence": _diverged(),
    }
    fields.update(values)
    return _drill(checkpoint, nodes, **fields)


def _job(cluster: Cluster, owner: Any, **values: Any) -> Job:
    fields: dict[str, Any] = {
        "owner": owner,
        "cluster": cluster,
        "partition": "train",
        "nodes": 2,
        "state": "completed",
        "slurm_job_id": "5150",
    }
    fields.update(values)
    return JobFactory(**fields)


def _record(cluster: Cluster) -> int:
    return sdc_record(cluster=cluster, now=timezone.now())


def _suspected() -> set[str]:
    return set(SuspectNode.objects.values_list("node__name", flat=True))


# ---------------------------------------------------------------------------- evidence


def test_the_failed_drills_nodes_the_passing_drill_did_not_use_are_suspected(
    cluster: Cluster, researcher: Any
) -> None:
    checkpoint = _checkpoint(_job(cluster, researcher))
    bad = _failed_drill(checkpoint, "gpu-b-[01-02]")
    good = _drill(checkpoint, "gpu-b-[02-03]")
    result = recovery_cycle(cluster=cluster, seen=set(), now=timezone.now())
    assert result.sdc_suspects == 1
    suspicion = SuspectNode.objects.get()
    assert suspicion.node.name == "gpu-b-01"
    assert suspicion.kind == SuspectNode.Kind.SILENT_DATA_CORRUPTION
    assert suspicion.incident_id is None
    assert suspicion.drill_id == bad.id and suspicion.passed_drill_id == good.id
    why = suspicion.evidence
    assert why.startswith("silent data corruption: ")
    assert str(bad.id)[:8] in why and str(good.id)[:8] in why
    assert "on gpu-b-01, gpu-b-02 (" in why and "on gpu-b-02, gpu-b-03;" in why
    assert "the loss at step 603 was 2.4700000000000006, the run's 2.47" in why
    assert "steps 601-605" in why and "gpu-b-01 ran only in the failed drill" in why
    # The job's name is not in it: node pages show the evidence to everyone.
    assert checkpoint.job.name not in why
    audit = AuditEvent.objects.get(action="suspect_node.sdc")
    assert audit.actor is None and audit.target_id == str(suspicion.node_id)
    assert audit.details["drill"] == str(bad.id)
    assert audit.details["failed_on"] == ["gpu-b-01", "gpu-b-02"]
    assert audit.details["mismatch"]["step"] == STEP + 3


def test_a_state_that_differs_bit_for_bit_after_the_replay_is_evidence_too(
    cluster: Cluster, researcher: Any
) -> None:
    checkpoint = _checkpoint(_job(cluster, researcher))
    evidence = _passed()
    hostile_name = "model.layer\x1b[31m" + "x" * 500
    evidence["state"]["at_end"]["problems"] = [
        {"key": "model.w", "detail": "lhash differs"},
        {"key": hostile_name, "detail": "lhash differs"},
    ]
    _failed_drill(checkpoint, "gpu-b-04", reason_code="state_mismatch", evidence=evidence)
    _drill(checkpoint, "gpu-b-05")
    assert _record(cluster) == 1
    why = SuspectNode.objects.get(node__name="gpu-b-04").evidence
    assert "the state at step 605 differed from the run's in model.w, model.layer" in why
    assert "\x1b" not in why and "x" * 81 not in why


def test_the_passing_drills_together_narrow_the_suspects(cluster: Cluster, researcher: Any) -> None:
    checkpoint = _checkpoint(_job(cluster, researcher))
    _failed_drill(checkpoint, "gpu-b-[01-03]", allocation={**ALLOCATION, "nodes": 3})
    _drill(checkpoint, "gpu-b-[02,04,05]", allocation={**ALLOCATION, "nodes": 3})
    _drill(checkpoint, "gpu-b-[03-05]", allocation={**ALLOCATION, "nodes": 3})
    assert _record(cluster) == 1 and _suspected() == {"gpu-b-01"}


def test_the_same_nodes_failing_and_passing_are_no_evidence_against_them(
    cluster: Cluster, researcher: Any
) -> None:
    checkpoint = _checkpoint(_job(cluster, researcher))
    _failed_drill(checkpoint, "gpu-b-[01-02]")
    _drill(checkpoint, "gpu-b-[01-02]")
    assert _record(cluster) == 0 and not SuspectNode.objects.exists()


def _variant(**failed: Any) -> Callable[[Checkpoint], None]:
    def make(checkpoint: Checkpoint) -> None:
        _failed_drill(checkpoint, "gpu-b-[01-02]", **failed)
        _drill(checkpoint, "gpu-b-[03-04]")

    return make


def _passing(**passed: Any) -> Callable[[Checkpoint], None]:
    def make(checkpoint: Checkpoint) -> None:
        _failed_drill(checkpoint, "gpu-b-[01-02]")
        _drill(checkpoint, "gpu-b-[03-04]", **passed)

    return make


def _nonfinite_state(checkpoint: Checkpoint) -> None:
    StateFingerprint.objects.filter(job=checkpoint.job, step=STEP).update(
        data=_fingerprint(STEP, total="NaN")
    )
    _variant()(checkpoint)


def _nonfinite_loss(checkpoint: Checkpoint) -> None:
    Job.objects.filter(pk=checkpoint.job_id).update(nonfinite_loss_step=STEP + 2)
    _variant()(checkpoint)


def _exact_looking() -> dict[str, Any]:
    """A report that shows both a loss and a state differing bit for bit."""
    evidence = _diverged()
    evidence["state"]["at_end"] = {
        "step": REPLAY_TO,
        "exact": True,
        "compared": True,
        "problems": [{"key": "model.w", "detail": "lhash differs"}],
    }
    return evidence


def _other_failure(code: str) -> Callable[[Checkpoint], None]:
    # Another failure, reported with a perfectly exact-looking comparison: still not SDC.
    return _variant(reason_code=code, evidence=_exact_looking())


NOT_EVIDENCE = {
    "integrity failure": _other_failure("integrity_hash_mismatch"),
    "load error": _other_failure("load_error"),
    "step error": _other_failure("step_error"),
    "another checkpoint in its place": _other_failure("not_as_registered"),
    "tolerance mode": _variant(evidence={**_diverged(), "mode": "tolerance"}),
    "inconclusive": _variant(verdict="inconclusive", reason_code="allocation_incompatible"),
    "infrastructure error": _variant(verdict="error", reason_code="infrastructure_error"),
    "cancelled": _variant(state="cancelled", verdict="", reason_code=""),
    "self-attested failure": _variant(attestation="self", verifier_account=""),
    "self-attested pass": _passing(attestation="self", verifier_account=""),
    "another trainer version": _passing(trainer_digest="9" * 64),
    "the current trainer": _passing(trainer=RestoreDrill.Trainer.CURRENT),
    "another reference": _passing(reference_digest="6" * 64),
    "other steps": _passing(steps=STEPS - 1),
    "another shape": _passing(allocation={**ALLOCATION, "nodes": 1}, allocated_nodes="gpu-b-03"),
    "a pass in tolerance mode": _passing(evidence={**_passed(), "mode": "tolerance"}),
    "a pass on nodes Gantry did not see": _passing(allocated_nodes=""),
    "non-finite state": _nonfinite_state,
    "non-finite losses": _nonfinite_loss,
    "not the run's loss": _variant(
        evidence={
            **_diverged(),
            "first_divergence": {**_diverged()["first_divergence"], "reference": 9.75},
        }
    ),
    "a NaN as the loss": _variant(evidence=_diverged(loss="NaN")),
    "a bool as the loss": _variant(evidence=_diverged(loss=True)),
    "a step outside the replay": _variant(evidence=_diverged(step=STEP + 40)),
    "nodes outside the cluster": _variant(allocated_nodes="ghost-[1-2]"),
    "nodes Gantry did not see": _variant(allocated_nodes=""),
    "a failure the owner started (its placement theirs)": _variant(
        trigger=RestoreDrill.Trigger.MANUAL
    ),
    "a pass the owner started": _passing(trigger=RestoreDrill.Trigger.MANUAL),
    "a pass on another partition": _passing(allocation={**ALLOCATION, "partition": "debug"}),
    "a pass on another GPU model": lambda checkpoint: _elsewhere(checkpoint, gpu_type="a100"),
    "a pass on another software stack": lambda checkpoint: _elsewhere(checkpoint, stack="f" * 16),
    "a failure on nodes of unknown stack": lambda checkpoint: _unprobed(checkpoint, "gpu-b-01"),
    "a failure on nodes of unknown GPU model": lambda checkpoint: _elsewhere(
        checkpoint, gpu_type="", nodes=("gpu-b-02",)
    ),
}


def _elsewhere(
    checkpoint: Checkpoint,
    *,
    gpu_type: str | None = None,
    stack: str | None = None,
    nodes: tuple[str, ...] = ("gpu-b-03", "gpu-b-04"),
) -> None:
    """The usual pair, with some nodes of another GPU model or software stack."""
    cluster = checkpoint.job.cluster
    if gpu_type is not None:
        Gpu.objects.filter(node__cluster=cluster, node__name__in=nodes).update(gpu_type=gpu_type)
    if stack is not None:
        NodeHealth.objects.filter(node__cluster=cluster, node__name__in=nodes).update(
            stack_fingerprint=stack
        )
    _variant()(checkpoint)


def _unprobed(checkpoint: Checkpoint, name: str) -> None:
    NodeHealth.objects.filter(node__cluster=checkpoint.job.cluster, node__name=name).delete()
    _variant()(checkpoint)


@pytest.mark.parametrize("case", sorted(NOT_EVIDENCE))
def test_nothing_else_is_evidence_of_silent_data_corruption(
    cluster: Cluster, researcher: Any, case: str
) -> None:
    NOT_EVIDENCE[case](_checkpoint(_job(cluster, researcher)))
    assert _record(cluster) == 0 and not SuspectNode.objects.exists()
    assert not AuditEvent.objects.filter(action="suspect_node.sdc").exists()


def test_drills_that_ended_long_ago_are_not_gone_through_again(
    cluster: Cluster, researcher: Any
) -> None:
    checkpoint = _checkpoint(_job(cluster, researcher))
    old = timezone.now() - timedelta(days=2)
    _failed_drill(checkpoint, "gpu-b-[01-02]", finished_at=old)
    _drill(checkpoint, "gpu-b-[03-04]", finished_at=old)
    assert _record(cluster) == 0
    # A new pass of the same checkpoint brings the old failure back into view.
    _drill(checkpoint, "gpu-b-[05-06]")
    assert _record(cluster) == 2 and _suspected() == {"gpu-b-01", "gpu-b-02"}


# ------------------------------------------------------------------- repeats, clearing


def test_repeated_cycles_record_once_and_an_operators_clear_holds(
    cluster: Cluster, researcher: Any, operator: Any
) -> None:
    checkpoint = _checkpoint(_job(cluster, researcher))
    _failed_drill(checkpoint, "gpu-b-[01-02]")
    _drill(checkpoint, "gpu-b-[03-04]")
    assert _record(cluster) == 2
    for _ in range(3):
        assert _record(cluster) == 0
    assert SuspectNode.objects.count() == 2
    node = Node.objects.get(cluster=cluster, name="gpu-b-01")
    assert suspect_node_clear(actor=operator, node=node, why="GPU replaced") == 1
    assert _record(cluster) == 0
    cleared = SuspectNode.objects.get(node=node)
    assert cleared.cleared_at is not None and cleared.cleared_by == operator
    assert AuditEvent.objects.filter(action="suspect_node.sdc").count() == 2
    assert AuditEvent.objects.filter(action="suspect_node.clear").count() == 1
    assert [s.node.name for s in suspect_nodes(cluster_id=cluster.pk)] == ["gpu-b-02"]


def test_one_source_of_evidence_per_suspicion_is_enforced(
    cluster: Cluster, researcher: Any
) -> None:
    from django.db import IntegrityError, transaction

    checkpoint = _checkpoint(_job(cluster, researcher))
    drill = _failed_drill(checkpoint, "gpu-b-[01-02]")
    node = Node.objects.get(cluster=cluster, name="gpu-b-01")
    with pytest.raises(IntegrityError), transaction.atomic():
        SuspectNode.objects.create(node=node, kind="sdc", evidence="no drill")
    with pytest.raises(IntegrityError), transaction.atomic():
        SuspectNode.objects.create(node=node, kind="incident", drill=drill, evidence="mixed")
    SuspectNode.objects.create(node=node, kind="sdc", drill=drill, evidence="once")
    with pytest.raises(IntegrityError), transaction.atomic():
        SuspectNode.objects.create(node=node, kind="sdc", drill=drill, evidence="twice")


# ----------------------------------------------------------------------------- resumes


def test_a_resume_of_the_lineage_leaves_out_the_nodes_suspected_of_sdc(
    cluster: Cluster, researcher: Any
) -> None:
    job = _failed_job(cluster, researcher)
    checkpoint = _checkpoint(job)
    _failed_drill(checkpoint, "gpu-b-[05-06]")
    _drill(checkpoint, "gpu-b-[01-02]")
    # Another run's resume is not held to this lineage's evidence.
    other = _failed_job(cluster, researcher, slurm_job_id="4343")
    CheckpointFactory(
        job=other, step=300, last_proven_at=timezone.now(), state_keys=["model"], world_size=2
    )
    result = recovery_cycle(cluster=cluster, seen=set(), now=timezone.now())
    assert result.sdc_suspects == 2
    incident = Incident.objects.get(job=job)
    resumed = incident.resumed_job
    assert resumed is not None and resumed.exclude_nodes == "gpu-b-05,gpu-b-06"
    assert incident.excluded_nodes == ["gpu-b-05", "gpu-b-06"]
    told = JobEvent.objects.filter(job=resumed, kind="recovery").values_list("message", flat=True)
    assert any("silent data corruption" in message for message in told)
    elsewhere = Incident.objects.get(job=other).resumed_job
    assert elsewhere is not None and elsewhere.exclude_nodes == ""


# ------------------------------------------------------------------- fleet, API, pages


def test_sdc_counts_as_evidence_from_the_checkpoints_run_toward_draining(
    cluster: Cluster, researcher: Any, other_researcher: Any
) -> None:
    job = _job(cluster, researcher)
    checkpoint = _checkpoint(job)
    _failed_drill(checkpoint, "gpu-b-[01-02]")
    _drill(checkpoint, "gpu-b-[03-04]")
    _record(cluster)
    node = Node.objects.get(cluster=cluster, name="gpu-b-01")
    # A crash of a job resumed from the same run: the same lineage, still one run.
    resumed = _job(cluster, researcher, parent=job, resume_from=checkpoint, slurm_job_id="77")
    same = crash_incident(resumed)
    Incident.objects.filter(pk=same.pk).update(lineage_root=job)
    SuspectNode.objects.create(node=node, incident=same, evidence="srun: task 0 killed")
    [summary] = [s for s in suspect_nodes(cluster_id=cluster.pk) if s.node == node]
    assert summary.jobs == 1 and not summary.offered_for_draining
    assert summary.silent_data_corruption
    # Another researcher's run names it too: evidence beyond one run.
    SuspectNode.objects.create(
        node=node,
        incident=crash_incident(_job(cluster, other_researcher, slurm_job_id="78")),
        evidence="NODE_FAIL",
    )
    [summary] = [s for s in suspect_nodes(cluster_id=cluster.pk) if s.node == node]
    assert summary.jobs == 2 and summary.offered_for_draining


def test_the_api_and_the_pages_show_the_drills_behind_an_sdc_suspicion(
    cluster: Cluster, researcher: Any, operator: Any
) -> None:
    checkpoint = _checkpoint(_job(cluster, researcher))
    bad = _failed_drill(checkpoint, "gpu-b-[01-02]")
    good = _drill(checkpoint, "gpu-b-[02-03]")
    _record(cluster)
    node = Node.objects.get(cluster=cluster, name="gpu-b-01")
    api = APIClient()
    api.force_authenticate(operator)
    [listed] = api.get(f"/api/v1/suspect-nodes/?cluster={cluster.pk}").json()
    assert listed["node"] == "gpu-b-01" and listed["silent_data_corruption"] is True
    assert listed["runs"] == 1 and listed["offered_for_draining"] is False
    [evidence] = listed["evidence"]
    assert evidence["kind"] == "sdc" and evidence["incident"] is None
    assert evidence["drill"] == str(bad.id) and evidence["passed_drill"] == str(good.id)
    assert evidence["checkpoint"] == checkpoint.pk and evidence["checkpoint_step"] == STEP
    assert evidence["job"] == str(checkpoint.job_id)
    assert evidence["why"].startswith("silent data corruption: ")

    page = Client()
    page.force_login(operator)
    html = page.get("/recovery/").content.decode()
    assert 'data-node="gpu-b-01"' in html and 'data-kind="sdc"' in html
    assert "silent data corruption: restore drill" in html
    assert f'href="/drills/{bad.id}/"' in html and f'href="/drills/{good.id}/"' in html
    node_html = page.get(f"/nodes/{node.pk}/").content.decode()
    assert "silent data corruption: restore drill" in node_html
    assert f'href="/drills/{bad.id}/"' in node_html

    # A researcher sees that the node is suspected and how much, not the evidence: the
    # drills, the checkpoint's job, its step and losses are operators' to read.
    other = Client()
    other.force_login(researcher)
    researcher_html = other.get(f"/nodes/{node.pk}/").content.decode()
    assert "Suspected: 1 open suspicion" in researcher_html
    assert "1 of silent data corruption" in researcher_html
    assert "silent data corruption: restore drill" not in researcher_html
    assert f"/drills/{bad.id}/" not in researcher_html
    assert str(checkpoint.job_id)[:8] not in researcher_html and "2.47" not in researcher_html


def test_operators_are_told_of_a_node_suspected_of_sdc(cluster: Cluster, researcher: Any) -> None:
    since = timezone.now() - timedelta(seconds=1)
    checkpoint = _checkpoint(_job(cluster, researcher))
    _failed_drill(checkpoint, "gpu-b-01", allocation={**ALLOCATION, "nodes": 1})
    _drill(checkpoint, "gpu-b-02", allocation={**ALLOCATION, "nodes": 1})
    _record(cluster)
    [draft] = sdc_suspicions(since=since)
    assert draft.kind == EventKind.SUSPECT_SDC and draft.cluster_id == cluster.pk
    assert "gpu-b-01" in draft.title and draft.data["suspect"]["checkpoint_step"] == STEP
    assert sdc_suspicions(since=timezone.now()) == []
    event = Audience(
        kind=draft.kind,
        cluster_id=draft.cluster_id,
        owner_id=None,
        requester_id=None,
        data=draft.data,
    )
    topics = frozenset({Topic.SILENT_DATA_CORRUPTION.value})
    operator = Subscriber(user_id=1, is_operator=True, topics=topics, cluster_id=None)
    not_operator = Subscriber(user_id=2, is_operator=False, topics=topics, cluster_id=None)
    assert subscription_wants(operator, event) and not subscription_wants(not_operator, event)


def test_the_same_pair_on_one_partition_gpu_model_and_stack_is_evidence(
    cluster: Cluster, researcher: Any
) -> None:
    """The cases above differ from this one in one thing each: here it is evidence, with
    the partition, GPU model and stack in its words and its audit record."""
    _variant()(_checkpoint(_job(cluster, researcher)))
    assert _record(cluster) == 2 and _suspected() == {"gpu-b-01", "gpu-b-02"}
    why = SuspectNode.objects.filter(node__name="gpu-b-01").get().evidence
    assert f"scheduled by Gantry on partition train, h200 GPUs, stack {STACK}" in why
    audit = AuditEvent.objects.filter(action="suspect_node.sdc").first()
    assert audit is not None and audit.details["stack_fingerprint"] == STACK
    assert audit.details["gpu_model"] == "h200" and audit.details["partition"] == "train"


def test_a_recovery_drill_and_a_policy_drill_are_both_gantrys(
    cluster: Cluster, researcher: Any
) -> None:
    checkpoint = _checkpoint(_job(cluster, researcher))
    _failed_drill(checkpoint, "gpu-b-[01-02]", trigger=RestoreDrill.Trigger.RECOVERY)
    _drill(checkpoint, "gpu-b-[02-03]", trigger=RestoreDrill.Trigger.POLICY_FINAL)
    assert _record(cluster) == 1 and _suspected() == {"gpu-b-01"}
