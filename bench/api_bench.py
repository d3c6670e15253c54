"""Job list and metrics API (and pages) at 100k jobs and 1M metric points, in-process.

    .venv/bin/python bench/api_bench.py [--quick] [--db sqlite|postgres|both] [--keep]

Seeds a bench database (SQLite file var/bench/api.sqlite3 and/or PostgreSQL gantry_bench_api)
with N jobs over 4 researchers and 2 clusters and P metric points over P/100k jobs of
100k points each, then times requests with Django's test Client (session of a researcher
who owns 1/4 of the jobs, and of an operator who sees all) and counts the SQL queries per
request with CaptureQueriesContext. Page sizes 10 and 100 side by side show whether the
query count is constant (no N+1). Each database runs in a child process of its own
(Django sets up one database per process); the parent prints both side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as lib

GOAL_P95_MS = 250.0


def child(args: argparse.Namespace) -> dict[str, object]:
    name = "gantry_bench_api" if args.db == "postgres" else "api"
    if args.db == "postgres":
        lib.pg_create(name)
        url = lib.pg_url(name)
    else:
        lib.sqlite_remove(name)
        url = lib.sqlite_url(name)
    lib.django_setup(url)
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from jobs.models import Job

    points_per_job = 100_000
    seeded = lib.seed(
        jobs=args.jobs,
        metric_jobs=max(1, args.points // points_per_job),
        points_per_job=points_per_job,
        say=lambda s: print(s, file=sys.stderr),
    )
    researcher = seeded["owners"][0]
    operator = seeded["operator"]
    metric_job = seeded["metric_job_ids"][0]
    # Make the metric job "running" so the detail page does everything a live page does.
    Job.objects.filter(id=metric_job).update(state="running", files_final=False)
    researcher_client = Client()
    researcher_client.force_login(researcher)
    operator_client = Client()
    operator_client.force_login(operator)

    cases = [
        ("api jobs page_size=10 (researcher)", researcher_client, "/api/v1/jobs/?page_size=10"),
        ("api jobs page_size=50 (researcher)", researcher_client, "/api/v1/jobs/?page_size=50"),
        ("api jobs page_size=100 (researcher)", researcher_client, "/api/v1/jobs/?page_size=100"),
        ("api jobs page_size=50 (operator)", operator_client, "/api/v1/jobs/?page_size=50"),
        ("api jobs page_size=100 (operator)", operator_client, "/api/v1/jobs/?page_size=100"),
        (
            "api jobs state=running size=100",
            operator_client,
            "/api/v1/jobs/?state=running&page_size=100",
        ),
        (
            "api metrics 100k pts full range",
            researcher_client,
            f"/api/v1/jobs/{metric_job}/metrics/",
        ),
        (
            "api metrics step 1000..2999",
            researcher_client,
            f"/api/v1/jobs/{metric_job}/metrics/?step_min=1000&step_max=2999",
        ),
        ("api job detail", researcher_client, f"/api/v1/jobs/{metric_job}/"),
        ("page /jobs/ (researcher)", researcher_client, "/jobs/"),
        ("page /jobs/?state=completed", operator_client, "/jobs/?state=completed"),
        ("page /jobs/?state=running", operator_client, "/jobs/?state=running"),
        ("page job detail (100k pts)", researcher_client, f"/jobs/{metric_job}/"),
        ("page / overview (researcher)", researcher_client, "/"),
        ("page / overview (operator)", operator_client, "/"),
    ]
    results = []
    for label, client, path in cases:
        for _ in range(2):  # warm-up
            client.get(path)
        times = []
        queries = []
        size = 0
        status = 0
        points = None
        for _ in range(args.reps):
            with CaptureQueriesContext(connection) as captured:
                started = time.perf_counter()
                response = client.get(path)
                times.append((time.perf_counter() - started) * 1000)
            queries.append(len(captured.captured_queries))
            status = response.status_code
            size = len(response.content)
        if "metrics" in path:
            body = json.loads(response.content)
            points = len(body["step"])
        results.append(
            {
                "label": label,
                "p50": lib.med(times),
                "p95": lib.pct(times, 0.95),
                "queries_min": min(queries),
                "queries_max": max(queries),
                "status": status,
                "bytes": size,
                "points": points,
            }
        )
        print(f"  {args.db}: {label}: p50 {lib.med(times):.1f} ms", file=sys.stderr)
    if not args.keep:
        connection.close()
        if args.db == "postgres":
            lib.pg_drop(name)
        else:
            lib.sqlite_remove(name)
    return {"db": args.db, "results": results}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20k jobs, 200k points, 8 reps")
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--points", type=int, default=None)
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the bench databases")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.jobs = args.jobs or (20_000 if args.quick else 100_000)
    args.points = args.points or (200_000 if args.quick else 1_000_000)
    args.reps = args.reps or (8 if args.quick else 20)
    if args.child:
        print("RESULT " + json.dumps(child(args)))
        return 0
    started = time.perf_counter()
    dbs = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    outputs = {}
    for db in dbs:
        argv = [
            sys.executable,
            __file__,
            "--child",
            "--db",
            db,
            "--jobs",
            str(args.jobs),
            "--points",
            str(args.points),
            "--reps",
            str(args.reps),
        ]
        if args.keep:
            argv.append("--keep")
        proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True, env=dict(os.environ))
        if proc.returncode != 0:
            print(f"{db} child failed (rc {proc.returncode})")
            return 1
        line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
        outputs[db] = json.loads(line[7:])["results"]
    print(
        f"\n# api bench: {args.jobs} jobs, {args.points} metric points "
        f"({args.points // 100_000} jobs x 100k), {args.reps} timed requests each, in-process "
        "Django test Client, DEBUG off"
    )
    header = ["request"]
    for db in dbs:
        header += [f"{db} p50 ms", "p95 ms", "queries"]
    header += ["status", "bytes", "points"]
    rows = []
    first = outputs[dbs[0]]
    for i, r in enumerate(first):
        row = [r["label"]]
        for db in dbs:
            x = outputs[db][i]
            q = (
                str(x["queries_min"])
                if x["queries_min"] == x["queries_max"]
                else (f"{x['queries_min']}-{x['queries_max']}")
            )
            row += [f"{x['p50']:.1f}", f"{x['p95']:.1f}", q]
        row += [r["status"], r["bytes"], r["points"] if r["points"] is not None else ""]
        rows.append(row)
    print(lib.table(rows, header))
    print()
    for db in dbs:
        by = {x["label"]: x for x in outputs[db]}
        q10 = by["api jobs page_size=10 (researcher)"]["queries_max"]
        q100 = by["api jobs page_size=100 (researcher)"]["queries_max"]
        pages = [
            by["page /jobs/?state=completed"]["queries_max"],
            by["page /jobs/?state=running"]["queries_max"],
        ]
        worst = max(outputs[db], key=lambda x: x["p95"])
        pts = by["api metrics 100k pts full range"]["points"]
        print(
            f"{db}: API job list queries page 10 vs 100: {q10} vs {q100} "
            f"({'constant, no N+1' if q10 == q100 else 'GROWS: N+1'}); "
            f"/jobs/ page completed vs running jobs: {pages[0]} vs {pages[1]} queries "
            f"({'constant' if pages[0] == pages[1] else 'GROWS with running jobs: N+1'}); "
            f"metrics full range -> {pts} points ({'<= 2000 ok' if pts <= 2000 else 'OVER 2000'}); "
            f"slowest p95: {worst['label']} {worst['p95']:.0f} ms "
            f"(all p95 <= {GOAL_P95_MS:.0f} ms: "
            f"{'yes' if worst['p95'] <= GOAL_P95_MS else 'no'})"
        )
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
