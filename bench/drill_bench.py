"""Restore drill end to end on the dev cluster: click to verdict, and where the time goes.

    flock /tmp/gantry-devcluster.lock .venv/bin/python bench/drill_bench.py \
        [--quick] [--drills 5] [--preset tiny|small] [--db postgres|sqlite] [--keep]

A real Celery worker and beat (tests/celery_support.py, GANTRY_RECONCILE_INTERVAL=1, the
tests' stack settings) against a bench database (PostgreSQL gantry_bench_drill or SQLite
var/bench/drill.sqlite3) with the dev cluster registered. One training job (preset
``tiny`` by default: on this 2-core VM preset ``small`` needs 14-28 s per step, 67 s for 3
steps, far over a minute, so ``--preset small`` is offered but not the default; 1 node,
1 task; 30 steps, a checkpoint every 10) runs to completion; then N drills of its step-10
checkpoint (5 steps each, the default) run one after the other, each started by
``drills.services.restore_drill_start`` as a click would.

Per drill: click -> verdict (seen in the database by polling every 50 ms; also
created_at -> finished_at) and its breakdown: queue wait (sbatch returned -> the batch
script started), the Slurm job's own run time (the batch script's start -> end, both from
its exit record ``gantry-exit-<id>.json``, to the nanosecond; sacct's whole seconds when the
record has no times), within it integrity / load / steps (the trainer's timings in
drill.json), and Gantry's own overhead = total - (Slurm run + queue wait), split into
click -> sbatch done (submitted_at - created_at) and Slurm end -> verdict stored
(finished_at - the script's end).
Goals: Gantry's overhead <= 10% of the total, total <= 30 s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as lib

STACK_ENV = {
    "GANTRY_RECONCILE_INTERVAL": "1",
    "GANTRY_SYNC_INTERVAL": "30",
    "GANTRY_SUBMIT_REQUEUE_AFTER": "20",
    "GANTRY_DRILL_POLICY_INTERVAL": "2",
    "GANTRY_DRILL_SUBMIT_RETRIES": "2",
}


def sacct_times(dc: Any, slurm_id: str) -> dict[str, Any]:
    out = dc.slurm(
        ["sacct", "-j", slurm_id, "-X", "-n", "-P", "-o", "Submit,Start,End,ElapsedRaw,State"],
        check=False,
    ).stdout.strip()
    if not out:
        return {}
    submit, start, end, elapsed, state = out.splitlines()[0].split("|")

    def parse(value: str) -> datetime | None:
        try:
            return datetime.fromisoformat(value).astimezone()  # Slurm prints local time
        except ValueError:
            return None

    return {
        "submit": parse(submit),
        "start": parse(start),
        "end": parse(end),
        "elapsed": int(elapsed or 0),
        "state": state,
    }


def sacct_when_ended(dc: Any, slurm_id: str) -> dict[str, Any]:
    """sacct's record of a job, waiting up to 10 s for its end (sacct can lag a moment)."""
    acct = sacct_times(dc, slurm_id)
    for _ in range(20):
        if acct.get("end"):
            break
        time.sleep(0.5)
        acct = sacct_times(dc, slurm_id)
    return acct


def read_exit_record(drill: Any) -> dict[str, float] | None:
    """The exit record the drill's batch script wrote (same host: read from disk)."""
    from drills.lifecycle import DRILLS

    path = Path(DRILLS.run_directory(drill)) / f"gantry-exit-{drill.slurm_job_id}.json"
    try:
        record = json.loads(path.read_text())
        return {"started": float(record["started"]), "ended": float(record["ended"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 drills")
    parser.add_argument("--drills", type=int, default=None)
    parser.add_argument("--preset", choices=["small", "tiny"], default="tiny")
    parser.add_argument("--steps", type=int, default=30, help="training steps of the job")
    parser.add_argument("--db", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    args.drills = args.drills or (2 if args.quick else 5)
    return args


def main() -> int:
    args = parse_args()
    started_all = time.perf_counter()
    os.environ.update(STACK_ENV)
    name, url = lib.bench_database(args.db, "drill")
    lib.django_setup(url)
    from django.db import connection

    from celery_support import flush_test_broker, start_beat, start_worker
    from slurm.transport import close_all

    dc = lib.devcluster()
    dc.wait_quiet()
    cluster = lib.register_devcluster(dc)
    researcher = lib.make_user("bench-drill", "researchers")
    lib.map_account(cluster, researcher, "alice")
    flush_test_broker()
    logs = lib.BENCH_DIR / "drill-logs"
    logs.mkdir(parents=True, exist_ok=True)
    worker = start_worker(database_url=url, log_path=logs / "worker.log", extra_env=STACK_ENV)
    beat = start_beat(database_url=url, log_path=logs / "beat.log", extra_env=STACK_ENV)
    print(f"# worker pid {worker.process.pid}, beat pid {beat.process.pid}; db {connection.vendor}")
    slurm_ids: list[str] = []
    try:
        checkpoint = train_job(dc, researcher, args, worker, slurm_ids)
        rows = [measure_drill(n, dc, researcher, checkpoint, slurm_ids) for n in range(args.drills)]
    finally:
        beat.stop()
        worker.stop()
        print(f"# beat {beat.process.pid} and worker {worker.process.pid} stopped")
        left = [i for i in slurm_ids if i]
        if left:
            dc.slurm(["scancel", *left], check=False)  # any still queued (none when all ended)
        close_all()
        connection.close()
    report(rows, args)
    print(f"total {time.perf_counter() - started_all:.0f} s")
    if not args.keep:
        lib.bench_database_drop(args.db, name)
    return 0


def train_job(
    dc: Any, researcher: Any, args: argparse.Namespace, worker: Any, slurm_ids: list[str]
) -> Any:
    """The training job, submitted through the API and run to completion; returns its first
    checkpoint (the one every drill restores)."""
    from rest_framework.test import APIClient

    from jobs.models import Job

    api = APIClient()
    api.force_authenticate(user=researcher)
    t0 = time.perf_counter()
    response = api.post(
        "/api/v1/jobs/submit/",
        {
            "name": "drill-bench",
            "partition": dc.default_partition,
            "nodes": 1,
            "gpus_per_node": 0,
            "tasks_per_node": 1,
            "time_limit_minutes": 10,
            "config": {
                "preset": args.preset,
                "steps": args.steps,
                "checkpoint_every": 10,
                "checkpoint_keep": 10,
            },
        },
        format="json",
    )
    assert response.status_code == 202, response.content
    job_id = response.json()["id"]
    deadline = time.monotonic() + 240
    while True:
        job = Job.objects.get(id=job_id)
        if job.slurm_job_id and job.slurm_job_id not in slurm_ids:
            slurm_ids.append(job.slurm_job_id)
        if job.files_final:
            break
        if time.monotonic() > deadline:
            raise SystemExit(
                f"training job not done in 240 s: {job.state}; worker log: {worker.log()[-2000:]}"
            )
        time.sleep(0.5)
    train_s = time.perf_counter() - t0
    assert job.state == "completed", (job.state, job.state_reason)
    checkpoint = job.checkpoints.order_by("step").first()
    if checkpoint is None:
        raise SystemExit("the training job completed without a checkpoint")
    print(
        f"# training job ({args.preset}, {args.steps} steps): completed, "
        f"{train_s:.0f} s from submit to files final; drilling checkpoint step "
        f"{checkpoint.step} ({checkpoint.size_bytes / 1e6:.1f} MB)"
    )
    return checkpoint


def measure_drill(
    n: int, dc: Any, researcher: Any, checkpoint: Any, slurm_ids: list[str]
) -> dict[str, Any]:
    """Drill ``n``: started as a click would, watched until its verdict, then timed."""
    from drills.services import restore_drill_start

    click = time.time()
    drill = restore_drill_start(actor=researcher, checkpoint=checkpoint)
    deadline = time.monotonic() + 180
    while True:
        drill.refresh_from_db()
        if drill.slurm_job_id and drill.slurm_job_id not in slurm_ids:
            slurm_ids.append(drill.slurm_job_id)
        if not drill.is_active:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"drill {drill.id} no verdict in 180 s: {drill.state}")
        time.sleep(0.05)
    seen = time.time() - click
    acct = sacct_when_ended(dc, drill.slurm_job_id)
    row = drill_timings(drill, acct)
    row.update(n=n + 1, verdict=drill.verdict, seen=seen)
    print(
        f"  drill {n + 1}: {drill.verdict} in {seen:.1f} s (slurm {drill.slurm_job_id}"
        f", {acct.get('state')})"
    )
    return row


def drill_timings(drill: Any, acct: dict[str, Any]) -> dict[str, Any]:
    """Where a finished drill's time went (seconds), from its own record and its Slurm
    job's: the batch script's exit record where there is one, else sacct."""
    assert drill.created_at and drill.submitted_at and drill.finished_at, drill.id
    total = (drill.finished_at - drill.created_at).total_seconds()
    exit_record = read_exit_record(drill)
    if exit_record:
        # The batch script's own clock, to the nanosecond: when it started and ended.
        started = datetime.fromtimestamp(exit_record["started"], tz=UTC)
        ended = datetime.fromtimestamp(exit_record["ended"], tz=UTC)
        run = (ended - started).total_seconds()
        wait = (started - drill.submitted_at).total_seconds()
        detect = (drill.finished_at - ended).total_seconds()
    else:  # sacct's whole seconds
        run = float(acct.get("elapsed") or 0)
        wait = drill.queue_wait_s or 0.0
        end = acct.get("end")
        detect = (drill.finished_at - end).total_seconds() if end else float("nan")
    integrity, load, steps = drill.integrity_s or 0, drill.load_s or 0, drill.steps_s or 0
    return {
        "precise": exit_record is not None,
        "total": total,
        "wait": wait,
        "run": run,
        "integrity": integrity,
        "load": load,
        "steps": steps,
        "in_job_other": run - (integrity + load + steps),
        "overhead": total - (run + wait),
        "submit": (drill.submitted_at - drill.created_at).total_seconds(),
        "detect": detect,
    }


# The table's timing columns, in order, with their headings.
COLUMNS = {
    "seen": "click->verdict seen",
    "total": "created->finished",
    "wait": "queue wait",
    "run": "slurm run",
    "integrity": "integrity",
    "load": "load",
    "steps": "steps",
    "in_job_other": "in-job other",
    "overhead": "gantry overhead",
    "submit": "of which click->sbatch",
    "detect": "slurm end->verdict",
}


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    keys = list(COLUMNS)
    table_rows: list[list[Any]] = [
        [r["n"], r["verdict"]] + [f"{r[k]:.2f}" for k in keys] for r in rows
    ]
    table_rows.append(["median", ""] + [f"{lib.med([r[k] for r in rows]):.2f}" for k in keys])
    print(
        f"\n# drill bench: {len(rows)} drills of a {args.preset} checkpoint, 5 steps, 1 node x "
        f"1 task, dev cluster, worker --pool=solo + beat, reconcile interval 1 s; "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; seconds"
    )
    print(lib.table(table_rows, ["drill", "verdict", *COLUMNS.values()]))
    total = lib.med([r["total"] for r in rows])
    overhead = lib.med([r["overhead"] for r in rows])
    share = overhead / total if total else float("nan")
    precise = sum(1 for r in rows if r["precise"])
    print(
        f"(slurm run and queue wait from the batch script's own start/end times in its exit "
        f"record, to the nanosecond, for {precise} of {len(rows)} drills; else sacct's whole "
        "seconds. in-job other = slurm run - integrity - load - steps: python/torch start-up, "
        "srun, writing drill.json)"
    )
    print(
        f"goal Gantry overhead <= 10% of total: {'MET' if share <= 0.10 else 'NOT MET'} "
        f"(median overhead {overhead:.2f} s of {total:.2f} s = {share * 100:.0f}%)"
    )
    print(
        f"goal total <= 30 s: {'MET' if total <= 30 else 'NOT MET'} (median {total:.2f} s; "
        f"all passed: {all(r['verdict'] == 'passed' for r in rows)})"
    )


if __name__ == "__main__":
    raise SystemExit(main())
