"""Job reconcile cost on the dev cluster as the number of active jobs grows.

    flock /tmp/gantry-devcluster.lock .venv/bin/python bench/reconcile_bench.py \
        [--quick] [--sizes 1,200,500] [--cycles 10] [--db sqlite|postgres] [--keep]

Submits max(sizes) real Slurm jobs held in the queue (``sbatch --hold``: they stay PENDING
and use no resources) as the cluster user over Gantry's own SSH transport, creates one Job
row per Slurm job in a bench database (SQLite var/bench/reconcile.sqlite3 or PostgreSQL
gantry_bench_reconcile) with the dev cluster registered, and for each size makes exactly
that many of them active and runs ``watcher.cycle.cluster_reconcile`` cycles. Prints per
size: remote commands per cycle (ReconcileResult.commands, the transport's commands_run
delta; goal: constant, <= 3), SQL queries per cycle, and cycle wall time median / p95.
Cancels every Slurm job it submitted (by id) at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as lib


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sizes 1,50; 4 cycles")
    parser.add_argument("--sizes", default=None, help="comma-separated active-job counts")
    parser.add_argument("--cycles", type=int, default=None)
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--keep", action="store_true", help="keep the bench database")
    args = parser.parse_args()
    args.sizes = [
        int(s) for s in (args.sizes or ("1,50" if args.quick else "1,200,500")).split(",")
    ]
    args.cycles = args.cycles or (4 if args.quick else 10)
    return args


def main() -> int:
    args = parse_args()
    sizes, cycles = args.sizes, args.cycles
    started_all = time.perf_counter()
    name, url = lib.bench_database(args.db, "reconcile")
    lib.django_setup(url)

    from django.db import connection

    from nodes.access.cluster import transport_for
    from slurm.transport import close_all

    dc = lib.devcluster()
    dc.wait_quiet()
    cluster = lib.register_devcluster(dc)
    owner = lib.make_user("bench-reconcile", "researchers")
    transport = transport_for(cluster)
    total = max(sizes)
    slurm_ids: list[str] = []
    try:
        t0 = time.perf_counter()
        # One remote command submits them all (the submit path is not what is measured).
        slurm_ids = lib.submit_held_jobs(transport, dc, total, name="gantry-bench-reconcile")
        submit_s = time.perf_counter() - t0
        ordered_ids = create_parked_jobs(owner, cluster, dc, slurm_ids)
        print(
            f"# submitted {total} held Slurm jobs in {submit_s:.1f} s "
            f"({slurm_ids[0]}..{slurm_ids[-1]}); db {connection.vendor}"
        )
        rows = [measure_size(size, cycles, owner, cluster, ordered_ids) for size in sizes]
        squeue_s = squeue_round_trips(cluster, ordered_ids[:total], slurm_ids[:total])
    finally:
        lib.cancel_slurm_jobs(transport, slurm_ids)
        close_all()
        if not args.keep:
            connection.close()
            lib.bench_database_drop(args.db, name)
    report(rows, squeue_s, args, connection.vendor)
    print(f"total {time.perf_counter() - started_all:.0f} s")
    return 0


def create_parked_jobs(owner: Any, cluster: Any, dc: Any, slurm_ids: list[str]) -> list[Any]:
    """One Job row per held Slurm job, parked (cancelled, final) until a size makes it
    active; returns their ids in Slurm id order."""
    from django.utils import timezone

    from jobs.models import Job

    now = timezone.now()
    Job.objects.bulk_create(
        [
            Job(
                owner=owner,
                cluster=cluster,
                name=f"bench-reconcile-{i}",
                config={"preset": "tiny"},
                partition=dc.default_partition,
                state=Job.State.CANCELLED,  # parked; made active per size below
                files_final=True,
                slurm_job_id=slurm_id,
                submitted_at=now - timedelta(seconds=5),
            )
            for i, slurm_id in enumerate(slurm_ids)
        ]
    )
    return list(
        Job.objects.filter(owner=owner).order_by("slurm_job_id").values_list("id", flat=True)
    )


def _spread(values: list[int]) -> int | str:
    """``7`` when every cycle gave 7, else ``min-max``."""
    return f"{min(values)}-{max(values)}" if min(values) != max(values) else values[0]


def measure_size(
    size: int, cycles: int, owner: Any, cluster: Any, ordered_ids: list[Any]
) -> list[Any]:
    """``cycles`` timed reconcile cycles (after one warm-up) with exactly ``size`` of the
    jobs pending; the table's row for that size."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobs.models import Job
    from watcher.cycle import cluster_reconcile

    Job.objects.filter(owner=owner).update(state=Job.State.CANCELLED, files_final=True)
    Job.objects.filter(id__in=ordered_ids[:size]).update(
        state=Job.State.PENDING, files_final=False, state_reason=""
    )
    cluster_reconcile(cluster_id=cluster.pk)  # warm-up: first view of each job
    commands: list[int] = []
    queries: list[int] = []
    seconds: list[float] = []
    errors: list[str] = []
    for _ in range(cycles):
        connection.queries_log.clear()  # its deque keeps 9000: count per cycle
        with CaptureQueriesContext(connection) as captured:
            t = time.perf_counter()
            result = cluster_reconcile(cluster_id=cluster.pk)
            seconds.append(time.perf_counter() - t)
        commands.append(result.commands)
        queries.append(len(captured.captured_queries))
        errors += result.errors
    pending = Job.objects.filter(owner=owner, state=Job.State.PENDING).count()
    print(
        f"  {size} active: commands {commands}, queries {queries[0]}, "
        f"median {lib.med(seconds) * 1000:.0f} ms" + (f", errors {errors[:1]}" if errors else "")
    )
    return [
        size,
        _spread(commands),
        _spread(queries),
        f"{lib.med(seconds) * 1000:.0f}",
        f"{lib.pct(seconds, 0.95) * 1000:.0f}",
        f"{lib.med(seconds) * 1000 / size:.2f}",
        pending,
        len(errors),
    ]


def squeue_round_trips(cluster: Any, job_ids: list[Any], slurm_ids: list[str]) -> list[float]:
    """Where the time goes at the largest size: the remote command alone, 5 times."""
    from jobs.models import Job
    from nodes.access.cluster import slurm_client_for

    Job.objects.filter(id__in=job_ids).update(state=Job.State.PENDING)
    client = slurm_client_for(cluster)
    squeue_s = []
    for _ in range(5):
        t = time.perf_counter()
        client.jobs_in_queue(slurm_ids)
        squeue_s.append(time.perf_counter() - t)
    return squeue_s


def report(
    rows: list[list[Any]], squeue_s: list[float], args: argparse.Namespace, vendor: str
) -> None:
    sizes = args.sizes
    print(
        f"\n# reconcile bench: dev cluster (Slurm, 4 nodes), held PENDING jobs, {args.cycles} "
        f"cycles per size after 1 warm-up, {vendor}"
    )
    print(
        lib.table(
            rows,
            [
                "active jobs",
                "remote cmds/cycle",
                "SQL queries/cycle",
                "median ms",
                "p95 ms",
                "ms/job",
                "still pending",
                "errors",
            ],
        )
    )
    big = max(sizes)
    print(
        f"squeue round trip for {big} ids alone (client.jobs_in_queue): median "
        f"{lib.med(squeue_s) * 1000:.0f} ms"
    )
    cmd_ok = all(str(r[1]) in ("1", "2", "3") for r in rows)
    print(
        f"goal remote commands constant and <= 3 from {sizes[0]} to {big} jobs: "
        f"{'MET' if cmd_ok and len({str(r[1]) for r in rows}) == 1 else 'NOT MET'}"
    )
    print(
        f"cycle time {sizes[0]} vs {big} jobs: {rows[0][3]} ms vs {rows[-1][3]} ms "
        f"(x{float(rows[-1][3]) / max(1.0, float(rows[0][3])):.1f}); SQL queries per cycle "
        f"{rows[0][2]} vs {rows[-1][2]}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
