"""The owner's drill budget and partition check on the dev cluster (issue 37, item 5): a
real job, a drill within the budget that runs, one over it refused, one on a partition the
owner's account never ran a job on refused."""

from __future__ import annotations

from typing import Any

import pytest
from drill_support import run_job, start_drill, wait_finished, wait_verdict
from rest_framework.test import APIClient

from drills.models import DrillBudget, RestoreDrill
from nodes.models import Cluster, Partition

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.nodes(1, "batch")
def test_a_drill_over_budget_and_one_on_another_partition_are_refused(
    dev_cluster_registered: Cluster, celery_stack: Any, researcher_api: APIClient
) -> None:
    worker = celery_stack["worker"]
    job = wait_finished(run_job(researcher_api, steps=15, every=5, name="budget", nodes=1), worker)
    checkpoints = {c.step: c for c in job.checkpoints.all()}
    DrillBudget.objects.filter(cluster=dev_cluster_registered).update(max_active_drills=1)
    first = start_drill(researcher_api, checkpoints[5], steps=3)
    over = researcher_api.post(
        f"/api/v1/checkpoints/{checkpoints[10].pk}/drills/", {"steps": 3}, format="json"
    )
    assert over.status_code == 400, over.json()
    assert "1 active drill" in over.json()["extra"]["fields"]["budget"][0]
    others = Partition.objects.filter(cluster=dev_cluster_registered, gone=False).exclude(
        name=job.partition
    )
    other = others.order_by("name").values_list("name", flat=True).first()
    if other is not None:
        elsewhere = researcher_api.post(
            f"/api/v1/checkpoints/{checkpoints[10].pk}/drills/",
            {"steps": 3, "nodes": 1, "partition": other},
            format="json",
        )
        assert elsewhere.status_code == 400, elsewhere.json()
        # The dev cluster's partitions let every account submit (AllowAccounts=ALL), as its
        # scontrol said: the partition passes and the budget refuses; where Slurm restricts
        # the partition, the partition refuses first.
        opened = Partition.objects.get(cluster=dev_cluster_registered, name=other).open_to_all
        expected = {"budget"} if opened else {"partition"}
        assert set(elsewhere.json()["extra"]["fields"]) == expected
    drill = wait_verdict(first, worker)
    assert drill.verdict in {"passed", "failed", "inconclusive", "error"}
    # Once it ended the slot is free again.
    second = wait_verdict(start_drill(researcher_api, checkpoints[10], steps=3), worker)
    assert RestoreDrill.objects.filter(checkpoint__job=job).count() == 2
    assert second.gpus == job.nodes * job.gpus_per_node
