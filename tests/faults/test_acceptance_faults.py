"""Acceptance against a genuinely slow node, in trials (issue 26): each trial measures the
partition's healthy fabric, sets each level's busbw threshold at half its slowest healthy
group, runs the collectives tier once more with nothing slowed (it must pass, convicting no
node) and once with one node's collective ranks held to a 10% cgroup CPU quota (nothing the
code under test reads: it must convict that node and no other). Which node is slowed rotates over the
partition's nodes. Each run is appended to ``test-artifacts/acceptance-trials.jsonl``;
``bench/acceptance_bench.py`` runs N trials and prints the table.

``make faults`` runs it (GANTRY_FAULTS_FULL=1); ``make test`` has the one-trial version in
tests/integration/test_acceptance.py. GANTRY_ACCEPTANCE_PARTITION picks the partition
(default ``batch``), GANTRY_ACCEPTANCE_TRIALS the number of trials."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from recovery_support import CGROUP_CPU, slowed_collectives
from rest_framework.test import APIClient

from acceptance.models import AcceptanceRun, BusbwThreshold, Certificate
from celery_support import wait_until
from devcluster_support import DevCluster
from fault_support import FaultReport
from nodes.models import Cluster, Node

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        os.environ.get("GANTRY_FAULTS_FULL") != "1",
        reason="make faults runs it (GANTRY_FAULTS_FULL=1); make test runs one slowed node",
    ),
    pytest.mark.skipif(not (CGROUP_CPU / "cpu.cfs_quota_us").exists(), reason="no cgroup v1 cpu"),
]

TRIALS = int(os.environ.get("GANTRY_ACCEPTANCE_TRIALS", "1"))
PARTITION = os.environ.get("GANTRY_ACCEPTANCE_PARTITION", "batch")
OPTIONS = {"max_mib": 4, "iters": 5, "warmup": 1, "minutes": 10}
TRIALS_FILE = Path(__file__).resolve().parents[2] / "test-artifacts" / "acceptance-trials.jsonl"


def _run(
    api: APIClient,
    cluster: Cluster,
    worker: Any,
    *,
    tiers: list[str] | None = None,
    options: dict[str, Any] | None = None,
    timeout: float = 600,
) -> tuple[AcceptanceRun, float]:
    started = time.monotonic()
    response = api.post(
        "/api/v1/acceptance/runs/start/",
        {
            "cluster": cluster.pk,
            "scope": "partition",
            "value": PARTITION,
            "tiers": tiers or ["collectives"],
            "options": options or OPTIONS,
        },
        format="json",
    )
    assert response.status_code == 202, response.json()
    run = AcceptanceRun.objects.get(id=response.json()["id"])

    def ended() -> AcceptanceRun | None:
        run.refresh_from_db()
        return run if not run.is_active else None

    wait_until(
        ended,
        timeout=timeout,
        what=lambda: f"run {run.id} in {run.current_tier}; worker log:\n{worker.log()[-3000:]}",
    )
    return run, time.monotonic() - started


def _judged(api: APIClient, cluster: Cluster, worker: Any) -> tuple[AcceptanceRun, float, int]:
    """A run that reached the cluster: one that could not (its steps never started, so it
    measured nothing and ended inconclusive, e.g. while another fault test has sshd down)
    is run again a minute later, at most three times. Returns the run, its wall time and the runs retried."""
    retried = 0
    run, wall_s = _run(api, cluster, worker)
    while retried < 3 and run.verdict == "inconclusive" and "could not reach" in run.reason:
        retried += 1
        time.sleep(60)
        run, wall_s = _run(api, cluster, worker)
    return run, wall_s, retried


def _thresholds(cluster: Cluster, busbw: dict[str, float]) -> None:
    for level, value in busbw.items():
        BusbwThreshold.objects.update_or_create(
            cluster=cluster, partition="", level=level, op="all_reduce", defaults={"busbw": value}
        )


def _half_the_slowest(run: AcceptanceRun) -> dict[str, float]:
    """Per level, half the slowest group's busbw in a healthy run."""
    by_level: dict[str, list[float]] = {}
    for step in run.steps.filter(tier="collectives"):
        if step.busbw:
            by_level.setdefault(step.level, []).append(step.busbw)
    return {level: 0.5 * min(values) for level, values in by_level.items()}


def _record(kind: str, run: AcceptanceRun, wall_s: float, **extra: Any) -> dict[str, Any]:
    record = {
        "kind": kind,
        "partition": PARTITION,
        "verdict": run.verdict,
        "convicted": list(run.convicted or []),
        "jobs": run.steps.count(),
        "wall_s": round(wall_s, 1),
        "reason": (run.reason or "")[:300],
        **extra,
    }
    TRIALS_FILE.parent.mkdir(parents=True, exist_ok=True)
    with TRIALS_FILE.open("a") as handle:
        handle.write(json.dumps(record) + "\n")
    return record


@pytest.mark.exclusive
@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_slowed_node_is_convicted_and_a_healthy_set_never(
    trial: int,
    dev_cluster_registered: Cluster,
    celery_stack: Any,
    operator_api: APIClient,
    fault_report: FaultReport,
) -> None:
    cluster, worker = dev_cluster_registered, celery_stack["worker"]
    nodes = sorted(
        n.name for n in Node.objects.filter(cluster=cluster) if PARTITION in (n.partitions or [])
    )
    assert len(nodes) >= 2, (PARTITION, nodes)
    slow = nodes[trial % len(nodes)]
    try:
        # What this fabric does when healthy, judged against a threshold anything passes.
        _thresholds(cluster, dict.fromkeys(("node", "leaf", "spine"), 1.0))
        baseline, _, _ = _judged(operator_api, cluster, worker)
        assert baseline.verdict == "passed", baseline.reason
        threshold = _half_the_slowest(baseline)
        assert "node" in threshold, baseline.outcomes
        _thresholds(cluster, threshold)
        healthy, healthy_s, healthy_retried = _judged(operator_api, cluster, worker)
        with slowed_collectives(slow, percent=10):
            slowed, slowed_s, slowed_retried = _judged(operator_api, cluster, worker)
    finally:
        Node.objects.filter(cluster=cluster).update(acceptance_state="")
    _record("healthy", healthy, healthy_s, threshold=threshold, retried=healthy_retried)
    _record(
        "slowed", slowed, slowed_s, expected=[slow], threshold=threshold, retried=slowed_retried
    )
    row = fault_report.row("acceptance: one node slowed (cgroup CPU quota 10%)")
    row.trials += 1
    row.faults_injected += 1
    ok = healthy.verdict == "passed" and healthy.convicted == [] and slowed.convicted == [slow]
    row.wrong += 0 if ok else 1
    row.notes = (
        f"partition {PARTITION}; last: convicted {slowed.convicted}, healthy {healthy.convicted}"
    )
    assert (healthy.verdict, healthy.convicted) == ("passed", []), healthy.reason
    assert slowed.convicted == [slow], (slowed.convicted, slowed.reason)


@pytest.mark.exclusive
def test_a_full_certificate_and_the_time_of_each_tier(
    dev_cluster_registered: Cluster,
    celery_stack: Any,
    operator_api: APIClient,
    devcluster: DevCluster,
) -> None:
    """Every tier over the partition, once: the certificate and how long each tier took."""
    cluster = dev_cluster_registered
    verifier = devcluster.env.get("GANTRY_CLUSTER_VERIFIER")
    assert verifier, "this dev cluster has no verifier account: run scripts/devcluster up"
    Cluster.objects.filter(pk=cluster.pk).update(verifier_account=verifier)
    _thresholds(cluster, dict.fromkeys(("node", "leaf", "spine"), 1.0))
    options = {
        **OPTIONS,
        "sustained_minutes": 1,
        "recovery_minutes": 15,
        "recovery_max_seconds": 600,
        "recovery_max_lost_steps": 20,
    }
    run, wall_s = _run(
        operator_api,
        cluster,
        celery_stack["worker"],
        tiers=["inventory", "collectives", "sustained", "recovery"],
        options=options,
        timeout=1500,
    )
    tiers = {tier: outcome.get("seconds") for tier, outcome in (run.outcomes or {}).items()}
    _record("full", run, wall_s, tiers=tiers)
    assert run.state == "finished", run.reason
    assert set(tiers) == {"inventory", "collectives", "sustained", "recovery"}, run.outcomes
    assert all(seconds is not None and seconds >= 0 for seconds in tiers.values()), tiers
    # Fake GPUs: inventory is honestly inconclusive; sustained has no record yet.
    assert run.outcomes["collectives"]["verdict"] == "passed", run.outcomes["collectives"]
    assert run.outcomes["recovery"]["verdict"] == "passed", run.outcomes["recovery"]
    assert Certificate.objects.filter(run=run).exists()
