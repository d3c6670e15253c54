"""Goodput of many jobs at once: per cluster and ISO week (the overview) and per cluster over
a recent window (``/metrics``). The same ledger as a job's page (``jobs.goodput.ledger``), computed
for every job in the window with a fixed number of queries, however many jobs there are:
one for the jobs (with their ledger inputs as subqueries), at most one for the ends of the
jobs they were resumed from when those ended before the window, one for the metric sums.

A job's ledger counts in the week (and window) in which it ended, or now while it runs:
a week's ratio is Σ productive / Σ wall of the jobs that ended in it. Lost progress is
known only once a job is resumed, so a past week's ratio can drop when an old job is
resumed later (its redone steps become lost progress then).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from jobs.goodput import ledger as goodput
from jobs.goodput.selectors import (
    LEDGER_INPUTS,
    job_times,
    lineage_link,
    step_totals,
    with_ledger_inputs,
)
from jobs.models import Job, MetricPoint


@dataclass(frozen=True)
class JobLedger:
    cluster_id: int
    cluster: str
    # When the job ended, or now while it runs: where its ledger counts.
    counted_at: datetime
    ledger: goodput.Ledger


def window_ledgers(*, jobs: QuerySet[Job], since: datetime, now: datetime) -> list[JobLedger]:
    """The ledger of each of ``jobs`` that ended at or after ``since`` or has not ended."""
    window = jobs.filter(Q(ended_at__gte=since) | Q(ended_at__isnull=True))
    rows = list(
        with_ledger_inputs(window).values(*LEDGER_INPUTS, "cluster_id", "cluster__name").order_by()
    )
    links = [lineage_link(row) for row in rows]
    # Where each job's span ended (``JobTimes.end``), for the idle gap of its resumes.
    ended: dict[str, datetime | None] = {
        str(row["id"]): _span_end(row["ended_at"], row["last_wall"]) for row in rows
    }
    outside = {link.source_id for link in links if link.source_id and link.source_id not in ended}
    if outside:
        ended.update(
            (str(job_id), ended_at)
            for job_id, ended_at in Job.objects.filter(id__in=outside).values_list("id", "ended_at")
        )
    ranges: dict[str, goodput.StepRanges] = {}
    for lineage in goodput.lineages(links):
        ranges.update(goodput.lineage_step_ranges(lineage))
    totals = step_totals(rows, ranges, points=_points_to_sum(rows, window))
    result = []
    for row, link in zip(rows, links, strict=True):
        times = job_times(row, link, totals.get(link.job_id, {}))
        source_end = ended.get(link.source_id) if link.source_id else None
        idle = goodput.idle_before(times, source_ended_at=source_end, now=now)
        result.append(
            JobLedger(
                cluster_id=row["cluster_id"],
                cluster=row["cluster__name"],
                counted_at=row["ended_at"] or now,
                ledger=goodput.job_ledger(times, now=now, idle_before_s=idle),
            )
        )
    return result


def _points_to_sum(rows: list[dict[str, Any]], window: QuerySet[Job]) -> QuerySet[MetricPoint]:
    """The points ``step_totals`` may have to sum: of the window's jobs whose sums ingest
    does not keep or that are part of a lineage (it skips the others either way). Named
    in the query up to a point (SQLite takes at most 999 parameters); beyond, the same
    jobs as a subquery."""
    unkept = [row["id"] for row in rows if row["points_totals_offset"] != row["metrics_offset"]]
    redone = [row["id"] for row in rows if row["resume_source"] or row["parent_id"]]
    sources = [row["resume_source"] or row["parent_id"] for row in rows]
    named = {*unkept, *redone, *(source for source in sources if source)}
    limit = 20_000 if connection.vendor == "postgresql" else 900
    if len(named) <= limit:
        return MetricPoint.objects.filter(job_id__in=list(named))
    kept_alone = Q(points_totals_offset=F("metrics_offset")) & Q(
        parent__isnull=True, resume_from__isnull=True, children__isnull=True
    )
    return MetricPoint.objects.filter(job__in=window.exclude(kept_alone).values("id"))


def _span_end(ended_at: datetime | None, last_wall: datetime | None) -> datetime | None:
    if ended_at is None or last_wall is None:
        return ended_at
    return max(ended_at, last_wall)


def week_start(moment: datetime) -> datetime:
    """Monday 00:00 of ``moment``'s ISO week, in the current time zone."""
    local = timezone.localtime(moment)
    monday = local - timedelta(days=local.weekday())
    return monday.replace(hour=0, minute=0, second=0, microsecond=0)


def goodput_by_cluster_week(
    *, jobs: QuerySet[Job], weeks: int = 8, now: datetime | None = None
) -> dict[str, Any]:
    """Effective training time ratio per cluster and ISO week, the last ``weeks`` weeks
    (this one included), over ``jobs`` (the caller passes what the person may see).

    ``{"weeks": ["2026-W08", ...], "rows": [{"cluster": name, "cells": [{"week", "ratio",
    "wall_s", "productive_s", "lost_s", "jobs"}, ...]}]}``; a week without time has ratio None.
    """
    now = now or timezone.now()
    first = week_start(now) - timedelta(weeks=weeks - 1)
    labels = [goodput.iso_week(first + timedelta(weeks=offset)) for offset in range(weeks)]
    grouped: dict[tuple[str, str], list[goodput.Ledger]] = {}
    for entry in window_ledgers(jobs=jobs, since=first, now=now):
        week = goodput.iso_week(timezone.localtime(entry.counted_at))
        grouped.setdefault((entry.cluster, week), []).append(entry.ledger)
    rows = []
    for cluster in sorted({cluster for cluster, _ in grouped}):
        cells = []
        for week in labels:
            ledgers = grouped.get((cluster, week), [])
            total = goodput.sum_ledgers(ledgers)
            cells.append(
                {
                    "week": week,
                    "ratio": total.ratio,
                    "wall_s": total.wall_s,
                    "productive_s": total.buckets["productive"],
                    "lost_s": total.buckets["lost_progress"],
                    "jobs": len(ledgers),
                }
            )
        rows.append({"cluster": cluster, "cells": cells})
    return {"weeks": labels, "rows": rows}


def goodput_by_cluster(
    *, jobs: QuerySet[Job], since: datetime, now: datetime | None = None
) -> dict[int, goodput.Ledger]:
    """Each cluster's summed ledger of ``jobs`` that ended since ``since`` or run now."""
    now = now or timezone.now()
    grouped: dict[int, list[goodput.Ledger]] = {}
    for entry in window_ledgers(jobs=jobs, since=since, now=now):
        grouped.setdefault(entry.cluster_id, []).append(entry.ledger)
    return {cluster_id: goodput.sum_ledgers(ledgers) for cluster_id, ledgers in grouped.items()}
