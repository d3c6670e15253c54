"""/metrics: who may scrape it, and that the numbers match the database."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from controlplane.env import envnetworks
from core import worker_stats
from drills.models import RestoreDrill
from factories import CheckpointFactory, ClusterFactory, JobFactory
from jobs.models import Job
from nodes.models import Cluster

TOKEN = "scrape-token-0123456789"


@pytest.fixture(autouse=True)
def metrics_settings(settings: Any) -> Any:
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_ALLOW = [ipaddress.ip_network("10.9.0.0/16")]
    caches[worker_stats.CACHE_ALIAS].clear()
    return settings


def scrape(client: Client, **extra: Any) -> Any:
    return client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}", **extra)


def samples(response: Any) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    assert response.status_code == 200, response.content
    text = response.content.decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(found: dict[Any, float], name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


def drill(checkpoint: Any, *, state: str, verdict: str = "", cluster: Any = None) -> Any:
    return RestoreDrill.objects.create(
        checkpoint=checkpoint,
        allocation_key=f"key-{RestoreDrill.objects.count()}",
        state=state,
        verdict=verdict,
        cluster=cluster,
    )


# ------------------------------------------------------------------ access


@pytest.mark.django_db
def test_refused_without_credentials(client: Client) -> None:
    response = client.get("/metrics", REMOTE_ADDR="192.0.2.7")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"gantry_" not in response.content


@pytest.mark.django_db
def test_refused_with_a_wrong_token_even_from_an_allowed_address(client: Client) -> None:
    for address in ("192.0.2.7", "10.9.1.2"):
        response = client.get(
            "/metrics", HTTP_AUTHORIZATION="Bearer not-the-token", REMOTE_ADDR=address
        )
        assert response.status_code == 403
        assert b"gantry_" not in response.content


@pytest.mark.django_db
def test_refused_with_a_token_of_another_scheme(client: Client) -> None:
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Token {TOKEN}", REMOTE_ADDR="192.0.2.7")
    assert response.status_code == 401


@pytest.mark.django_db
def test_off_when_neither_token_nor_addresses_are_set(client: Client, settings: Any) -> None:
    settings.METRICS_TOKEN = None
    settings.METRICS_ALLOW = []
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer ", REMOTE_ADDR="127.0.0.1")
    assert response.status_code == 403
    assert b"GANTRY_METRICS_TOKEN" in response.content


@pytest.mark.django_db
def test_allowed_with_the_token(client: Client) -> None:
    response = scrape(client, REMOTE_ADDR="192.0.2.7")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    assert b"# TYPE gantry_jobs gauge" in response.content


@pytest.mark.django_db
@pytest.mark.parametrize("address", ["10.9.1.2", "::ffff:10.9.200.1"])
def test_allowed_from_an_allowed_address(client: Client, address: str) -> None:
    response = client.get("/metrics", REMOTE_ADDR=address)
    assert response.status_code == 200
    assert b"# TYPE gantry_jobs gauge" in response.content


@pytest.mark.django_db
def test_behind_the_trusted_proxy_the_clients_address_decides(
    client: Client, settings: Any
) -> None:
    """The proxy's own address may be in the allow list; a client it forwards is not let in
    for it, and an allowed client behind it is."""
    settings.TRUSTED_PROXIES = [ipaddress.ip_network("10.9.0.5/32")]
    outside = client.get("/metrics", REMOTE_ADDR="10.9.0.5", HTTP_X_FORWARDED_FOR="203.0.113.9")
    assert outside.status_code == 401
    inside = client.get("/metrics", REMOTE_ADDR="10.9.0.5", HTTP_X_FORWARDED_FOR="10.9.3.3")
    assert inside.status_code == 200


def test_only_get(client: Client) -> None:
    response = client.post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 405


def test_allow_list_setting_refuses_bad_values() -> None:
    assert envnetworks("X", environ={}) == []
    assert envnetworks("X", environ={"X": "10.0.0.5, 192.168.0.0/24,,::1"}) == [
        ipaddress.ip_network("10.0.0.5/32"),
        ipaddress.ip_network("192.168.0.0/24"),
        ipaddress.ip_network("::1/128"),
    ]
    for bad in ("10.0.0.5/24", "example.org", "10.0.0.0/33"):
        with pytest.raises(ImproperlyConfigured, match=r"^X: "):
            envnetworks("X", environ={"X": bad})


# ------------------------------------------------------------------ values


@pytest.mark.django_db
def test_job_and_drill_counts_match_the_database(client: Client) -> None:
    x = ClusterFactory(name="x")
    y = ClusterFactory(name="y")
    proven_job = JobFactory(cluster=x, state=Job.State.RUNNING)
    unproven_job = JobFactory(cluster=x, state=Job.State.RUNNING)
    JobFactory(cluster=x, state=Job.State.FAILED)
    JobFactory(cluster=y, state=Job.State.QUEUED)
    JobFactory(cluster=y, state=Job.State.SUBMITTING)
    # Proven: the newest checkpoint passed a drill. An older proven one does not count.
    CheckpointFactory(job=proven_job, step=100)
    proven = CheckpointFactory(job=proven_job, step=200, last_proven_at=timezone.now())
    CheckpointFactory(job=unproven_job, step=100, last_proven_at=timezone.now())
    newest_unproven = CheckpointFactory(job=unproven_job, step=200)
    drill(proven, state=RestoreDrill.State.FINISHED, verdict="passed", cluster=x)
    drill(proven, state=RestoreDrill.State.FINISHED, verdict="passed", cluster=x)
    drill(newest_unproven, state=RestoreDrill.State.FINISHED, verdict="failed", cluster=x)
    # Not submitted yet: no cluster of its own, counted where its job runs.
    drill(newest_unproven, state=RestoreDrill.State.QUEUED)

    found = samples(scrape(client))

    assert value(found, "gantry_jobs", cluster="x", state="running") == 2
    assert value(found, "gantry_jobs", cluster="x", state="failed") == 1
    assert value(found, "gantry_jobs", cluster="x", state="queued") == 0
    assert value(found, "gantry_jobs", cluster="y", state="queued") == 1
    assert value(found, "gantry_jobs", cluster="y", state="running") == 0
    assert value(found, "gantry_submit_backlog", cluster="y", kind="job") == 2
    assert value(found, "gantry_submit_backlog", cluster="x", kind="job") == 0
    assert value(found, "gantry_submit_backlog", cluster="x", kind="drill") == 1
    assert value(found, "gantry_drills", cluster="x", state="finished", verdict="passed") == 2
    assert value(found, "gantry_drills", cluster="x", state="finished", verdict="failed") == 1
    assert value(found, "gantry_drills", cluster="x", state="queued", verdict="none") == 1
    assert value(found, "gantry_running_jobs", cluster="x") == 2
    assert value(found, "gantry_running_jobs_proven", cluster="x") == 1
    assert value(found, "gantry_running_jobs_proven_ratio", cluster="x") == 0.5
    assert value(found, "gantry_running_jobs", cluster="y") == 0
    # No running job: no ratio rather than a made-up one.
    assert value(found, "gantry_running_jobs_proven_ratio", cluster="y") is None


@pytest.mark.django_db
def test_cluster_health(client: Client) -> None:
    synced_at = timezone.now().replace(microsecond=0)
    ClusterFactory(
        name="healthy",
        sync_status=Cluster.SyncStatus.OK,
        last_sync_ok_at=synced_at,
        accounting_available=True,
    )
    ClusterFactory(
        name="sick",
        sync_status=Cluster.SyncStatus.ERROR,
        sync_failures=3,
        accounting_available=True,
        accounting_failures=2,
        last_reconcile_at=synced_at,
        last_reconcile_error="squeue: timed out",
    )

    found = samples(scrape(client))

    assert value(found, "gantry_cluster_sync_status", cluster="healthy", status="ok") == 1
    assert value(found, "gantry_cluster_sync_status", cluster="healthy", status="error") == 0
    assert value(found, "gantry_cluster_sync_status", cluster="sick", status="error") == 1
    assert value(found, "gantry_cluster_sync_failures", cluster="sick") == 3
    assert (
        value(found, "gantry_cluster_last_sync_success_timestamp_seconds", cluster="healthy")
        == synced_at.timestamp()
    )
    assert (
        value(found, "gantry_cluster_last_sync_success_timestamp_seconds", cluster="sick") is None
    )
    assert value(found, "gantry_cluster_reconcile_error", cluster="sick") == 1
    assert value(found, "gantry_cluster_reconcile_error", cluster="healthy") == 0
    assert value(found, "gantry_cluster_accounting_available", cluster="sick") == 1
    assert value(found, "gantry_cluster_accounting_failures", cluster="sick") == 2
    assert value(found, "gantry_cluster_accounting_failures", cluster="healthy") == 0


@pytest.mark.django_db
def test_worker_timings_recorded_by_watcher_cycles_are_exported(client: Client) -> None:
    cluster = ClusterFactory(name="x")
    for seconds, failed, ssh_errors in ((0.5, False, 0), (1.5, True, 1)):
        worker_stats.watcher_cycle_record(
            cluster_id=cluster.pk,
            stats=worker_stats.WatcherCycleStats(
                seconds=seconds,
                failed=failed,
                ssh_commands=3,
                ssh_seconds=0.25,
                ssh_errors=ssh_errors,
            ),
        )

    found = samples(scrape(client))

    assert value(found, "gantry_watcher_cycle_duration_seconds_count", cluster="x") == 2
    assert value(found, "gantry_watcher_cycle_duration_seconds_sum", cluster="x") == 2.0
    assert value(found, "gantry_watcher_last_cycle_duration_seconds", cluster="x") == 1.5
    assert value(found, "gantry_watcher_cycle_failures_total", cluster="x") == 1
    assert value(found, "gantry_ssh_command_duration_seconds_count", cluster="x") == 6
    assert value(found, "gantry_ssh_command_duration_seconds_sum", cluster="x") == 0.5
    assert value(found, "gantry_ssh_command_errors_total", cluster="x") == 1


@pytest.mark.django_db
def test_a_watcher_cycle_records_its_duration(client: Client) -> None:
    from watcher.cycle import cluster_reconcile

    # Nothing to watch: the cycle ends without touching the cluster, but still counts.
    cluster = ClusterFactory(name="idle")
    cluster_reconcile(cluster_id=cluster.pk)

    found = samples(scrape(client))

    assert value(found, "gantry_watcher_cycle_duration_seconds_count", cluster="idle") == 1
    assert value(found, "gantry_ssh_command_duration_seconds_count", cluster="idle") == 0


@pytest.mark.django_db
def test_an_unreachable_stats_cache_leaves_the_database_metrics(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = ClusterFactory(name="x")
    JobFactory(cluster=cluster, state=Job.State.RUNNING)
    cache = caches[worker_stats.CACHE_ALIAS]

    def down(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("redis is down")

    monkeypatch.setattr(cache, "get_many", down)
    monkeypatch.setattr(cache, "add", down)
    # Recording fails quietly: a watcher cycle must not break on its metrics.
    worker_stats.watcher_cycle_record(
        cluster_id=cluster.pk,
        stats=worker_stats.WatcherCycleStats(
            seconds=1.0, failed=False, ssh_commands=1, ssh_seconds=0.1, ssh_errors=0
        ),
    )

    found = samples(scrape(client))

    assert value(found, "gantry_jobs", cluster="x", state="running") == 1
    assert value(found, "gantry_watcher_cycle_duration_seconds_count", cluster="x") is None


@pytest.mark.django_db
def test_query_count_does_not_grow_with_the_fleet(client: Client) -> None:
    def queries_per_scrape() -> int:
        with CaptureQueriesContext(connection) as captured:
            samples(scrape(client))
        return len(captured)

    def add_fleet() -> None:
        cluster = ClusterFactory()
        for state in (Job.State.RUNNING, Job.State.RUNNING, Job.State.QUEUED):
            job = JobFactory(cluster=cluster, state=state)
            checkpoint = CheckpointFactory(job=job, last_proven_at=timezone.now())
            drill(checkpoint, state=RestoreDrill.State.FINISHED, verdict="passed", cluster=cluster)
            drill(checkpoint, state=RestoreDrill.State.QUEUED)

    add_fleet()
    small = queries_per_scrape()
    for _ in range(4):
        add_fleet()
    # Clusters, jobs, drills, proven running jobs, work at risk, the goodput window's jobs
    # and their metric sums, incidents and suspect nodes; the fleet's health (nodes, GPU
    # verdicts, the inventory's GPUs).
    assert queries_per_scrape() == small == 12


@pytest.mark.django_db
def test_work_at_risk_and_goodput(client: Client) -> None:
    from datetime import timedelta

    from jobs.models import MetricPoint

    now = timezone.now()
    x = ClusterFactory(name="x", proven_checkpoint_max_age_minutes=60)
    ClusterFactory(name="idle")
    # 8 GPUs, proven 2 h ago, written 30 min ago: over the 60-minute limit.
    big = JobFactory(
        cluster=x,
        state=Job.State.RUNNING,
        nodes=2,
        gpus_per_node=4,
        submitted_at=now - timedelta(hours=3, minutes=1),
        started_at=now - timedelta(hours=3),
    )
    CheckpointFactory(job=big, step=100, saved_at=now - timedelta(hours=2), last_proven_at=now)
    CheckpointFactory(job=big, step=200, saved_at=now - timedelta(minutes=30))
    # No GPUs, 2 ranks, nothing saved in its 15 minutes.
    small = JobFactory(
        cluster=x,
        state=Job.State.RUNNING,
        gpus_per_node=0,
        tasks_per_node=2,
        started_at=now - timedelta(minutes=15),
    )
    # An ended job in the goodput window: 100 s queued, 10 steps of 6 s (1 s data wait).
    done = JobFactory(
        cluster=x,
        state=Job.State.COMPLETED,
        submitted_at=now - timedelta(hours=1),
        started_at=now - timedelta(hours=1) + timedelta(seconds=100),
        ended_at=now - timedelta(hours=1) + timedelta(seconds=160),
    )
    MetricPoint.objects.bulk_create(
        [
            MetricPoint(
                job=done,
                step=step,
                wall_time=done.started_at + timedelta(seconds=6 * step),
                elapsed_s=6.0 * step,
                step_time_s=6.0,
                data_time_s=1.0,
                checkpoint_blocking_s=0.0,
            )
            for step in range(1, 11)
        ]
    )

    found = samples(scrape(client))

    proven = value(found, "gantry_work_at_risk_gpu_hours", cluster="x", since="proven")
    written = value(found, "gantry_work_at_risk_gpu_hours", cluster="x", since="written")
    assert proven == pytest.approx(8 * 2 + 2 * 0.25, rel=1e-3)
    assert written == pytest.approx(8 * 0.5 + 2 * 0.25, rel=1e-3)
    assert value(found, "gantry_work_at_risk_gpu_hours", cluster="idle", since="proven") == 0
    assert value(found, "gantry_proven_age_breaches", cluster="x") == 1
    assert value(found, "gantry_proven_age_breaches", cluster="idle") == 0
    oldest = value(found, "gantry_running_jobs_oldest_proven_age_seconds", cluster="x")
    assert oldest == pytest.approx(7200, abs=5)
    assert value(found, "gantry_running_jobs_oldest_proven_age_seconds", cluster="idle") is None
    assert small.id  # counted above as 2 ranks × 15 minutes
    # Goodput: the ended job and the running ones (their whole span so far, no steps).
    ratio = value(found, "gantry_goodput_ratio", cluster="x")
    productive = value(found, "gantry_goodput_seconds", cluster="x", bucket="productive")
    data_wait = value(found, "gantry_goodput_seconds", cluster="x", bucket="data_wait")
    assert productive == pytest.approx(50) and data_wait == pytest.approx(10)
    wall = sum(
        value(found, "gantry_goodput_seconds", cluster="x", bucket=bucket) or 0.0
        for bucket in (
            "queued",
            "startup",
            "restore",
            "productive",
            "data_wait",
            "checkpoint_blocking",
            "lost_progress",
            "idle",
            "other",
        )
    )
    assert wall == pytest.approx(160 + (3 * 3600 + 60) + 15 * 60, abs=5)
    assert ratio == pytest.approx(productive / wall, rel=1e-6)
    assert value(found, "gantry_goodput_ratio", cluster="idle") is None


@pytest.mark.django_db
def test_incidents_and_suspect_nodes_are_exported(client: Client) -> None:
    from factories import NodeFactory
    from recovery.models import Incident, SuspectNode

    cluster = ClusterFactory(name="north")
    job = JobFactory(cluster=cluster, state=Job.State.FAILED)
    now = timezone.now()
    incident = Incident.objects.create(
        job=job,
        lineage_root=job,
        cluster=cluster,
        signal="node_failure",
        outcome="recovered",
        stopped_at=now,
        detected_at=now,
    )
    SuspectNode.objects.create(node=NodeFactory(cluster=cluster), incident=incident, evidence="x")
    found = samples(scrape(client))
    assert (
        value(
            found,
            "gantry_incidents_total",
            cluster="north",
            signal="node_failure",
            outcome="recovered",
        )
        == 1
    )
    assert value(found, "gantry_suspect_nodes", cluster="north") == 1
    assert value(found, "gantry_sdc_suspect_nodes", cluster="north") == 0
    # A node suspected of silent data corruption by a pair of drills counts in both.
    drill = RestoreDrill.objects.create(
        checkpoint=CheckpointFactory(job=job), cluster=cluster, allocation_key="x"
    )
    SuspectNode.objects.create(
        node=NodeFactory(cluster=cluster), kind="sdc", drill=drill, evidence="silent"
    )
    found = samples(scrape(client))
    assert value(found, "gantry_suspect_nodes", cluster="north") == 2
    assert value(found, "gantry_sdc_suspect_nodes", cluster="north") == 1
