"""A watcher's memory over many reconcile cycles: no growth from cycle 100 to cycle 1,000.

    flock /tmp/gantry-devcluster.lock .venv/bin/python bench/watcher_memory_bench.py \
        [--quick] [--jobs 200] [--cycles 1000] [--db sqlite|postgres] [--keep]

Submits ``--jobs`` real Slurm jobs held in the queue (``sbatch --hold``: PENDING, no
resources used) on the dev cluster, one Job row each in a bench database, and runs
``watcher.cycle.cluster_reconcile`` (the body of the Celery reconcile task, with the same
pooled SSH transport a worker keeps) ``--cycles`` times in this one process, with
DEBUG off as in a worker. Every 100 cycles it records the process's resident set size
(VmRSS from /proc/self/status, after ``gc.collect()``) and Python's own allocations
(tracemalloc, current). Prints the table and the ratio RSS(last) / RSS(cycle 100): the goal
is within 10% (<= 1.10). Cancels every Slurm job it submitted (by id) at the end.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as lib


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50 jobs, 300 cycles")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--cycles", type=int, default=None)
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--keep", action="store_true", help="keep the bench database")
    args = parser.parse_args()
    args.jobs = args.jobs or (50 if args.quick else 200)
    args.cycles = args.cycles or (300 if args.quick else 1000)
    return args


def main() -> int:
    args = parse_args()
    total, cycles = args.jobs, args.cycles
    started_all = time.perf_counter()
    name, url = lib.bench_database(args.db, "watcher_memory")
    lib.django_setup(url)

    from django.conf import settings
    from django.db import connection

    from jobs.models import Job
    from nodes.access.cluster import transport_for
    from slurm.transport import close_all

    assert not settings.DEBUG, "DEBUG keeps every query: not what a worker runs"
    dc = lib.devcluster()
    dc.wait_quiet()
    cluster = lib.register_devcluster(dc)
    owner = lib.make_user("bench-watcher-memory", "researchers")
    transport = transport_for(cluster)
    slurm_ids: list[str] = []
    try:
        slurm_ids = lib.submit_held_jobs(transport, dc, total, name="gantry-bench-memory")
        create_pending_jobs(owner, cluster, dc, slurm_ids)
        print(f"# {total} held Slurm jobs ({slurm_ids[0]}..{slurm_ids[-1]}), {connection.vendor}")
        samples, errors = run_cycles(cluster, cycles)
        still_pending = Job.objects.filter(owner=owner, state=Job.State.PENDING).count()
    finally:
        lib.cancel_slurm_jobs(transport, slurm_ids)
        close_all()
        if not args.keep:
            connection.close()
            lib.bench_database_drop(args.db, name)
    report(samples, errors, still_pending, args)
    print(f"total {time.perf_counter() - started_all:.0f} s")
    return 0


def create_pending_jobs(owner: Any, cluster: Any, dc: Any, slurm_ids: list[str]) -> None:
    """One pending Job row per held Slurm job."""
    from django.utils import timezone

    from jobs.models import Job

    now = timezone.now()
    Job.objects.bulk_create(
        [
            Job(
                owner=owner,
                cluster=cluster,
                name=f"bench-memory-{i}",
                config={"preset": "tiny"},
                partition=dc.default_partition,
                state=Job.State.PENDING,
                slurm_job_id=slurm_id,
                submitted_at=now - timedelta(seconds=5),
            )
            for i, slurm_id in enumerate(slurm_ids)
        ]
    )


def run_cycles(cluster: Any, cycles: int) -> tuple[list[tuple[int, int, int, float]], list[str]]:
    """``cycles`` reconcile cycles in this process; every 100th, after ``gc.collect()``:
    (cycle, RSS KiB, Python heap KiB, seconds so far). Returns those and the cycles' errors."""
    from watcher.cycle import cluster_reconcile

    samples: list[tuple[int, int, int, float]] = []
    errors: list[str] = []
    tracemalloc.start()
    t0 = time.perf_counter()
    for cycle in range(1, cycles + 1):
        result = cluster_reconcile(cluster_id=cluster.pk)
        errors += result.errors
        if cycle % 100 == 0:
            gc.collect()
            current, _peak = tracemalloc.get_traced_memory()
            samples.append((cycle, rss_kib(), current // 1024, time.perf_counter() - t0))
            print(
                f"  cycle {cycle}: RSS {samples[-1][1] / 1024:.1f} MiB, python "
                f"{samples[-1][2] / 1024:.1f} MiB, {samples[-1][3]:.0f} s",
                flush=True,
            )
    tracemalloc.stop()
    return samples, errors


def report(
    samples: list[tuple[int, int, int, float]],
    errors: list[str],
    still_pending: int,
    args: argparse.Namespace,
) -> None:
    print(
        f"\n# watcher memory: {args.cycles} reconcile cycles on {args.jobs} pending jobs in one "
        f"process, dev cluster, {args.db}"
    )
    print(
        lib.table(
            [[c, f"{r / 1024:.1f}", f"{p / 1024:.1f}", f"{s:.0f}"] for c, r, p, s in samples],
            ["cycle", "RSS MiB", "python heap MiB (tracemalloc)", "seconds"],
        )
    )
    first, last = samples[0], samples[-1]
    ratio = last[1] / first[1]
    print(
        f"RSS after {last[0]} vs after {first[0]} cycles: {last[1] / 1024:.1f} vs "
        f"{first[1] / 1024:.1f} MiB, ratio {ratio:.3f} (goal <= 1.10: "
        f"{'MET' if ratio <= 1.10 else 'NOT MET'}); python heap {last[2] / 1024:.1f} vs "
        f"{first[2] / 1024:.1f} MiB; jobs still pending {still_pending}/{args.jobs}; "
        f"cycle errors {len(errors)}{' e.g. ' + errors[0] if errors else ''}"
    )


if __name__ == "__main__":
    sys.exit(main())
