"""Fixtures of the recovery tests: a cluster of a shape the dev cluster does not have, and
the lifecycle's cancel replaced by a recorder."""

from __future__ import annotations

from typing import Any

import pytest

from factories import ClusterFactory, GpuFactory, NodeFactory, PartitionFactory
from jobs.lifecycle import JOBS
from jobs.models import Job
from nodes.models import Cluster


@pytest.fixture
def cluster() -> Cluster:
    cluster = ClusterFactory(name="tenant-b", is_default=True, default_partition="train")
    PartitionFactory(cluster=cluster, name="train", max_time_minutes=600, is_default=True)
    for index in range(1, 7):
        node = NodeFactory(
            cluster=cluster, name=f"gpu-b-{index:02d}", partitions=["train"], cpus_total=8
        )
        GpuFactory(node=node, index=0, gpu_type="h200")
    return cluster


@pytest.fixture
def cancels(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    sent: list[str] = []

    def cancel(obj: Job, *, by: str, audit: Any) -> str:
        sent.append(str(obj.id))
        audit(obj)
        return "scancel sent"

    monkeypatch.setattr(JOBS, "cancel", cancel)
    return sent
