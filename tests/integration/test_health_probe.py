"""The node probe end to end on the dev cluster: slurmd runs the health-check hook as root
(HealthCheckProgram, every 30 s), the hook writes DIR/health/probes/<node>.json, Gantry's
collector reads them all in one command as the service account, and a node whose fake GPUs
report XID 79 ends critical and is left out of placement advice.

Needs the dev cluster brought up by a scripts/devcluster with the health check (its
slurm.conf names HealthCheckProgram and the slurmd's run on it)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from devcluster_support import DevCluster
from health.collection import health_collect
from health.models import HealthSource, NodeHealth
from health.operators import health_source_update
from nodes.models import Node

pytestmark = pytest.mark.django_db(transaction=True)
NODES = ("n1", "n2", "n3", "n4")
# Two HealthCheckIntervals and the probe's own time.
HOOK_WAIT_S = 75


def _probe(path: Path) -> dict[str, Any] | None:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _wait_for(what: str, check: Any, timeout: float = HOOK_WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def _has_xid(path: Path) -> bool:
    found = _probe(path)
    kernel_log = ((found or {}).get("commands") or {}).get("kernel_log") or {}
    return "Xid" in str(kernel_log.get("stdout", ""))


@pytest.mark.exclusive
def test_the_hook_writes_probes_and_a_faulty_node_is_avoided(
    devcluster: DevCluster, dev_cluster_registered: Any, researcher_api: APIClient
) -> None:
    cluster = dev_cluster_registered
    env = devcluster.env
    probes = Path(env["GANTRY_CLUSTER_HEALTH_DIR"])
    fake_gpu = Path(env["DEVCLUSTER_FAKE_GPU_DIR"])
    # slurmd (root) wrote every node's probe, in a root-owned directory, world-readable.
    _wait_for(
        "every node's probe file", lambda: all((probes / f"{n}.json").exists() for n in NODES)
    )
    assert probes.stat().st_uid == 0 and oct(probes.stat().st_mode & 0o777) == "0o755"
    for name in NODES:
        written = probes / f"{name}.json"
        assert written.stat().st_uid == 0 and oct(written.stat().st_mode & 0o777) == "0o644"
        assert (_probe(written) or {}).get("node") == name

    health_source_update(
        actor=None, cluster=cluster, system=True, directory=str(probes), interval_seconds=30
    )
    original = (fake_gpu / "n3").read_text()
    try:
        (fake_gpu / "n3").write_text("h100 xid79\n")
        _wait_for("n3's probe with XID 79", lambda: _has_xid(probes / "n3.json"))
        result = health_collect(cluster_id=cluster.pk)
        assert result is not None and result.ok, result
        assert result.commands == 1 and result.counts.get("recorded") == len(NODES)
        states = dict(Node.objects.filter(cluster=cluster).values_list("name", "health_state"))
        assert states == {"n1": "ok", "n2": "ok", "n3": "critical", "n4": "ok"}
        reasons = " ".join(NodeHealth.objects.get(node__name="n3").reasons)
        assert "79" in reasons
        source = HealthSource.objects.get(cluster=cluster)
        assert source.last_commands == 1 and source.last_bytes > 0 and not source.last_error

        # Placement advice for one GPU in the gpu partition (n3, n4) leaves n3 out.
        body = {
            "name": "avoid-n3",
            "partition": "gpu",
            "nodes": 1,
            "gpus_per_node": 1,
            "tasks_per_node": 1,
            "time_limit_minutes": 5,
            "config": {"preset": "tiny", "steps": 5, "checkpoint_every": 0},
        }
        preview = researcher_api.post("/api/v1/jobs/preview/", body, format="json")
        assert preview.status_code == 200, preview.json()
        advice = preview.json()["placement"]
        assert advice["feasible"] and advice["nodelist"] == "n4", advice
    finally:
        (fake_gpu / "n3").write_text(original)
