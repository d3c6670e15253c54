"""SQL queries per request of the pages and polls people keep open, in a small fleet and
in one five times larger (more nodes, jobs, metric points, checkpoints, events): the same
number, and the overview within its budget.

Counted twice per endpoint: with empty caches (what a request costs when nothing was
reused) and again right after (what a poll costs); a revalidation (``If-None-Match`` with
the response's ETag) is answered 304 and counted too.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.cache import cache
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from drills.models import RestoreDrill
from factories import ClusterFactory, SwitchFactory, UserFactory
from jobs.ingest import point_totals_refresh
from jobs.models import Checkpoint, Job, JobEvent, MetricPoint
from nodes.models import Gpu, Node

pytestmark = pytest.mark.django_db

# The overview's budget at fleet scale (issue 16), sign-in and roles included.
OVERVIEW_MAX_QUERIES = 8
STATES = ["completed"] * 5 + ["failed", "cancelled", "running", "pending", "queued"]


class Fleet:
    """A researcher's running, placed job with points, checkpoints, events and a drill
    running on one checkpoint, among other people's jobs on two clusters of nodes."""

    def __init__(self, researcher: Any) -> None:
        self.researcher = researcher
        self.other = UserFactory(username="fleet-other", role="researchers")
        self.clusters = [ClusterFactory(name="fleet-a"), ClusterFactory(name="fleet-b")]
        self.leaves = [SwitchFactory(cluster=self.clusters[0], name=f"leaf{i}") for i in range(2)]
        self.nodes = 0
        self.jobs = 0
        started = timezone.now() - timedelta(hours=2)
        self.job = Job.objects.create(
            owner=researcher,
            cluster=self.clusters[0],
            name="watched",
            partition="batch",
            state=Job.State.RUNNING,
            nodes=2,
            gpus_per_node=2,
            total_steps=100_000,
            submitted_at=started - timedelta(minutes=5),
            started_at=started,
            allocated_nodes="fn[00000-00001]",
        )
        self.points = 0
        self.checkpoints = 0
        self.grow(1)
        checkpoint = self.job.checkpoints.order_by("step").first()
        assert checkpoint is not None
        self.drill = RestoreDrill.objects.create(
            checkpoint=checkpoint,
            cluster=self.clusters[0],
            state=RestoreDrill.State.RUNNING,
            slurm_job_id="77",
            started_at=timezone.now() - timedelta(minutes=1),
        )

    def grow(self, scale: int) -> None:
        """Add 20·scale nodes (2 GPUs each), 50·scale jobs, 500·scale metric points, 3·scale
        checkpoints and 5·scale timeline events of the watched job."""
        nodes = [
            Node(
                cluster=self.clusters[(self.nodes + i) % 2],
                name=f"fn{self.nodes + i:05d}",
                state=Node.State.IDLE if i % 3 else Node.State.ALLOCATED,
                cpus_total=64,
                memory_mb=512_000,
                partitions=["batch"],
                partitions_text=",batch,",
                leaf_switch=self.leaves[i % 2] if (self.nodes + i) % 2 == 0 else None,
            )
            for i in range(20 * scale)
        ]
        self.nodes += len(nodes)
        Node.objects.bulk_create(nodes)
        Gpu.objects.bulk_create(
            Gpu(node=node, index=index, gpu_type="h100", state="allocated" if index else "free")
            for node in Node.objects.filter(gpus__isnull=True)
            for index in range(2)
        )
        now = timezone.now()
        Job.objects.bulk_create(
            Job(
                owner=self.researcher if i % 2 else self.other,
                cluster=self.clusters[i % 2],
                name=f"fleet-{self.jobs + i}",
                partition="batch",
                state=STATES[i % len(STATES)],
                submitted_at=now - timedelta(hours=1 + i),
                started_at=now - timedelta(hours=1 + i) + timedelta(minutes=1),
                ended_at=(
                    now - timedelta(minutes=i)
                    if STATES[i % len(STATES)] in ("completed", "failed", "cancelled")
                    else None
                ),
            )
            for i in range(50 * scale)
        )
        self.jobs += 50 * scale
        base = datetime(2026, 1, 1, tzinfo=UTC)
        MetricPoint.objects.bulk_create(
            MetricPoint(
                job=self.job,
                step=step,
                wall_time=base + timedelta(seconds=step),
                elapsed_s=float(step),
                loss=2.0,
                samples_per_s=100.0,
                step_time_s=0.5,
                data_time_s=0.01,
                checkpoint_blocking_s=1.0 if step % 100 == 0 else 0.0,
            )
            for step in range(self.points + 1, self.points + 500 * scale + 1)
        )
        self.points += 500 * scale
        # As ingest keeps them: the points moved the offset and the sums with it.
        Job.objects.filter(id=self.job.id).update(metrics_offset=self.points * 100)
        point_totals_refresh(job_ids=[self.job.id])
        Checkpoint.objects.bulk_create(
            Checkpoint(
                job=self.job,
                step=100 * (self.checkpoints + i + 1),
                path=f"/runs/{self.job.id}/step-{self.checkpoints + i}",
                manifest={"strategy": "ddp", "files": [{"name": "rank0.pt", "size": 1}]},
                last_proven_at=now if i == 0 else None,
            )
            for i in range(3 * scale)
        )
        self.checkpoints += 3 * scale
        JobEvent.objects.bulk_create(
            JobEvent(job=self.job, kind="state", to_state="running", message=f"event {i}")
            for i in range(5 * scale)
        )

    def endpoints(self) -> dict[str, str]:
        job = self.job.id
        return {
            "overview": "/",
            "overview live": "/overview/live/",
            "job page": f"/jobs/{job}/",
            "job status poll": f"/jobs/{job}/status/",
            "job metrics poll": f"/api/v1/jobs/{job}/metrics/",
            "job list": "/jobs/",
            "api job list": "/api/v1/jobs/?page_size=50",
            "drill status poll": f"/drills/{self.drill.id}/status/",
            "node list poll": "/nodes/live/",
        }


def count(client: Client, path: str, **headers: Any) -> tuple[int, Any]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path, **headers)
    return len(captured.captured_queries), response


def counts(client: Client, fleet: Fleet) -> dict[str, tuple[int, int, int | None]]:
    """Per endpoint: queries with empty caches, of the next request, of a revalidation."""
    found = {}
    for label, path in fleet.endpoints().items():
        cache.clear()
        cold, response = count(client, path)
        assert response.status_code == 200, (path, response.status_code)
        warm, response = count(client, path)
        assert response.status_code == 200, (path, response.status_code)
        revalidated = None
        if response.get("ETag"):
            revalidated, again = count(client, path, HTTP_IF_NONE_MATCH=response["ETag"])
            assert again.status_code == 304, path
        found[label] = (cold, warm, revalidated)
    return found


@pytest.fixture
def fleet(researcher: Any, still_clock: datetime) -> Fleet:
    return Fleet(researcher)


def test_queries_per_request_do_not_grow_with_the_fleet(researcher: Any, fleet: Fleet) -> None:
    client = Client()
    client.force_login(researcher)
    # The first request of a session also reads what later ones find cached on the user.
    client.get("/")
    small = counts(client, fleet)
    fleet.grow(5)
    large = counts(client, fleet)
    assert large == small
    # Every poll can be answered 304.
    for label in ("job status poll", "job metrics poll", "drill status poll", "node list poll"):
        assert small[label][2] is not None, label
    assert small["overview"][1] <= OVERVIEW_MAX_QUERIES
    assert small["overview live"][1] <= OVERVIEW_MAX_QUERIES


def test_the_polled_header_reads_no_node_after_its_first_placement_check(
    researcher: Any, fleet: Fleet
) -> None:
    client = Client()
    client.force_login(researcher)
    path = f"/jobs/{fleet.job.id}/status/"
    cache.clear()
    with CaptureQueriesContext(connection) as first:
        html = client.get(path).content.decode()
    assert "fn[00000-00001]" in html
    with CaptureQueriesContext(connection) as again:
        client.get(path)
    reads_nodes = [q for q in again.captured_queries if '"nodes_node"' in q["sql"]]
    assert [q for q in first.captured_queries if '"nodes_node"' in q["sql"]]
    assert not reads_nodes
    # A new allocation (a requeue elsewhere) is judged again.
    Job.objects.filter(id=fleet.job.id).update(allocated_nodes="fn[00002-00003]")
    with CaptureQueriesContext(connection) as moved:
        html = client.get(path).content.decode()
    assert "fn[00002-00003]" in html
    assert [q for q in moved.captured_queries if '"nodes_node"' in q["sql"]]
