"""Acceptance runs on the dev cluster: real Slurm jobs through the lifecycle, a real Celery
worker and the watcher. A run over the two nodes of one partition (inventory and stack,
collectives) issues its certificate, whose configuration is what Slurm's inventory says;
with one node made genuinely slow (a cgroup CPU quota on its collective ranks, nothing
the code under test reads), the collectives tier convicts that node and no other; with
another torch on one node (its slurmd in a mount namespace of its own), the stack tier
fails and names it."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from recovery_support import CGROUP_CPU, slowed_collectives
from rest_framework.test import APIClient

from acceptance.models import AcceptanceRun, BusbwThreshold, Certificate
from celery_support import wait_until
from devcluster_support import DevCluster, run_script
from nodes.models import Cluster, Node

pytestmark = pytest.mark.django_db(transaction=True)

OPTIONS = {"max_mib": 4, "iters": 5, "warmup": 1, "minutes": 10}


def _start(api: APIClient, cluster: Cluster, tiers: list[str]) -> AcceptanceRun:
    response = api.post(
        "/api/v1/acceptance/runs/start/",
        {
            "cluster": cluster.pk,
            "scope": "partition",
            "value": "batch",
            "tiers": tiers,
            "options": OPTIONS,
        },
        format="json",
    )
    assert response.status_code == 202, response.json()
    return AcceptanceRun.objects.get(id=response.json()["id"])


def _ended(run: AcceptanceRun, worker: Any, timeout: float = 480) -> AcceptanceRun:
    def ended() -> AcceptanceRun | None:
        run.refresh_from_db()
        return run if not run.is_active else None

    return wait_until(
        ended,
        timeout=timeout,
        what=lambda: f"run {run.id} in {run.current_tier}; worker log:\n{worker.log()[-3000:]}",
    )


def _thresholds(cluster: Cluster, busbw: float) -> None:
    for level in ("node", "leaf", "spine"):
        BusbwThreshold.objects.update_or_create(
            cluster=cluster, partition="", level=level, op="all_reduce", defaults={"busbw": busbw}
        )


@pytest.mark.nodes(2, "batch")
def test_a_run_over_two_nodes_issues_its_certificate(
    dev_cluster_registered: Cluster, celery_stack: Any, operator_api: APIClient
) -> None:
    worker = celery_stack["worker"]
    # A threshold every working fabric passes: this test is about the run, not the speed.
    _thresholds(dev_cluster_registered, 1.0)
    run = _ended(_start(operator_api, dev_cluster_registered, ["inventory", "collectives"]), worker)
    assert run.state == "finished", run.reason
    assert run.outcomes["collectives"]["verdict"] == "passed", run.outcomes
    # GPUs are fake here (no nvidia-smi for the probe): passed or honestly inconclusive,
    # but the stacks were compared, and are one.
    inventory = run.steps.get(tier="inventory")
    assert inventory.verdict in ("passed", "inconclusive"), inventory.reason
    assert inventory.evidence["stack_differs"] == []
    assert set(inventory.evidence["nodes"]) == {"n1", "n2"}
    certificate = Certificate.objects.get(run=run)
    document = certificate.document
    assert [n["name"] for n in document["nodes"]] == ["n1", "n2"]
    for entry in document["nodes"]:
        node = Node.objects.get(cluster=dev_cluster_registered, name=entry["name"])
        assert entry["partitions"] == node.partitions == ["batch"]
        assert entry["leaf_switch"] == "leaf1"
        assert [g["type"] for g in entry["gpus"]] == ["a100", "a100"]
        assert entry["stack"].get("python")
    levels = {c["level"] for c in document["criteria"]}
    assert levels == {"node", "leaf"}
    assert all(c["measured_busbw"] and c["measured_busbw"] > 1.0 for c in document["criteria"])
    Node.objects.filter(cluster=dev_cluster_registered).update(acceptance_state="")


@pytest.mark.exclusive
def test_another_torch_on_one_node_is_named_against_its_last_certificate(
    dev_cluster_registered: Cluster,
    celery_stack: Any,
    operator_api: APIClient,
    devcluster: DevCluster,
) -> None:
    """n2 alone gets another torch (its slurmd restarted in a mount namespace of its own,
    so this test owns the cluster): the stack tier fails, and names n2, of two nodes the
    one that changed since its last certificate."""
    worker = celery_stack["worker"]
    before = _ended(_start(operator_api, dev_cluster_registered, ["inventory"]), worker)
    assert before.state == "finished", before.reason
    assert Certificate.objects.filter(run=before).exists()
    inventory = before.steps.get(tier="inventory")
    assert inventory.evidence["stack_differs"] == []
    torch_now = inventory.evidence["nodes"]["n2"]["stack"]["torch"]
    with another_torch_on(devcluster, "n2") as other:
        again = _ended(_start(operator_api, dev_cluster_registered, ["inventory"]), worker)
    assert again.verdict == "failed", again.reason
    assert again.convicted == ["n2"], (again.convicted, again.reason)
    assert f"n2: stack torch is {other}" in again.reason
    assert f"its last certificate: {torch_now}" in again.reason
    evidence = again.steps.get(tier="inventory").evidence
    assert evidence["nodes"]["n1"]["stack"]["torch"] == torch_now
    assert evidence["nodes"]["n2"]["stack"]["torch"] == other
    Node.objects.filter(cluster=dev_cluster_registered).update(acceptance_state="")


@pytest.mark.exclusive
@pytest.mark.skipif(not (CGROUP_CPU / "cpu.cfs_quota_us").exists(), reason="no cgroup v1 cpu")
def test_a_slowed_node_is_convicted_and_no_other(
    dev_cluster_registered: Cluster, celery_stack: Any, operator_api: APIClient
) -> None:
    worker = celery_stack["worker"]
    # A baseline with a threshold anything passes: what this fabric does when healthy.
    _thresholds(dev_cluster_registered, 1.0)
    baseline = _ended(_start(operator_api, dev_cluster_registered, ["collectives"]), worker)
    node_level = [
        s.busbw for s in baseline.steps.filter(tier="collectives", level="node") if s.busbw
    ]
    assert len(node_level) == 2, baseline.outcomes
    # Half the slower healthy node: a node at a 10% CPU quota falls far below it.
    _thresholds(dev_cluster_registered, 0.5 * min(node_level))
    with slowed_collectives("n2", percent=10):
        run = _ended(_start(operator_api, dev_cluster_registered, ["collectives"]), worker)
    assert run.verdict == "failed", run.reason
    assert run.convicted == ["n2"], (run.convicted, run.reason)
    assert Node.objects.get(cluster=dev_cluster_registered, name="n2").acceptance_state == (
        "convicted"
    )
    assert Node.objects.get(cluster=dev_cluster_registered, name="n1").acceptance_state != (
        "convicted"
    )
    Node.objects.filter(cluster=dev_cluster_registered).update(acceptance_state="")


@contextlib.contextmanager
def another_torch_on(devcluster: DevCluster, node: str) -> Iterator[str]:
    """``node`` alone sees another torch in the job venv: its slurmd runs in a mount
    namespace of its own where torch's version file is another one (nothing the code under
    test reads: the probe imports torch as on any node). Yields that version."""
    where = subprocess.run(
        [
            devcluster.python,
            "-I",
            "-c",
            "import importlib.util as u; print(u.find_spec('torch').submodule_search_locations[0])",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    version_file = Path(where) / "version.py"
    text = version_file.read_text()
    found = re.search(r"^__version__ = '([^']+)'$", text, re.MULTILINE)
    assert found, "torch/version.py has no __version__ line"
    other = "2.12.1+cpu" if found.group(1) != "2.12.1+cpu" else "2.11.0+cpu"
    with tempfile.TemporaryDirectory(prefix="other-torch-") as scratch:
        overlay = Path(scratch) / "version.py"
        overlay.write_text(text.replace(found.group(0), f"__version__ = '{other}'"))
        os.chmod(scratch, 0o755)
        overlay.chmod(0o644)
        env = {"DEVCLUSTER_NODE": node}
        try:
            run_script(
                "restart-node",
                dir=devcluster.dir,
                env={**env, "DEVCLUSTER_OVERLAY": f"{overlay}:{version_file}"},
            )
            yield other
        finally:
            run_script("restart-node", dir=devcluster.dir, env=env)
