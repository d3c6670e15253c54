"""The overview: the fleet at a glance (its live part polled every few seconds) and goodput
per cluster and week.

A fixed number of queries however many nodes, jobs and metric points there are: the
clusters (with each one's waiting jobs), the running jobs with their work at risk, the
recent failures and the recent drill failures. Two figures that sum much more are reused
from ``core.cache``, under keys that name what they were computed from:

- node and GPU counts per cluster, computed again after each inventory sync (the cluster's
  ``last_sync_at`` is in the key) and at least every ``OVERVIEW_NODE_COUNTS`` lifetime; the
  GPU capacity by health per partition (``health.selectors``) likewise;
- the goodput table, computed again at least every ``OVERVIEW_GOODPUT_WEEKS`` lifetime.

The page says so under each. The rest (the live part) is a snapshot of the fleet reused for
``settings.OVERVIEW_SNAPSHOT_SECONDS`` (5 s, the live part's poll interval) by everyone with
the same view of it: the operators share one, each researcher has their own (their jobs
only). So a fleet's worth of open tabs costs one computation per period, and the page says
how old its figures may be. The live part and the page answer ``304`` to a poll while the
snapshot shows the same (``core.conditional``): its digest is taken when it is computed.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.db.models import Count, IntegerField, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponseBase
from django.shortcuts import render
from django.template.loader import render_to_string

from controlplane.tasknames import OVERVIEW_GOODPUT_REFRESH, task_send
from core import cache
from core.access import request_user
from core.conditional import etag_for, not_modified, revalidate, static_release
from core.roles import is_operator, stand_in
from core.types import User
from drills.models import RestoreDrill
from drills.selectors import restore_drill_list_for_user
from health.selectors import gpu_capacity_by_partition
from jobs.goodput.fleet import goodput_by_cluster_week
from jobs.goodput.work_at_risk import running_jobs_summary, work_at_risk_by_cluster
from jobs.models import Job
from jobs.selectors import job_list_for_user
from nodes.models import Cluster
from nodes.selectors import ClusterHealth, cluster_health_list, cluster_list

# How many ISO weeks the overview's goodput table shows, this one included.
OVERVIEW_GOODPUT_WEEKS = 8
# The states in which a job waits to run (the "jobs waiting" figure).
WAITING_STATES = (
    Job.State.QUEUED,
    Job.State.SUBMITTING,
    Job.State.SUBMIT_UNKNOWN,
    Job.State.PENDING,
)
FAILED_STATES = (Job.State.FAILED, Job.State.NODE_FAIL, Job.State.LOST)


def _clusters_with_waiting_jobs(jobs: Any) -> list[Cluster]:
    """The clusters, each with ``waiting``: how many of ``jobs`` wait to run on it. One
    query (a subquery per cluster)."""
    waiting = (
        jobs.filter(cluster=OuterRef("pk"), state__in=WAITING_STATES)
        .order_by()
        .values("cluster")
        .annotate(count=Count("id"))
        .values("count")
    )
    return list(
        cluster_list().annotate(waiting=Coalesce(Subquery(waiting, output_field=IntegerField()), 0))
    )


def _cluster_health(clusters: list[Cluster]) -> list[ClusterHealth]:
    """``nodes.selectors.cluster_health_list`` for these cluster rows, its counts reused
    until a cluster syncs again, at most ``core.cache``'s ``OVERVIEW_NODE_COUNTS`` lifetime."""
    counts = cache.get_or_set(
        cache.OVERVIEW_NODE_COUNTS,
        cache.key_overview_node_counts(
            clusters=[(c.pk, c.created_at, c.last_sync_at) for c in clusters]
        ),
        lambda: {
            health.cluster.pk: (health.nodes_by_state, health.gpus_by_type)
            for health in cluster_health_list()
        },
    )
    health = []
    for cluster in clusters:
        nodes_by_state, gpus_by_type = counts.get(cluster.pk, ({}, {}))
        health.append(
            ClusterHealth(cluster=cluster, nodes_by_state=nodes_by_state, gpus_by_type=gpus_by_type)
        )
    return health


def _overview_context(request: HttpRequest) -> dict[str, Any]:
    jobs = job_list_for_user(user=request_user(request))
    clusters = _clusters_with_waiting_jobs(jobs)
    running = running_jobs_summary(jobs=jobs)
    drill_failures = list(
        restore_drill_list_for_user(user=request.user)
        .filter(verdict=RestoreDrill.Verdict.FAILED)
        .order_by("-finished_at")[:3]
    )
    return {
        "work_at_risk": sorted(
            work_at_risk_by_cluster(running.risks).values(), key=lambda total: total.cluster
        ),
        "breaches": sorted(
            (risk for risk in running.risks if risk.breached), key=lambda risk: -risk.proven.age_s
        ),
        "throughput_now": running.throughput_now,
        # What the overview shows of ``drills.selectors.drill_fleet_health``.
        "drill_health": {
            "running_jobs": running.count,
            "running_jobs_proven": running.newest_proven,
            "proven_share": running.newest_proven / running.count if running.count else None,
            "recent_failures": drill_failures,
        },
        "cluster_health": _cluster_health(clusters),
        # Device level apart from the node counts: GPUs per partition by probe verdict,
        # reused like the node counts (a probe's change shows within their lifetime).
        "gpu_capacity": cache.get_or_set(
            cache.OVERVIEW_NODE_COUNTS,
            cache.key_overview_node_counts(
                clusters=[(c.pk, c.created_at, c.last_sync_at) for c in clusters]
            )
            + ":gpu-health",
            gpu_capacity_by_partition,
        ),
        "node_counts_seconds": cache.lifetime(cache.OVERVIEW_NODE_COUNTS),
        "running_count": running.count,
        "pending_count": sum(cluster.waiting for cluster in clusters),  # type: ignore[attr-defined]
        "recent_failures": list(
            jobs.filter(state__in=FAILED_STATES).order_by("-ended_at", "-created_at")[:5]
        ),
    }


def _viewer_scope(user: User) -> str:
    """Who sees the same overview: every operator sees the whole fleet; anyone else only
    their own jobs (their row's id and creation time: a recreated account is a new one)."""
    if is_operator(user):
        return "operators"
    joined = getattr(user, "date_joined", None)
    return f"user:{user.pk}:{joined and joined.timestamp()}"


def _overview_snapshot(request: HttpRequest) -> dict[str, Any]:
    """``_overview_context`` as of at most ``OVERVIEW_SNAPSHOT_SECONDS`` ago, shared by the
    viewers of the same scope, with ``snapshot_seconds`` and ``snapshot_digest`` (a digest of
    the live part rendered from it, for ETags; role-dependent parts and CSRF tokens are
    added per request, and named in the ETag)."""

    def take() -> dict[str, Any]:
        snapshot = _overview_context(request)
        snapshot["snapshot_seconds"] = cache.lifetime(cache.OVERVIEW_SNAPSHOT)
        shown = render_to_string("_overview_live.html", {**snapshot, "gantry_role": "operator"})
        snapshot["snapshot_digest"] = etag_for(shown)
        return snapshot

    # Its lifetime is settings.OVERVIEW_SNAPSHOT_SECONDS; 0 takes one on every request.
    return cache.get_or_set(
        cache.OVERVIEW_SNAPSHOT,
        cache.key_overview_snapshot(scope=_viewer_scope(request_user(request))),
        take,
    )


def _overview_etag(request: HttpRequest, *parts: object) -> str:
    """The ETag of what a viewer sees of the overview: the snapshot's digest, their role
    (an operator's copy has "sync now" forms), the session's CSRF secret (the forms' tokens)
    and ``parts``."""
    role = "operator" if is_operator(request.user) else "viewer"
    return etag_for(*parts, role, request.META.get("CSRF_COOKIE"))


# The goodput table is answered as kept, and computed again by a worker once it is older
# than this (``core.cache.get_or_refresh``): at 100k jobs it takes seconds, which no page
# view should wait for once a table exists.
OVERVIEW_GOODPUT_FRESH_SECONDS = 60


def _goodput_weeks_key(user: User) -> str:
    """The table's key: for those who see every job, no one (every operator reads the same
    table); for anyone else, the person (their row's id and creation time)."""
    sees_all = is_operator(user)
    return cache.key_overview_goodput_weeks(
        user_id=None if sees_all else user.pk,
        user_joined=None if sees_all else getattr(user, "date_joined", None),
        sees_all=sees_all,
        weeks=OVERVIEW_GOODPUT_WEEKS,
    )


def _goodput_weeks_table(user: User) -> dict[str, Any]:
    return goodput_by_cluster_week(jobs=job_list_for_user(user=user), weeks=OVERVIEW_GOODPUT_WEEKS)


def _goodput_weeks(request: HttpRequest) -> tuple[dict[str, Any], datetime]:
    """``goodput_by_cluster_week`` of the jobs this person may see (it sums the ledgers of
    eight weeks of jobs), and when it was computed: answered as kept in ``core.cache``; once
    older than ``OVERVIEW_GOODPUT_FRESH_SECONDS`` a worker computes it again
    (``overview_goodput_refresh``). Computed while the page waits only when none is kept."""
    user = request_user(request)
    refresh_for = None if is_operator(user) else user.pk
    table, at = cache.get_or_refresh(
        cache.OVERVIEW_GOODPUT_WEEKS,
        _goodput_weeks_key(user),
        lambda: _goodput_weeks_table(user),
        fresh_seconds=OVERVIEW_GOODPUT_FRESH_SECONDS,
        refresh=lambda: task_send(OVERVIEW_GOODPUT_REFRESH, refresh_for),
    )
    return table, datetime.fromtimestamp(at, UTC)


def overview_goodput_refresh(*, user_id: int | None) -> bool:
    """A worker's side of ``_goodput_weeks``: the table of user ``user_id`` (None: of those
    who see every job, as an operator sees it) computed now and kept. False when there is no
    such user any more."""
    if user_id is None:
        user = stand_in(operator=True)
    else:
        found = get_user_model()._default_manager.filter(pk=user_id).first()
        if found is None:
            return False
        user = found
    cache.put_refreshed(
        cache.OVERVIEW_GOODPUT_WEEKS, _goodput_weeks_key(user), _goodput_weeks_table(user)
    )
    return True


@login_required
def overview(request: HttpRequest) -> HttpResponseBase:
    context = dict(_overview_snapshot(request))
    context["goodput_weeks"], context["goodput_weeks_at"] = _goodput_weeks(request)
    context["goodput_weeks_seconds"] = OVERVIEW_GOODPUT_FRESH_SECONDS
    etag = _overview_etag(
        request,
        "page",
        context["snapshot_digest"],
        repr(context["goodput_weeks"]),
        context["goodput_weeks_at"],
        static_release(),
    )
    unchanged = not_modified(request, etag)
    if unchanged is not None:
        return unchanged
    return revalidate(render(request, "overview.html", context), etag)


@login_required
def overview_live_partial(request: HttpRequest) -> HttpResponseBase:
    """The live part of the overview, polled while the tab is visible: ``304`` while the
    snapshot shows what the poller already has."""
    context = _overview_snapshot(request)
    etag = _overview_etag(request, "live", context["snapshot_digest"])
    unchanged = not_modified(request, etag)
    if unchanged is not None:
        return unchanged
    return revalidate(render(request, "_overview_live.html", context), etag)
