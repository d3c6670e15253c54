"""Prometheus metrics at ``/metrics``, computed from the database when scraped.

Access: the scraper sends ``Authorization: Bearer <GANTRY_METRICS_TOKEN>`` or comes from
an address in ``GANTRY_METRICS_ALLOW``; everyone else is refused (401, 403 for a wrong
token), and with neither setting the endpoint is off. The numbers are fleet-wide and
name clusters, so they are not for every signed-in user.

What is exported, every series labelled by cluster name:

- ``gantry_jobs{cluster,state}``: jobs in each state (every state, zeros included).
- ``gantry_drills{cluster,state,verdict}``: restore drills by state and verdict
  (``verdict="none"`` until a drill finishes).
- ``gantry_running_jobs``, ``gantry_running_jobs_proven`` and
  ``gantry_running_jobs_proven_ratio``: running jobs, and those whose newest
  checkpoint a restore drill proved (the drills page's "proven share").
- ``gantry_work_at_risk_gpu_hours{cluster,since}``: GPU-hours the running jobs would lose
  if they died now, summed per cluster, ``since="proven"`` (the newest checkpoint a drill
  proved) and ``since="written"`` (the newest written one); see ``jobs.goodput.work_at_risk``.
- ``gantry_running_jobs_oldest_proven_age_seconds{cluster}``: the oldest "newest proven
  checkpoint" among running jobs (since the start for a job without one); absent with none
  running. ``gantry_proven_age_breaches{cluster}``: running jobs over the cluster's limit.
- ``gantry_goodput_ratio{cluster}`` and ``gantry_goodput_seconds{cluster,bucket}``: the
  goodput ledger (``jobs.goodput.ledger``) of the jobs that ended in the last 7 days or run now:
  productive / wall, and the seconds of every bucket. Absent for a cluster without such jobs.
  Computed again at most once a minute (``core.cache``'s ``METRICS_GOODPUT``): it sums a
  week of jobs.
- ``gantry_submit_backlog{cluster,kind}``: jobs and drills queued for, or in, submission
  (the Celery submit work; Gantry keeps it in the database, so no broker is asked).
- ``gantry_cluster_*``: inventory sync and accounting (sacct) health from the cluster row.
- ``gantry_watcher_cycle_duration_seconds`` (summary: ``_count`` and ``_sum``),
  ``gantry_watcher_last_cycle_duration_seconds``, ``gantry_watcher_cycle_failures_total``,
  ``gantry_ssh_command_duration_seconds`` (summary) and ``gantry_ssh_command_errors_total``:
  timings the Celery workers record per watcher cycle in the shared ``worker_stats`` cache
  (see ``core.worker_stats``; the SSH numbers are those of the watcher's commands, which
  are most of Gantry's SSH traffic).
- ``gantry_node_health{cluster,node,state}``: 1 for the state of each node's GPU health
  (``ok``, ``warning``, ``critical``, ``unknown``), 0 for the others;
  ``gantry_gpu_health_total{cluster,state}``: the inventory's GPUs by health (never probed:
  unknown; every GPU of a critical node: critical). See ``health``.
- ``gantry_cache_hits_total{cache}`` and ``gantry_cache_misses_total{cache}``: reads of
  ``core.cache`` per cached thing (``cache`` is its name: ``job_figures``, ...) in every web
  and worker process, as the processes record them (each adds its counts every few
  seconds). A miss is computed; with Redis down every read is a miss. Absent when the
  counts cannot be read.

One custom collector on a private registry (not prometheus_client's global one, so
nothing else in the process leaks in) runs a fixed number of queries per scrape, however
many jobs and drills there are: about a dozen to the database (the goodput window reads
the ends of jobs resumed from outside it only when there are such) and three cache reads
(the goodput window, the worker timings, the cache counts).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Q
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

from core import cache, worker_stats
from core.ratelimit import client_address
from drills.models import RestoreDrill
from health.selectors import FleetHealth, fleet_health
from jobs import checkpoint_state
from jobs.goodput import ledger as goodput
from jobs.goodput.fleet import goodput_by_cluster
from jobs.goodput.work_at_risk import ClusterRisk, work_at_risk, work_at_risk_by_cluster
from jobs.models import Job
from nodes.models import Cluster
from recovery.selectors import incident_counts, suspect_counts

logger = logging.getLogger(__name__)

SUBMIT_BACKLOG_JOB_STATES = (Job.State.QUEUED, Job.State.SUBMITTING)
SUBMIT_BACKLOG_DRILL_STATES = (RestoreDrill.State.QUEUED, RestoreDrill.State.SUBMITTING)
NO_VERDICT = "none"
# The goodput ratio covers the jobs that ended this recently, and those running.
GOODPUT_WINDOW = timedelta(days=7)


@dataclass
class ClusterRow:
    name: str
    sync_status: str
    sync_failures: int
    last_sync_ok_at: datetime | None
    last_reconcile_at: datetime | None
    reconcile_failing: bool
    accounting_available: bool | None
    accounting_failures: int


@dataclass
class FleetSnapshot:
    clusters: dict[int, ClusterRow] = field(default_factory=dict)
    # (cluster id, state) -> count
    jobs: dict[tuple[int, str], int] = field(default_factory=dict)
    # (cluster id, state, verdict) -> count
    drills: dict[tuple[int, str, str], int] = field(default_factory=dict)
    # cluster id -> (running, proven)
    running_jobs: dict[int, tuple[int, int]] = field(default_factory=dict)
    worker: dict[int, dict[str, int]] = field(default_factory=dict)
    risk: dict[int, ClusterRisk] = field(default_factory=dict)
    # cluster id -> the oldest proven-checkpoint age among its running jobs
    oldest_proven_age: dict[int, float] = field(default_factory=dict)
    goodput: dict[int, goodput.Ledger] = field(default_factory=dict)
    # None when the counts could not be read
    cache_counts: dict[str, cache.CacheCounts] | None = None
    # (cluster id, signal, outcome) -> incidents; cluster id -> suspect nodes (all, and
    # those suspected of silent data corruption)
    incidents: dict[tuple[int, str, str], int] = field(default_factory=dict)
    suspects: dict[int, tuple[int, int]] = field(default_factory=dict)
    health: FleetHealth = field(default_factory=FleetHealth)


def fleet_snapshot() -> FleetSnapshot:
    """Everything /metrics exports, in a fixed number of queries and cache reads."""
    snapshot = FleetSnapshot()
    clusters = list(
        Cluster.objects.order_by("id").values(
            "id",
            "created_at",
            "name",
            "sync_status",
            "sync_failures",
            "last_sync_ok_at",
            "last_reconcile_at",
            "last_reconcile_error",
            "accounting_available",
            "accounting_failures",
        )
    )
    for row in clusters:
        snapshot.clusters[row["id"]] = ClusterRow(
            name=row["name"],
            sync_status=row["sync_status"],
            sync_failures=row["sync_failures"],
            last_sync_ok_at=row["last_sync_ok_at"],
            last_reconcile_at=row["last_reconcile_at"],
            reconcile_failing=bool(row["last_reconcile_error"]),
            accounting_available=row["accounting_available"],
            accounting_failures=row["accounting_failures"],
        )
    job_counts = Job.objects.order_by().values("cluster_id", "state").annotate(count=Count("id"))
    for job_row in job_counts:
        snapshot.jobs[(job_row["cluster_id"], job_row["state"])] = job_row["count"]
    # A drill's own cluster is set when it is submitted; before that it runs where its job ran.
    drills = (
        RestoreDrill.objects.order_by()
        .annotate(cluster_key=Coalesce("cluster_id", "checkpoint__job__cluster_id"))
        .values("cluster_key", "state", "verdict")
        .annotate(count=Count("id"))
    )
    for drill_row in drills:
        verdict = drill_row["verdict"] or NO_VERDICT
        key = (drill_row["cluster_key"], drill_row["state"], verdict)
        snapshot.drills[key] = drill_row["count"]
    # The same "proven" as the drills page: the running job's newest checkpoint passed a drill.
    newest_proven = checkpoint_state.newest_checkpoint_proof()
    running = (
        Job.objects.order_by()
        .filter(state=Job.State.RUNNING)
        .annotate(newest_proven=newest_proven)
        .values("cluster_id")
        .annotate(running=Count("id"), proven=Count("id", filter=Q(newest_proven__isnull=False)))
    )
    for running_row in running:
        counts = (running_row["running"], running_row["proven"])
        snapshot.running_jobs[running_row["cluster_id"]] = counts
    risks = work_at_risk(jobs=Job.objects.all())
    snapshot.risk = work_at_risk_by_cluster(risks)
    for risk in risks:
        oldest = snapshot.oldest_proven_age.get(risk.cluster_id, 0.0)
        snapshot.oldest_proven_age[risk.cluster_id] = max(oldest, risk.proven.age_s)
    snapshot.goodput = _goodput_window(clusters)
    snapshot.worker = worker_stats.worker_stats_for_clusters(list(snapshot.clusters))
    snapshot.cache_counts = cache.cache_counts()
    snapshot.incidents = incident_counts()
    snapshot.suspects = suspect_counts()
    snapshot.health = fleet_health()
    return snapshot


def _goodput_window(clusters: Sequence[Mapping[str, Any]]) -> dict[int, goodput.Ledger]:
    """``goodput_by_cluster`` over ``GOODPUT_WINDOW``, reused for ``core.cache``'s lifetime
    of ``METRICS_GOODPUT``: it sums the ledgers of a week of jobs, and a scrape every few
    seconds need not. The key names the clusters (their ids and creation times)."""

    def ledgers() -> dict[int, goodput.Ledger]:
        now = timezone.now()
        return goodput_by_cluster(jobs=Job.objects.all(), since=now - GOODPUT_WINDOW, now=now)

    return cache.get_or_set(
        cache.METRICS_GOODPUT,
        cache.key_metrics_goodput(clusters=[(row["id"], row["created_at"]) for row in clusters]),
        ledgers,
    )


class GantryCollector:
    """A prometheus_client collector: every scrape reads a fresh ``fleet_snapshot``."""

    def describe(self) -> list[Metric]:
        # Nothing up front: registering must not query the database.
        return []

    def collect(self) -> Iterator[Metric]:
        snapshot = fleet_snapshot()
        yield from _job_metrics(snapshot)
        yield from _drill_metrics(snapshot)
        yield from _risk_metrics(snapshot)
        yield from _goodput_metrics(snapshot)
        yield from _cluster_metrics(snapshot)
        yield from _worker_metrics(snapshot)
        yield from _cache_metrics(snapshot)
        yield from _recovery_metrics(snapshot)
        yield from _health_metrics(snapshot)


def _job_metrics(snapshot: FleetSnapshot) -> Iterator[Metric]:
    names = {cluster_id: row.name for cluster_id, row in snapshot.clusters.items()}
    jobs = GaugeMetricFamily(
        "gantry_jobs", "Jobs by state and cluster.", labels=["cluster", "state"]
    )
    backlog = GaugeMetricFamily(
        "gantry_submit_backlog",
        "Jobs and restore drills queued for submission or being submitted (sbatch).",
        labels=["cluster", "kind"],
    )
    running = GaugeMetricFamily("gantry_running_jobs", "Running jobs.", labels=["cluster"])
    proven = GaugeMetricFamily(
        "gantry_running_jobs_proven",
        "Running jobs whose newest checkpoint a restore drill proved restorable.",
        labels=["cluster"],
    )
    ratio = GaugeMetricFamily(
        "gantry_running_jobs_proven_ratio",
        "Share of running jobs whose newest checkpoint is proven (absent with none running).",
        labels=["cluster"],
    )
    for cluster_id, name in names.items():
        for state in Job.State.values:
            jobs.add_metric([name, state], snapshot.jobs.get((cluster_id, state), 0))
        backlog.add_metric(
            [name, "job"],
            sum(snapshot.jobs.get((cluster_id, state), 0) for state in SUBMIT_BACKLOG_JOB_STATES),
        )
        backlog.add_metric(
            [name, "drill"],
            sum(
                count
                for (drill_cluster, state, _), count in snapshot.drills.items()
                if drill_cluster == cluster_id and state in SUBMIT_BACKLOG_DRILL_STATES
            ),
        )
        running_count, proven_count = snapshot.running_jobs.get(cluster_id, (0, 0))
        running.add_metric([name], running_count)
        proven.add_metric([name], proven_count)
        if running_count:
            ratio.add_metric([name], proven_count / running_count)
    yield from (jobs, backlog, running, proven, ratio)


def _drill_metrics(snapshot: FleetSnapshot) -> Iterator[Metric]:
    drills = GaugeMetricFamily(
        "gantry_drills",
        'Restore drills by cluster, state and verdict (verdict "none" until finished).',
        labels=["cluster", "state", "verdict"],
    )
    for (cluster_id, state, verdict), count in sorted(snapshot.drills.items()):
        cluster = snapshot.clusters.get(cluster_id)
        if cluster is not None:
            drills.add_metric([cluster.name, state, verdict], count)
    yield drills


def _risk_metrics(snapshot: FleetSnapshot) -> Iterator[Metric]:
    at_risk = GaugeMetricFamily(
        "gantry_work_at_risk_gpu_hours",
        "GPU-hours running jobs would lose if they died now, since their newest proven "
        '(since="proven") or newest written (since="written") checkpoint.',
        labels=["cluster", "since"],
    )
    oldest = GaugeMetricFamily(
        "gantry_running_jobs_oldest_proven_age_seconds",
        "Age of the oldest newest-proven-checkpoint among running jobs (since the start "
        "for a job without one); absent with none running.",
        labels=["cluster"],
    )
    breaches = GaugeMetricFamily(
        "gantry_proven_age_breaches",
        "Running jobs whose newest proven checkpoint is older than the cluster allows.",
        labels=["cluster"],
    )
    for cluster_id, row in snapshot.clusters.items():
        risk = snapshot.risk.get(cluster_id, ClusterRisk(cluster=row.name))
        at_risk.add_metric([row.name, "proven"], risk.since_proven_gpu_hours)
        at_risk.add_metric([row.name, "written"], risk.since_written_gpu_hours)
        breaches.add_metric([row.name], risk.breaches)
        if cluster_id in snapshot.oldest_proven_age:
            oldest.add_metric([row.name], snapshot.oldest_proven_age[cluster_id])
    yield from (at_risk, oldest, breaches)


def _goodput_metrics(snapshot: FleetSnapshot) -> Iterator[Metric]:
    ratio = GaugeMetricFamily(
        "gantry_goodput_ratio",
        "Effective training time ratio (productive / wall) of the jobs that ended in the "
        "last 7 days or run now; absent without such jobs. Computed at most once a minute.",
        labels=["cluster"],
    )
    seconds = GaugeMetricFamily(
        "gantry_goodput_seconds",
        "Where the wall time of those jobs went, per goodput bucket.",
        labels=["cluster", "bucket"],
    )
    for cluster_id, ledger in sorted(snapshot.goodput.items()):
        cluster = snapshot.clusters.get(cluster_id)
        if cluster is None:
            continue
        if ledger.ratio is not None:
            ratio.add_metric([cluster.name], ledger.ratio)
        for bucket in goodput.BUCKETS:
            seconds.add_metric([cluster.name, bucket], ledger.buckets[bucket])
    yield from (ratio, seconds)


def _cluster_metrics(snapshot: FleetSnapshot) -> Iterator[Metric]:
    sync_status = GaugeMetricFamily(
        "gantry_cluster_sync_status",
        "1 for the cluster's current inventory sync status (never, ok, error), else 0.",
        labels=["cluster", "status"],
    )
    sync_failures = GaugeMetricFamily(
        "gantry_cluster_sync_failures",
        "Consecutive failed inventory syncs.",
        labels=["cluster"],
    )
    last_sync_ok = GaugeMetricFamily(
        "gantry_cluster_last_sync_success_timestamp_seconds",
        "When the last inventory sync succeeded (absent if never).",
        labels=["cluster"],
    )
    last_reconcile = GaugeMetricFamily(
        "gantry_cluster_last_reconcile_timestamp_seconds",
        "When the watcher last looked at the cluster (absent if never).",
        labels=["cluster"],
    )
    reconcile_failing = GaugeMetricFamily(
        "gantry_cluster_reconcile_error",
        "1 when the watcher's last cycle on the cluster reported an error.",
        labels=["cluster"],
    )
    accounting_available = GaugeMetricFamily(
        "gantry_cluster_accounting_available",
        "1 when the cluster has Slurm accounting (sacct), 0 when not (absent if unknown).",
        labels=["cluster"],
    )
    accounting_failures = GaugeMetricFamily(
        "gantry_cluster_accounting_failures",
        "Consecutive failed sacct calls (the watcher backs off and uses squeue meanwhile).",
        labels=["cluster"],
    )
    for row in snapshot.clusters.values():
        for status in Cluster.SyncStatus.values:
            sync_status.add_metric([row.name, status], float(row.sync_status == status))
        sync_failures.add_metric([row.name], row.sync_failures)
        if row.last_sync_ok_at is not None:
            last_sync_ok.add_metric([row.name], row.last_sync_ok_at.timestamp())
        if row.last_reconcile_at is not None:
            last_reconcile.add_metric([row.name], row.last_reconcile_at.timestamp())
        reconcile_failing.add_metric([row.name], float(row.reconcile_failing))
        if row.accounting_available is not None:
            accounting_available.add_metric([row.name], float(row.accounting_available))
        accounting_failures.add_metric([row.name], row.accounting_failures)
    yield from (
        sync_status,
        sync_failures,
        last_sync_ok,
        last_reconcile,
        reconcile_failing,
        accounting_available,
        accounting_failures,
    )


def _worker_metrics(snapshot: FleetSnapshot) -> Iterator[Metric]:
    cycle = SummaryMetricFamily(
        "gantry_watcher_cycle_duration_seconds",
        "Watcher cycles and their total duration.",
        labels=["cluster"],
    )
    last_cycle = GaugeMetricFamily(
        "gantry_watcher_last_cycle_duration_seconds",
        "Duration of the cluster's last watcher cycle.",
        labels=["cluster"],
    )
    cycle_failures = CounterMetricFamily(
        "gantry_watcher_cycle_failures",
        "Watcher cycles that ended with an error.",
        labels=["cluster"],
    )
    ssh = SummaryMetricFamily(
        "gantry_ssh_command_duration_seconds",
        "SSH commands the watcher ran and their total wall time.",
        labels=["cluster"],
    )
    ssh_errors = CounterMetricFamily(
        "gantry_ssh_command_errors",
        "Watcher SSH commands that failed at the SSH level (link, timeout), not by exit code.",
        labels=["cluster"],
    )
    for cluster_id, stats in sorted(snapshot.worker.items()):
        cluster = snapshot.clusters.get(cluster_id)
        if cluster is None:
            continue
        labels = [cluster.name]
        cycle.add_metric(
            labels,
            count_value=stats.get(worker_stats.WATCHER_CYCLES, 0),
            sum_value=_seconds(stats.get(worker_stats.WATCHER_CYCLE_MICROSECONDS, 0)),
        )
        if worker_stats.WATCHER_LAST_CYCLE_MICROSECONDS in stats:
            last_cycle.add_metric(
                labels, _seconds(stats[worker_stats.WATCHER_LAST_CYCLE_MICROSECONDS])
            )
        cycle_failures.add_metric(labels, stats.get(worker_stats.WATCHER_CYCLE_FAILURES, 0))
        ssh.add_metric(
            labels,
            count_value=stats.get(worker_stats.SSH_COMMANDS, 0),
            sum_value=_seconds(stats.get(worker_stats.SSH_COMMAND_MICROSECONDS, 0)),
        )
        ssh_errors.add_metric(labels, stats.get(worker_stats.SSH_COMMAND_ERRORS, 0))
    yield from (cycle, last_cycle, cycle_failures, ssh, ssh_errors)


def _cache_metrics(snapshot: FleetSnapshot) -> Iterator[Metric]:
    if snapshot.cache_counts is None:
        return
    hits = CounterMetricFamily(
        "gantry_cache_hits",
        "Reads of a cached thing (core.cache) that found it, in every process.",
        labels=["cache"],
    )
    misses = CounterMetricFamily(
        "gantry_cache_misses",
        "Reads of a cached thing (core.cache) that computed it (every read with Redis down).",
        labels=["cache"],
    )
    for name, counts in sorted(snapshot.cache_counts.items()):
        hits.add_metric([name], counts.hits)
        misses.add_metric([name], counts.misses)
    yield from (hits, misses)


def _recovery_metrics(snapshot: FleetSnapshot) -> Iterator[Metric]:
    names = {cluster_id: row.name for cluster_id, row in snapshot.clusters.items()}
    incidents = CounterMetricFamily(
        "gantry_incidents",
        "Recovery incidents by cluster, signal (crash, hang, ...) and outcome.",
        labels=["cluster", "signal", "outcome"],
    )
    for (cluster_id, signal, outcome), count in sorted(snapshot.incidents.items()):
        if cluster_id in names:
            incidents.add_metric([names[cluster_id], signal, outcome], count)
    yield incidents
    suspects = GaugeMetricFamily(
        "gantry_suspect_nodes",
        "Nodes the evidence of incidents (or of silent data corruption) points at, not "
        "cleared by an operator.",
        labels=["cluster"],
    )
    corrupting = GaugeMetricFamily(
        "gantry_sdc_suspect_nodes",
        "Nodes suspected of silent data corruption (a restore drill failed its bit-exact "
        "comparison there and passed it elsewhere), not cleared by an operator.",
        labels=["cluster"],
    )
    for cluster_id, name in sorted(names.items()):
        every, sdc = snapshot.suspects.get(cluster_id, (0, 0))
        suspects.add_metric([name], every)
        corrupting.add_metric([name], sdc)
    yield suspects
    yield corrupting


HEALTH_STATES = ("ok", "warning", "critical", "unknown")


def _health_metrics(snapshot: FleetSnapshot) -> Iterator[Metric]:
    names = {cluster_id: row.name for cluster_id, row in snapshot.clusters.items()}
    nodes = GaugeMetricFamily(
        "gantry_node_health",
        "Each node's GPU health from its probes: 1 for its state, 0 for the others.",
        labels=["cluster", "node", "state"],
    )
    for cluster_id, node, current in snapshot.health.nodes:
        for state in HEALTH_STATES:
            if cluster_id in names:
                nodes.add_metric([names[cluster_id], node, state], float(state == current))
    yield nodes
    gpus = GaugeMetricFamily(
        "gantry_gpu_health_total",
        "The inventory's GPUs by health (never probed: unknown; on a critical node: critical).",
        labels=["cluster", "state"],
    )
    for cluster_id, name in sorted(names.items()):
        for state in HEALTH_STATES:
            gpus.add_metric([name, state], snapshot.health.gpus.get((cluster_id, state), 0))
    yield gpus


def _seconds(microseconds: int) -> float:
    return microseconds / 1_000_000


REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(GantryCollector())


# ------------------------------------------------------------------ access and the view


def _text(status: int, message: str) -> HttpResponse:
    return HttpResponse(message + "\n", status=status, content_type="text/plain; charset=utf-8")


def _address_allowed(address: str | None) -> bool:
    if not address or not settings.METRICS_ALLOW:
        return False
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in network for network in settings.METRICS_ALLOW)


def metrics_access_refusal(request: HttpRequest) -> HttpResponse | None:
    """``None`` when the caller may scrape; otherwise the response that refuses it."""
    token: str | None = settings.METRICS_TOKEN
    if not token and not settings.METRICS_ALLOW:
        return _text(403, "Metrics are off: set GANTRY_METRICS_TOKEN or GANTRY_METRICS_ALLOW.")
    scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
    credential = credential.strip()
    if scheme.lower() == "bearer" and credential:
        # A token that was sent is checked even from an allowed address: a stale one is a
        # misconfiguration worth seeing.
        if token and hmac.compare_digest(credential.encode(), token.encode()):
            return None
        logger.warning("/metrics: wrong bearer token from %s", client_address(request))
        return _text(403, "Wrong metrics token.")
    # Behind the trusted proxy the peer is the proxy: the client's own address decides.
    if _address_allowed(client_address(request)):
        return None
    response = _text(401, "Send Authorization: Bearer <GANTRY_METRICS_TOKEN>.")
    response["WWW-Authenticate"] = 'Bearer realm="gantry-metrics"'
    return response


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    refusal = metrics_access_refusal(request)
    if refusal is not None:
        return refusal
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    response = HttpResponse(encoder(REGISTRY), content_type=content_type)
    response["Cache-Control"] = "no-store"
    return response
