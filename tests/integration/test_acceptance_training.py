"""The sustained and recovery tiers on the dev cluster (real Slurm, sshd, worker, beat and
Redis): the trainer runs over both nodes of a partition (gpu: the fault tests use batch) for a minute and is judged from
what it wrote; a training job of the recovery tier loses a rank to the trainer's own fault
at step 50, Gantry's recovery resumes it from a checkpoint its drill proved, and the tier's
drill of the recovered run passes. Each test ends within about three minutes."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from acceptance.models import AcceptanceRun, Certificate, RecoveryTrial
from celery_support import wait_until
from devcluster_support import DevCluster
from drills.models import RestoreDrill
from jobs.models import Job
from nodes.models import Cluster
from recovery.models import Incident, SuspectNode

pytestmark = pytest.mark.django_db(transaction=True)


def _start(api: APIClient, cluster: Cluster, tiers: list[str], options: dict) -> AcceptanceRun:
    response = api.post(
        "/api/v1/acceptance/runs/start/",
        {
            "cluster": cluster.pk,
            "scope": "partition",
            "value": "gpu",
            "tiers": tiers,
            "options": options,
        },
        format="json",
    )
    assert response.status_code == 202, response.json()
    return AcceptanceRun.objects.get(id=response.json()["id"])


def _ended(run: AcceptanceRun, worker: Any, timeout: float) -> AcceptanceRun:
    def ended() -> AcceptanceRun | None:
        run.refresh_from_db()
        return run if not run.is_active else None

    def what() -> str:
        trial = RecoveryTrial.objects.filter(run=run).first()
        stage = f" ({trial.stage})" if trial else ""
        return f"run {run.id} in {run.current_tier}{stage}; worker log:\n{worker.log()[-3000:]}"

    return wait_until(ended, timeout=timeout, what=what)


@pytest.mark.slow
@pytest.mark.nodes(2, "gpu")
def test_the_sustained_tier_measures_a_minute_of_training(
    dev_cluster_registered: Cluster, celery_stack: Any, operator_api: APIClient
) -> None:
    run = _ended(
        _start(
            operator_api,
            dev_cluster_registered,
            ["inventory", "sustained"],
            {"sustained_minutes": 1},
        ),
        celery_stack["worker"],
        timeout=180,
    )
    assert run.state == "finished", run.reason
    step = run.steps.get(tier="sustained")
    measured = step.measured or {}
    assert step.state == "finished", step.reason
    # The dev cluster's GPUs are fake (no CUDA): CPU ranks, one per (fake) GPU.
    assert (step.configuration or {})["device"] == "cpu"
    assert (step.configuration or {})["world_size"] == 4
    assert measured["stopped_on_time"] is True and measured["duration_s"] >= 60
    assert measured["tokens_per_s"] and measured["tokens_per_s"] > 0, step.reason
    assert measured["nonfinite_step"] is None and len(measured["losses"]) >= 5
    # The first run of its configuration: nothing to compare with, honestly unjudged.
    assert step.verdict == "inconclusive" and measured["baseline"] is True, step.reason
    document = Certificate.objects.get(run=run).document["sustained"]
    assert document["losses_digest"] == measured["losses_digest"]
    assert document["scale"]["world_size"] == 4


@pytest.mark.slow
@pytest.mark.nodes(2, "gpu")
def test_the_recovery_tier_recovers_a_killed_rank_and_drills_the_recovered_run(
    dev_cluster_registered: Cluster,
    celery_stack: Any,
    operator_api: APIClient,
    devcluster: DevCluster,
) -> None:
    verifier = devcluster.env.get("GANTRY_CLUSTER_VERIFIER")
    assert verifier, "this dev cluster has no verifier account: run scripts/devcluster up"
    Cluster.objects.filter(pk=dev_cluster_registered.pk).update(verifier_account=verifier)
    options = {"recovery_minutes": 10, "recovery_max_seconds": 600, "recovery_max_lost_steps": 20}
    run = _ended(
        _start(operator_api, dev_cluster_registered, ["recovery"], options),
        celery_stack["worker"],
        timeout=180,
    )
    outcome = run.outcomes["recovery"]
    trial = RecoveryTrial.objects.get(run=run)
    lineage = Job.objects.filter(pk=trial.job_id) | Job.objects.filter(parent_id=trial.job_id)
    drills = [
        (d.checkpoint.step, d.verdict, d.reason[:500], d.allocated_nodes)
        for d in RestoreDrill.objects.filter(checkpoint__job__in=lineage).select_related(
            "checkpoint"
        )
    ]
    assert (run.state, run.verdict) == ("finished", "passed"), (run.reason, drills)
    criteria = {c["name"]: c for c in outcome["criteria"]}
    assert criteria["recovered"]["verdict"] == "passed"
    assert criteria["restore_drill"]["verdict"] == "passed", criteria["restore_drill"]
    assert 0 <= criteria["lost_steps"]["measured"] <= 20
    incident = Incident.objects.get(job_id=trial.job_id)
    assert incident.signal == Incident.Signal.CRASH and incident.resumed_from is not None
    assert incident.resumed_from.last_proven_at is not None
    # The lineage ends with the tier (the watcher records the cancel), and the node the
    # injected crash named is no suspect.
    wait_until(
        lambda: (
            not Job.objects.filter(parent_id=trial.job_id)
            .exclude(state__in=list(Job.FINAL_STATES))
            .exists()
        ),
        timeout=60,
        what=lambda: "the resumed job to end",
    )
    assert not SuspectNode.objects.filter(incident=incident, cleared_at__isnull=True).exists()
