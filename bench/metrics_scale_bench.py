"""Metrics at 100x the points: the metrics API and the job page chart's query before and
after metric retention's roll-up, and storage per point, for one long job at 1x, 10x and
100x (PostgreSQL only).

    .venv/bin/python bench/metrics_scale_bench.py [--base 10000] [--samples 40] [--keep]

Seeds ``gantry_bench_metrics_scale`` with one job per scale (``--base`` steps at 1x: 10k,
100k and 1M logged steps, each row all seven series; checkpoints every 1,000 steps, the
newest three still on the cluster), with the point sums ingest keeps. For each scale, before
and after ``jobs.metric_retention.metrics_rollup_job`` (defaults: the newest 20,000 steps
raw, 128-step buckets), times in-process GETs of the metrics API (session auth, no ETag, a
``max_points`` new to the cache on every request so nothing is answered from it):

- **chart** (the job page's chart: the whole job, its downsampled series built anew);
- **range** (``step_min=0&step_max=<last>``: the API's bucketed range query).

Storage: ``pg_total_relation_size`` of the points table (and the roll-up table) over the
logged steps they hold, after ``VACUUM FULL`` (a DELETE leaves the space to reuse, not
returned). Prints one table with before/after and their ratios side by side.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as lib

SCALES = (1, 10, 100)


def seed_job(owner: Any, cluster: Any, steps: int) -> Any:
    from django.utils import timezone

    from jobs.ingest import point_totals_refresh
    from jobs.models import Checkpoint, Job

    job = Job.objects.create(
        owner=owner,
        cluster=cluster,
        name=f"long-{steps}",
        partition="gpu",
        state=Job.State.RUNNING,
        metrics_offset=steps * 300,
        last_step=steps - 1,
    )
    lib.insert_metric_points([job.id], steps)
    saves = list(range(1000, steps, 1000))
    Checkpoint.objects.bulk_create(
        Checkpoint(
            job=job,
            step=step,
            path=f"/runs/{job.id}/checkpoints/step-{step:06d}",
            deleted_at=None if step in saves[-3:] else timezone.now(),
        )
        for step in saves
    )
    point_totals_refresh(job_ids=[job.id])
    job.refresh_from_db()
    return job


# Every request asks for a max_points no earlier request of its job asked for: the answer
# and the chart's series state are cached by it, and this measures building them.
_MAX_POINTS = [2000]


def timed(client: Any, url: str, samples: int) -> list[float]:
    times = []
    for _ in range(samples):
        _MAX_POINTS[0] -= 1
        started = time.perf_counter()
        response = client.get(f"{url}{'&' if '?' in url else '?'}max_points={_MAX_POINTS[0]}")
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.status_code
    return times


def storage(job_steps: int) -> dict[str, float]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM FULL jobs_metricpoint")
        cursor.execute("VACUUM FULL jobs_metricrollup")
        cursor.execute(
            "SELECT pg_total_relation_size('jobs_metricpoint'), "
            "pg_total_relation_size('jobs_metricrollup'), "
            "(SELECT count(*) FROM jobs_metricpoint), (SELECT count(*) FROM jobs_metricrollup)"
        )
        points_bytes, rollup_bytes, points, rollups = cursor.fetchone()
    return {
        "bytes_per_step": (points_bytes + rollup_bytes) / job_steps,
        "raw_rows": points,
        "rollup_rows": rollups,
        "total_mb": (points_bytes + rollup_bytes) / 2**20,
    }


def measure(client: Any, job: Any, samples: int) -> dict[str, Any]:
    last = job.last_step
    chart = timed(client, f"/api/v1/jobs/{job.id}/metrics/", samples)
    ranged = timed(client, f"/api/v1/jobs/{job.id}/metrics/?step_min=0&step_max={last}", samples)
    return {
        "chart": (lib.pct(chart, 0.5), lib.pct(chart, 0.99)),
        "range": (lib.pct(ranged, 0.5), lib.pct(ranged, 0.99)),
    }


def run_scale(client: Any, owner: Any, cluster: Any, steps: int, samples: int) -> dict[str, Any]:
    from django.db import connection

    from jobs.metric_retention import metrics_rollup_job
    from jobs.models import MetricPoint, MetricRollup

    _MAX_POINTS[0] = 2000
    MetricRollup.objects.all().delete()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE jobs_metricpoint")
    started = time.perf_counter()
    job = seed_job(owner, cluster, steps)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_metricpoint")
    seeded_s = time.perf_counter() - started
    before_storage = storage(steps)
    before = measure(client, job, samples)
    started = time.perf_counter()
    rolled = metrics_rollup_job(job_id=job.id)
    rollup_s = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs_metricpoint")
        cursor.execute("ANALYZE jobs_metricrollup")
    job.refresh_from_db()
    after_storage = storage(steps)
    after = measure(client, job, samples)
    assert (
        MetricPoint.objects.count() + sum(MetricRollup.objects.values_list("count", flat=True))
        == steps
    )
    print(
        f"  {steps:,} steps: seeded in {seeded_s:.1f} s; roll-up {rolled.points:,} points into "
        f"{rolled.buckets:,} buckets in {rollup_s:.1f} s",
        file=sys.stderr,
    )
    return {
        "steps": steps,
        "before": before,
        "after": after,
        "storage": (before_storage, after_storage),
        "rollup_s": rollup_s,
    }


def report(results: list[dict[str, Any]]) -> None:
    rows = []
    for result in results:
        for kind in ("chart", "range"):
            b50, b99 = result["before"][kind]
            a50, a99 = result["after"][kind]
            rows.append(
                [
                    f"{result['steps']:,}",
                    kind,
                    f"{b50:.1f} / {b99:.1f}",
                    f"{a50:.1f} / {a99:.1f}",
                    f"{b50 / a50:.1f}x / {b99 / a99:.1f}x",
                ]
            )
    print("\n## Metrics API latency, ms (p50 / p99), before and after the roll-up\n")
    print(lib.table(rows, ["logged steps", "query", "raw", "rolled up", "raw / rolled up"]))
    rows = []
    for result in results:
        before, after = result["storage"]
        rows.append(
            [
                f"{result['steps']:,}",
                f"{before['bytes_per_step']:.0f} ({before['total_mb']:.1f} MB)",
                f"{after['bytes_per_step']:.0f} ({after['total_mb']:.1f} MB)",
                f"{before['bytes_per_step'] / after['bytes_per_step']:.1f}x",
                f"{after['raw_rows']:,} + {after['rollup_rows']:,}",
                f"{result['rollup_s']:.1f}",
            ]
        )
    print("\n## Storage per logged step, bytes (tables and indexes, after VACUUM FULL)\n")
    print(
        lib.table(
            rows,
            ["logged steps", "raw", "rolled up", "ratio", "raw rows + roll-ups", "roll-up s"],
        )
    )
    flat = [r["after"]["chart"][1] for r in results]
    print(
        f"\nchart p99 after roll-up from {results[0]['steps']:,} to {results[-1]['steps']:,} "
        f"steps: {flat[0]:.1f} -> {flat[-1]:.1f} ms ({flat[-1] / flat[0]:.1f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", type=int, default=10_000, help="logged steps at 1x")
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    name, url = lib.bench_database("postgres", "metrics_scale")
    lib.django_setup(url)
    from django.conf import settings
    from django.db import connection
    from django.test import Client

    settings.ALLOWED_HOSTS = ["*"]
    seeded = lib.seed(jobs=0, metric_jobs=0, points_per_job=0, users=1, clusters=1, say=print)
    owner, cluster = seeded["owners"][0], seeded["clusters"][0]
    client = Client()
    client.force_login(owner)
    print(
        f"# retention: newest {settings.METRICS_FULL_RESOLUTION_STEPS:,} steps raw, "
        f"{settings.METRICS_ROLLUP_BUCKET}-step buckets; {args.samples} requests per cell"
    )
    results = [
        run_scale(client, owner, cluster, args.base * scale, args.samples) for scale in SCALES
    ]
    report(results)
    if not args.keep:
        connection.close()
        lib.bench_database_drop("postgres", name)


if __name__ == "__main__":
    main()
