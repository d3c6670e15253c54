"""Metrics ingestion: points/s into SQLite and PostgreSQL, and bytes read per watcher cycle.

    flock /tmp/gantry-devcluster.lock .venv/bin/python bench/metrics_bench.py \
        [--quick] [--points 300000] [--cycles 10] [--keep]

Part 1 (no cluster): trainer-format metrics.jsonl bytes (the real line shape, ~330 bytes a
line) go through ``jobs.ingest.metrics_ingest`` exactly as the watcher calls it, in 8 MiB
chunks (the watcher's read size) and in 25-line chunks (a live job between two cycles),
into a bench SQLite file (var/bench/metrics.sqlite3) and a PostgreSQL database
(gantry_bench_metrics), each in a child process. Prints points/s (goal >= 50k/s) and the
share spent in JSON parsing alone (measured separately on the same bytes).

Part 2 (dev cluster): a real Slurm job (``sleep``) runs; a Job row in state running points
at it and at a run directory on the cluster with a 4 MB metrics.jsonl to start with; between
``cluster_reconcile`` cycles the bench appends lines to the file as the cluster user (over
SSH) and records ReconcileResult.bytes_read (SFTP metrics bytes) against the bytes
appended (goal: bytes read ~= new bytes, not the whole file), plus the transport's total
bytes (squeue and the run-directory scan included). One cycle appends half a line: that
partial line is left for the next cycle and read again then.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as lib


def metric_lines(start: int, count: int, t0: float = 1.8e9) -> bytes:
    rng = random.Random(start)
    out = []
    for step in range(start, start + count):
        out.append(
            json.dumps(
                {
                    "step": step,
                    "time": t0 + step * 0.064,
                    "elapsed": step * 0.064,
                    "loss": 3.5 / (1 + step * 1e-3) + rng.random() * 1e-3,
                    "lr": 3e-4 * rng.random(),
                    "samples_per_s": 240 + rng.random(),
                    "tokens_per_s": 15300 + rng.random(),
                    "step_time": 0.064 + rng.random() * 1e-3,
                    "data_time": 0.003 + rng.random() * 1e-4,
                    "checkpoint_blocking_time": 0.0,
                    "world_size": 1,
                    "global_batch": 16,
                },
                separators=(",", ":"),
            )
        )
    return ("\n".join(out) + "\n").encode()


INGEST_MODES = ("8 MiB chunks (catch-up)", "25-line chunks (live)")


def ingest_chunks(data: bytes, label: str, points: int) -> tuple[list[bytes], int]:
    """The chunks the watcher would hand to ingest, and how many points they hold: 8 MiB
    reads ending on a line (catch-up), or 25 lines a cycle for at most 40k lines (live)."""
    if label == INGEST_MODES[0]:
        chunks = []
        pos = 0
        while pos < len(data):
            end = data.rfind(b"\n", pos, pos + (8 << 20)) + 1 or len(data)
            chunks.append(data[pos:end])
            pos = end
        return chunks, points
    # A live job: 25 new lines per cycle; a bounded number of cycles.
    n = min(points, 40_000)
    lines = data.splitlines(keepends=True)[:n]
    return [b"".join(lines[i : i + 25]) for i in range(0, n, 25)], n


def ingest_child(args: argparse.Namespace) -> dict[str, Any]:
    name, url = lib.bench_database(args.db, "metrics")
    lib.django_setup(url)
    from django.db import connection

    from jobs.ingest import metrics_ingest
    from jobs.models import Job, MetricPoint

    seeded = lib.seed(
        jobs=2, metric_jobs=0, points_per_job=0, users=1, clusters=1, say=lambda s: None
    )
    data = metric_lines(1, args.points)
    # Parsing alone, on the same bytes (what metrics_ingest does before the database).
    t = time.perf_counter()
    for raw in data.splitlines():
        json.loads(raw)
    parse_s = time.perf_counter() - t
    results = {}
    for label in INGEST_MODES:
        # The oldest job takes the catch-up, the newest the live cycles.
        newest_first = "-created_at" if label == INGEST_MODES[1] else "created_at"
        job = Job.objects.filter(owner=seeded["owners"][0]).order_by(newest_first).first()
        assert job is not None
        Job.objects.filter(id=job.id).update(metrics_offset=0)
        job.refresh_from_db()
        chunks, total_points = ingest_chunks(data, label, args.points)
        offset = 0
        stored = 0
        t = time.perf_counter()
        for chunk in chunks:
            got, offset = metrics_ingest(job=job, data=chunk, start_offset=offset)
            stored += got
        seconds = time.perf_counter() - t
        assert stored == total_points, (stored, total_points)
        assert MetricPoint.objects.filter(job=job).count() == total_points
        results[label] = {"points": total_points, "seconds": seconds, "chunks": len(chunks)}
        print(f"  {args.db}: {label}: {total_points / seconds:,.0f} points/s", file=sys.stderr)
    if not args.keep:
        connection.close()
        lib.bench_database_drop(args.db, name)
    return {"db": args.db, "parse_points_per_s": args.points / parse_s, "results": results}


def bytes_child(args: argparse.Namespace) -> dict[str, Any]:
    name = "metrics_bytes"
    lib.sqlite_remove(name)
    lib.django_setup(lib.sqlite_url(name))
    from django.db import connection

    from jobs.models import MetricPoint
    from nodes.access.cluster import slurm_client_for, transport_for
    from slurm.transport import close_all

    dc = lib.devcluster()
    cluster = lib.register_devcluster(dc)
    owner = lib.make_user("bench-metrics", "researchers")
    transport = transport_for(cluster)
    slurm_id = ""
    try:
        slurm_id = start_sleeping_job(transport, slurm_client_for(cluster), dc, args.cycles)
        job = running_job_row(owner, cluster, dc, slurm_id)
        directory, metrics, rows, step, appended_total = grow_and_reconcile(
            transport, cluster, str(job.id), args.cycles
        )
        size = int(transport.exec(["stat", "-c", "%s", metrics]).stdout.strip())
        stored = MetricPoint.objects.filter(job=job).count()
        transport.exec(["rm", "-rf", directory], check=False)
    finally:
        if slurm_id:
            transport.exec(["scancel", slurm_id], check=False)
        close_all()
        connection.close()
        if not args.keep:
            lib.sqlite_remove(name)
    return {
        "rows": rows,
        "file_size": size,
        "stored": stored,
        "lines": step - 1,
        "appended_total": appended_total,
        "slurm_id": slurm_id,
    }


def start_sleeping_job(transport: Any, client: Any, dc: Any, cycles: int) -> str:
    """A real Slurm job that sleeps through the cycles; its id once it runs (or after 60 s)."""
    out = transport.exec(
        [
            "sbatch",
            "--parsable",
            "-p",
            dc.default_partition,
            "-t",
            "3",
            "-J",
            "gantry-bench-metrics",
            "-o",
            "/dev/null",
            "--wrap",
            f"sleep {cycles * 4 + 60}",
        ]
    ).stdout
    slurm_id: str = out.strip().split(";")[0]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        seen = client.jobs_in_queue([slurm_id]).get(slurm_id)
        if seen and seen.state.upper() == "RUNNING":
            break
        time.sleep(0.5)
    return slurm_id


def running_job_row(owner: Any, cluster: Any, dc: Any, slurm_id: str) -> Any:
    """A Job row in state running that watches Slurm job ``slurm_id``."""
    from django.utils import timezone

    from jobs.models import Job

    return Job.objects.create(
        owner=owner,
        cluster=cluster,
        name="bench-metrics-bytes",
        config={"preset": "tiny"},
        partition=dc.default_partition,
        state=Job.State.RUNNING,
        slurm_job_id=slurm_id,
        submitted_at=timezone.now(),
        started_at=timezone.now(),
    )


def grow_and_reconcile(
    transport: Any, cluster: Any, job_id: str, cycles: int
) -> tuple[str, str, list[list[Any]], int, int]:
    """The job's metrics.jsonl starts at ~4 MB on the cluster and grows by 100 lines before
    each reconcile cycle after the first (half a line is held back once: the trainer is
    mid-write). Returns the run directory, the file, one table row per cycle, the next step
    and the bytes appended in all."""
    import shlex

    from runs.runtime import run_dir
    from watcher.cycle import cluster_reconcile

    directory = run_dir(cluster.workdir, job_id)
    metrics = f"{directory}/metrics.jsonl"
    step = 1
    initial = metric_lines(step, 12_000)  # ~4 MB already on disk
    step += 12_000
    transport.exec_shell(
        f"mkdir -p {shlex.quote(directory)} && cat > {shlex.quote(metrics)}", stdin=initial
    )
    appended_total = len(initial)
    partial_left = b""
    rows = []
    for cycle in range(cycles):
        if cycle == 0:
            appended = initial
        else:
            new = metric_lines(step, 100)
            step += 100
            if cycle == cycles // 2:
                # Half a line at the end: the trainer is mid-write.
                cut = len(new) - 150
                new, partial_left = new[:cut], new[cut:]
            elif partial_left:
                new = partial_left + new
                partial_left = b""
            transport.exec_shell(f"cat >> {shlex.quote(metrics)}", stdin=new)
            appended = new
            appended_total += len(new)
        before = transport.bytes_read
        t = time.perf_counter()
        result = cluster_reconcile(cluster_id=cluster.pk)
        seconds = time.perf_counter() - t
        rows.append(
            [
                cycle,
                len(appended),
                result.bytes_read,
                transport.bytes_read - before,
                f"{result.bytes_read / max(1, len(appended)):.3f}",
                result.metric_points,
                result.sftp_reads,
                result.commands,
                f"{seconds * 1000:.0f}",
                "; ".join(result.errors)[:60],
            ]
        )
    return directory, metrics, rows, step, appended_total


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k points, 5 cycles")
    parser.add_argument("--points", type=int, default=None)
    parser.add_argument("--cycles", type=int, default=None)
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--skip-cluster", action="store_true")
    parser.add_argument("--child", choices=["ingest", "bytes"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.points = args.points or (100_000 if args.quick else 300_000)
    args.cycles = args.cycles or (5 if args.quick else 10)
    return args


def run_child(args: argparse.Namespace, *extra: str) -> dict[str, Any]:
    """This script again as a child (Django sets up one database per process); its result."""
    argv = [
        sys.executable,
        __file__,
        "--points",
        str(args.points),
        "--cycles",
        str(args.cycles),
        *extra,
    ] + (["--keep"] if args.keep else [])
    proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    if proc.returncode != 0:
        raise SystemExit(f"child {extra} failed (rc {proc.returncode})")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line[7:])
    return result


def main() -> int:
    args = parse_args()
    if args.child:
        result = ingest_child(args) if args.child == "ingest" else bytes_child(args)
        print("RESULT " + json.dumps(result))
        return 0
    started = time.perf_counter()
    ingest = {db: run_child(args, "--child", "ingest", "--db", db) for db in ("sqlite", "postgres")}
    report_ingest(ingest, args)
    if not args.skip_cluster:
        report_bytes(run_child(args, "--child", "bytes"))
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


def report_ingest(ingest: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"\n# metrics ingest: {args.points} trainer-format lines through "
        "jobs.ingest.metrics_ingest (parse + conditional offset update + bulk upsert)"
    )
    rows = []
    for label in INGEST_MODES:
        row = [label]
        for db in ("sqlite", "postgres"):
            r = ingest[db]["results"][label]
            row += [r["points"], r["chunks"], f"{r['points'] / r['seconds']:,.0f}"]
        rows.append(row)
    print(
        lib.table(
            rows,
            [
                "mode",
                "sqlite points",
                "chunks",
                "points/s",
                "postgres points",
                "chunks",
                "points/s",
            ],
        )
    )
    parse = ingest["sqlite"]["parse_points_per_s"]
    catch_up = ingest["sqlite"]["results"][INGEST_MODES[0]]
    share = 100 * catch_up["points"] / parse / catch_up["seconds"]
    print(
        f"json.loads alone on the same lines: {parse:,.0f} lines/s "
        f"(= {share:.0f}% of the SQLite catch-up time)"
    )
    for db in ("sqlite", "postgres"):
        r = ingest[db]["results"][INGEST_MODES[0]]
        live = ingest[db]["results"][INGEST_MODES[1]]
        rate, live_rate = r["points"] / r["seconds"], live["points"] / live["seconds"]
        print(
            f"goal ingest >= 50k points/s on {db}: {'MET' if rate >= 50_000 else 'NOT MET'} "
            f"({rate:,.0f}/s catch-up; {live_rate:,.0f}/s in 25-line cycles)"
        )


def report_bytes(b: dict[str, Any]) -> None:
    print(
        f"\n# bytes read per reconcile cycle: dev cluster, running Slurm job "
        f"{b['slurm_id']}, metrics.jsonl grows by ~33 KB (100 lines) per cycle after a "
        f"4 MB start"
    )
    print(
        lib.table(
            b["rows"],
            [
                "cycle",
                "bytes appended",
                "bytes read (metrics)",
                "transport bytes",
                "read/appended",
                "points",
                "sftp reads",
                "remote cmds",
                "ms",
                "errors",
            ],
        )
    )
    steady = b["rows"][1:]
    read = sum(r[2] for r in steady)
    appended = sum(r[1] for r in steady)
    print(
        f"after the first cycle: {read} bytes read for {appended} appended "
        f"(ratio {read / max(1, appended):.3f}); file {b['file_size']} bytes, "
        f"{b['stored']} of {b['lines']} lines stored"
    )
    ok = 0.99 <= read / max(1, appended) <= 1.05 and b["stored"] == b["lines"]
    print(
        f"goal bytes read per cycle ~= new bytes (not the whole file): {'MET' if ok else 'NOT MET'}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
