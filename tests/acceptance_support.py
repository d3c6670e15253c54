"""Helpers of the acceptance tests: a cluster of two leaves of two nodes (two a100 each),
a login node whose files the steps "wrote", and the real lifecycle's watch path fed with
exit records (no Slurm here: the steps' jobs end as the test says, their files are what a
real step writes)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from acceptance.lifecycle import RESULT_NAME, STEPS, step_directory
from acceptance.models import AcceptanceRun, AcceptanceStep
from acceptance.orchestrate import run_advance
from factories import ClusterFactory, GpuFactory, NodeFactory, PartitionFactory
from nodes.models import Cluster, Switch
from runs.lifecycle import ACCOUNTING_NONE, SlurmViews
from slurm.errors import RemoteFileNotFound, RemoteFileRefused

HEALTH_FIXTURES = Path(__file__).resolve().parent / "health" / "fixtures"
STACK = {"python": "3.11.7", "kernel": "6.1.0", "torch": "2.4.0", "torch_cuda": "12.4"}


def a100_cluster() -> Cluster:
    cluster = ClusterFactory(name="accept", default_partition="train")
    PartitionFactory(cluster=cluster, name="train", is_default=True)
    spine = Switch.objects.create(cluster=cluster, name="spine", level=1)
    for leaf_index, names in ((1, ("n1", "n2")), (2, ("n3", "n4"))):
        leaf = Switch.objects.create(cluster=cluster, name=f"leaf{leaf_index}", parent=spine)
        for name in names:
            node = NodeFactory(cluster=cluster, name=name, partitions=["train"], leaf_switch=leaf)
            GpuFactory(node=node, index=0, gpu_type="a100")
            GpuFactory(node=node, index=1, gpu_type="a100")
    return cluster


def probe_document(node: str, stack: dict[str, Any] | None = None) -> dict[str, Any]:
    smi = (HEALTH_FIXTURES / "derived" / "a100-2gpu-healthy.xml").read_text()

    def command(stdout: str) -> dict[str, Any]:
        return {"argv": ["x"], "exit_code": 0, "stdout": stdout, "stderr": "", "seconds": 0.1}

    return {
        "schema": "gantry-node-probe/1",
        "node": node,
        "taken_at": 1_900_000_000.0,
        "boot_id": "boot-1",
        "commands": {
            "nvidia_smi": command(smi),
            "topology": command(""),
            "nvlink": command(""),
            "kernel_log": command(""),
        },
        "stack": stack or dict(STACK),
    }


def collectives_document(nodes: list[str], busbw: float, *, correct: bool = True) -> dict:
    return {
        "schema": "gantry-trainer-collectives/1",
        "verdict": "passed" if correct else "failed",
        "world_size": 2 * len(nodes),
        "backend": "gloo",
        "device": "cpu",
        "unique_nodes": sorted(nodes),
        "versions": {"torch": "2.4.0"},
        "results": [
            {"op": "all_reduce", "bytes": 1 << 20, "busbw": busbw / 2, "correct": True},
            {"op": "all_reduce", "bytes": 1 << 24, "busbw": busbw, "correct": correct},
        ],
    }


@dataclass
class LoginNode:
    """The files the steps' jobs wrote, read back by the lifecycle as the service account."""

    files: dict[str, bytes] = field(default_factory=dict)
    reads: list[str] = field(default_factory=list)

    def read_bounded(self, path: str, max_bytes: int) -> bytes:
        self.reads.append(path)
        if path not in self.files:
            raise RemoteFileNotFound(path, path=path)
        # As the SFTP reader does: a file over the bound is refused, never cut.
        if len(self.files[path]) > max_bytes:
            raise RemoteFileRefused(f"{path} is over the {max_bytes} read", path=path)
        return self.files[path]


@pytest.fixture
def login_node(monkeypatch: pytest.MonkeyPatch) -> LoginNode:
    node = LoginNode()
    monkeypatch.setattr(STEPS, "transport_of", lambda obj: node)
    return node


_slurm_ids = iter(range(1000, 100000))


def end_step(step: AcceptanceStep, login_node: LoginNode, *, exit_code: int = 0) -> None:
    """The step's Slurm job ran and ended: the lifecycle applies its exit record."""
    slurm_id = str(next(_slurm_ids))
    AcceptanceStep.objects.filter(id=step.id).update(
        state=AcceptanceStep.State.RUNNING, slurm_job_id=slurm_id
    )
    step = AcceptanceStep.objects.select_related("cluster", "run").get(id=step.id)
    views = SlurmViews(
        queue={},
        accounted={},
        accounting=ACCOUNTING_NONE,
        exits={slurm_id: {"slurm_job_id": slurm_id, "exit_code": exit_code, "signal": None}},
    )
    errors: list[str] = []
    STEPS.apply_views([step], views, timezone.now(), errors)
    assert not errors, errors


def finish_inventory(
    run: AcceptanceRun, login_node: LoginNode, stacks: dict[str, Any] | None = None
) -> None:
    step = run.steps.get(tier="inventory")
    # The rank files name the Slurm id the step runs under: written as end_step assigns it.
    slurm_id = str(next(_slurm_ids))
    for rank, node in enumerate(step.nodes):
        text = "a warning on stderr\n" + json.dumps(probe_document(node, (stacks or {}).get(node)))
        login_node.files[f"{step_directory(step)}/rank-{slurm_id}-{rank}.out"] = text.encode()
    AcceptanceStep.objects.filter(id=step.id).update(
        state=AcceptanceStep.State.RUNNING, slurm_job_id=slurm_id
    )
    step = AcceptanceStep.objects.select_related("cluster", "run").get(id=step.id)
    views = SlurmViews(
        queue={},
        accounted={},
        accounting=ACCOUNTING_NONE,
        exits={slurm_id: {"slurm_job_id": slurm_id, "exit_code": 0, "signal": None}},
    )
    STEPS.apply_views([step], views, timezone.now(), [])
    run_advance(run_id=run.id, now=timezone.now())


Bandwidth = Callable[[tuple[str, ...]], float]


def finish_collectives(run: AcceptanceRun, login_node: LoginNode, bandwidth: Bandwidth) -> int:
    """End every open collectives or isolation step with the busbw ``bandwidth`` gives
    its group, then advance the run; returns how many steps ended."""
    open_steps = list(
        run.steps.filter(tier__in=["collectives", "isolation"]).filter(
            state__in=list(AcceptanceStep.ACTIVE_STATES)
        )
    )
    for step in open_steps:
        doc = collectives_document(step.nodes, bandwidth(tuple(step.nodes)))
        login_node.files[f"{step_directory(step)}/{RESULT_NAME}"] = json.dumps(doc).encode()
        end_step(step, login_node)
    run_advance(run_id=run.id, now=timezone.now())
    return len(open_steps)


def drive(run: AcceptanceRun, login_node: LoginNode, bandwidth: Bandwidth) -> AcceptanceRun:
    """Advance the run until it ends (every step measured by ``bandwidth``)."""
    for _ in range(30):
        run.refresh_from_db()
        if not run.is_active:
            return run
        if not finish_collectives(run, login_node, bandwidth):
            run_advance(run_id=run.id, now=timezone.now())
    raise AssertionError(f"run still {run.state} in tier {run.current_tier}")
