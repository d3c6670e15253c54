"""Shared plumbing for the benchmarks: a bench database, Django set-up, the dev cluster,
seeding and small statistics helpers. Not a test; nothing here runs in CI.

Databases: SQLite files under ``var/bench/`` or PostgreSQL databases named
``gantry_bench_*`` on 127.0.0.1 (trust auth, user postgres). Never any other database.
"""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / "var" / "bench"
PG_HOST = "127.0.0.1"
PG_PORT = "5432"
PG_USER = "postgres"
# Benches that use the dev cluster or a Celery worker run under ``flock LOCK``.
LOCK = "/tmp/gantry-devcluster.lock"
BENCH_NAME = re.compile(r"gantry_bench[a-z0-9_]*")

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
if str(REPO / "tests") not in sys.path:
    sys.path.append(str(REPO / "tests"))


# ---------------------------------------------------------------- databases


def pg_url(name: str) -> str:
    return f"postgres://{PG_USER}@{PG_HOST}:{PG_PORT}/{name}"


def sqlite_url(name: str) -> str:
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{BENCH_DIR / (name + '.sqlite3')}"


def _check_bench_name(name: str) -> None:
    # Letters, digits and underscores only: the name also travels into psql and dropdb.
    if not BENCH_NAME.fullmatch(name):
        raise SystemExit(f"refusing to touch database {name!r}: bench databases are gantry_bench*")


def _psql(database: str, script: str, /, *, check: bool = True, **variables: str) -> str:
    """``script`` run by psql on ``database``; ``variables`` are psql variables that the
    script quotes itself (``:'name'``), so no value is ever pasted into SQL here."""
    argv = ["psql", "-h", PG_HOST, "-p", PG_PORT, "-U", PG_USER, "-tA"]
    for key, value in variables.items():
        argv += ["-v", f"{key}={value}"]
    done = subprocess.run(
        [*argv, database], input=script, check=check, capture_output=True, text=True
    )
    return done.stdout.strip()


def pg_create(name: str, *, fresh: bool = True) -> None:
    _check_bench_name(name)
    base = ["-h", PG_HOST, "-p", PG_PORT, "-U", PG_USER]
    if fresh:
        subprocess.run(["dropdb", *base, "--if-exists", "--force", name], check=True)
    exists = _psql("postgres", "select 1 from pg_database where datname = :'name'", name=name)
    if not exists:
        subprocess.run(["createdb", *base, name], check=True)


def pg_drop(name: str) -> None:
    _check_bench_name(name)
    subprocess.run(
        ["dropdb", "-h", PG_HOST, "-p", PG_PORT, "-U", PG_USER, "--if-exists", "--force", name],
        check=False,
    )


def pg_terminate_backends(name: str) -> None:
    """End the queries still running in bench database ``name`` (a killed web worker's query
    goes on in PostgreSQL until it ends)."""
    _check_bench_name(name)
    _psql(
        "postgres",
        "select pg_terminate_backend(pid) from pg_stat_activity "
        "where datname = :'name' and pid <> pg_backend_pid()",
        check=False,
        name=name,
    )


def sqlite_remove(name: str) -> None:
    path = BENCH_DIR / (name + ".sqlite3")
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def bench_database(engine: str, stem: str) -> tuple[str, str]:
    """A fresh, empty bench database: PostgreSQL ``gantry_bench_<stem>`` when ``engine`` is
    ``postgres``, else SQLite ``var/bench/<stem>.sqlite3``. Returns its name and URL."""
    if engine == "postgres":
        name = f"gantry_bench_{stem}"
        pg_create(name)
        return name, pg_url(name)
    sqlite_remove(stem)
    return stem, sqlite_url(stem)


def bench_database_drop(engine: str, name: str) -> None:
    """Remove what ``bench_database`` made."""
    if engine == "postgres":
        pg_drop(name)
    else:
        sqlite_remove(name)


def bench_env(database_url: str) -> dict[str, str]:
    """Environment for Django (this process or a child: worker, beat, gunicorn).

    PostgreSQL JIT is off for bench connections (libpq reads PGOPTIONS) unless
    GANTRY_BENCH_PG_JIT=on: with JIT on, the overview's one-OR-branch-per-running-job query
    at 2,500 running jobs kept LLVM compiling for over 20 minutes in backends that ignore
    pg_terminate_backend, and every DROP DATABASE on the server waited for them.
    """
    jit = os.environ.get("GANTRY_BENCH_PG_JIT", "off")
    return {
        "PGOPTIONS": f"-c jit={'on' if jit == 'on' else 'off'}",
        "DJANGO_SETTINGS_MODULE": "controlplane.settings_test",
        "DATABASE_URL": database_url,
        "GANTRY_DATA_DIR": str(BENCH_DIR / "data"),
        # A Redis database and key prefix of our own: never the tests' or dev server's.
        "REDIS_URL": "redis://127.0.0.1:6379/12",
        "GANTRY_TEST_RUN_ID": f"bench{os.getpid()}",
    }


def django_setup(database_url: str, *, migrate: bool = True) -> None:
    os.environ.update(bench_env(database_url))
    import django

    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)


def db_vendor() -> str:
    from django.db import connection

    return connection.vendor


# ---------------------------------------------------------------- statistics and ports


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, round(q * len(ordered) + 0.5) - 1))
    return ordered[index]


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(rows: list[list[Any]], header: list[str]) -> str:
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for n, row in enumerate(cells):
        lines.append(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- dev cluster


def devcluster() -> Any:
    from devcluster_support import ensure_up

    return ensure_up()


def register_devcluster(dc: Any, *, sync: bool = True) -> Any:
    """The dev cluster registered in the bench database (as the tests' fixture does)."""
    from nodes.models import Cluster
    from nodes.registration import cluster_register
    from nodes.sync import cluster_sync
    from slurm.transport import close_all

    existing = Cluster.objects.filter(name="devcluster").first()
    if existing is not None:
        if existing.user_ca_public_key:
            dc.trust_user_ca(existing.user_ca_public_key)
        return existing
    close_all()
    registration = cluster_register(
        actor=None,
        name="devcluster",
        ssh_host=dc.host,
        ssh_port=dc.port,
        ssh_user=dc.user,
        private_key=dc.key.read_text(),
        workdir=dc.workdir,
        python=dc.python,
        expected_fingerprint=dc.host_fingerprint,
        is_default=True,
        sync=False,
    )
    if sync:
        assert cluster_sync(cluster_id=registration.cluster.pk).ok
    # Jobs run as the researcher: the dev sshd trusts the cluster's user CA.
    dc.trust_user_ca(registration.cluster.user_ca_public_key)
    return registration.cluster


def map_account(cluster: Any, user: Any, account: str) -> None:
    """``user``'s work on ``cluster`` runs as the dev cluster's Unix user ``account``."""
    from nodes.access.identities import cluster_identity_set

    cluster_identity_set(actor=None, cluster=cluster, user=user, account=account)


def submit_held_jobs(transport: Any, dc: Any, count: int, *, name: str) -> list[str]:
    """``count`` real Slurm jobs held in the queue (``sbatch --hold``: PENDING, no resources
    used) as the cluster user, in one remote command; returns their Slurm job ids."""
    script = (
        f"cd {dc.workdir} && for i in $(seq 1 {count}); do "
        f"sbatch --hold --parsable -J {name} -p {dc.default_partition} "
        "-t 5 -o /dev/null --wrap 'sleep 120' || exit 1; done"
    )
    output = transport.exec_shell(script, timeout=600).stdout
    ids = [line.split(";")[0].strip() for line in output.split() if line.strip()]
    assert len(ids) == count, (len(ids), output[-500:])
    return ids


def cancel_slurm_jobs(transport: Any, ids: list[str]) -> None:
    """scancel by id, in batches; what the bench submitted and nothing else."""
    for i in range(0, len(ids), 200):
        transport.exec(["scancel", *ids[i : i + 200]], check=False)
    if ids:
        print(f"# cancelled {len(ids)} Slurm jobs (scancel by id)")


# ---------------------------------------------------------------- users and seeding


def make_user(username: str, role: str, *, staff: bool = False) -> Any:
    from django.contrib.auth.models import Group, User

    user, _ = User.objects.get_or_create(username=username, defaults={"is_staff": staff})
    user.set_password("bench-password")
    user.save()
    user.groups.add(Group.objects.get(name=role))
    return user


def seed(
    *,
    jobs: int,
    metric_jobs: int,
    points_per_job: int,
    nodes: int = 0,
    users: int = 4,
    clusters: int = 2,
    say: Callable[[str], object] = print,
) -> dict[str, Any]:
    """``jobs`` Job rows across ``users`` researchers and ``clusters`` clusters (bulk_create),
    ``points_per_job`` metric points for each of ``metric_jobs`` of them (raw batch insert:
    COPY on PostgreSQL, executemany on SQLite) and ``nodes`` nodes with 2 GPUs each."""
    from django.db import connection

    from jobs.models import Job

    started = time.perf_counter()
    owners = [make_user(f"bench-user-{i}", "researchers") for i in range(users)]
    operator = make_user("bench-operator", "operators", staff=True)
    cluster_rows = _seed_clusters(clusters)
    _seed_jobs(jobs, owners, cluster_rows)
    t_jobs = time.perf_counter() - started
    # The metric jobs: the newest running ones of user 0 (visible on their pages).
    metric_job_ids = list(
        Job.objects.filter(owner=owners[0])
        .order_by("-created_at")
        .values_list("id", flat=True)[:metric_jobs]
    )
    t0 = time.perf_counter()
    insert_metric_points(metric_job_ids, points_per_job)
    t_points = time.perf_counter() - t0
    t0 = time.perf_counter()
    if nodes:
        _seed_nodes(cluster_rows[0], nodes)
    t_nodes = time.perf_counter() - t0
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    say(
        f"# seeded {jobs} jobs in {t_jobs:.1f} s, {len(metric_job_ids) * points_per_job} metric "
        f"points in {t_points:.1f} s, {nodes} nodes in {t_nodes:.1f} s ({connection.vendor})"
    )
    return {
        "owners": owners,
        "operator": operator,
        "metric_job_ids": metric_job_ids,
        "clusters": cluster_rows,
    }


def _seed_clusters(count: int) -> list[Any]:
    """``count`` clusters nobody can reach (the web benches never talk to a cluster)."""
    from nodes.models import Cluster

    rows = []
    for i in range(count):
        cluster, _ = Cluster.objects.get_or_create(
            name=f"benchcluster{i}",
            defaults={
                "ssh_host": "127.0.0.1",
                "ssh_port": 1 + i,
                "ssh_user": "nobody",
                "workdir": "/nonexistent",
                "default_partition": "batch",
                "is_default": i == 0,
            },
        )
        rows.append(cluster)
    return rows


# Six in ten jobs completed, one each failed, cancelled, running and pending.
SEED_STATES = ["completed"] * 6 + ["failed", "cancelled", "running", "pending"]


def _seed_jobs(count: int, owners: list[Any], clusters: list[Any]) -> None:
    """``count`` jobs, one second apart, newest last, in batches of 5,000."""
    from django.db import transaction
    from django.db.models import F

    from jobs.models import Job

    now = datetime.now(tz=UTC)
    batch: list[Job] = []
    with transaction.atomic():
        for i in range(count):
            batch.append(_seed_job(i, now - timedelta(seconds=count - i), owners, clusters))
            if len(batch) >= 5000:
                Job.objects.bulk_create(batch)
                batch = []
        if batch:
            Job.objects.bulk_create(batch)
        # created_at is auto_now_add: spread it so "newest first" pages are meaningful.
        Job.objects.filter(owner__in=owners).update(created_at=F("submitted_at"))


def _seed_job(i: int, created: datetime, owners: list[Any], clusters: list[Any]) -> Any:
    from jobs.models import Job

    state = SEED_STATES[i % len(SEED_STATES)]
    return Job(
        owner=owners[i % len(owners)],
        cluster=clusters[i % len(clusters)],
        name=f"bench-job-{i:06d}",
        config={"preset": "tiny", "steps": 100},
        nodes=1,
        tasks_per_node=1,
        partition="batch",
        state=state,
        slurm_job_id=str(100000 + i),
        total_steps=100,
        last_step=100 if state == "completed" else 50,
        files_final=state not in ("running", "pending"),
        submitted_at=created,
        started_at=created if state != "pending" else None,
        ended_at=created if state in ("completed", "failed", "cancelled") else None,
        exit_code=0 if state == "completed" else (1 if state == "failed" else None),
    )


def _seed_nodes(cluster: Any, count: int) -> None:
    """``count`` nodes (32 a leaf switch, one in five allocated) with 2 GPUs each."""
    from nodes.models import Gpu, Node, Switch

    leaves = [
        Switch.objects.get_or_create(cluster=cluster, name=f"leaf{i}")[0]
        for i in range(max(1, count // 32))
    ]
    node_objs = [
        Node(
            cluster=cluster,
            name=f"bn{i:05d}",
            state="idle" if i % 5 else "allocated",
            cpus_total=64,
            memory_mb=512000,
            partitions=["batch"],
            partitions_text=",batch,",
            leaf_switch=leaves[i % len(leaves)],
        )
        for i in range(count)
    ]
    Node.objects.bulk_create(node_objs, batch_size=2000)
    node_ids = list(Node.objects.filter(cluster=cluster).values_list("id", flat=True))
    Gpu.objects.bulk_create(
        [
            Gpu(node_id=nid, index=g, gpu_type="h100", state="allocated" if g else "idle")
            for nid in node_ids
            for g in range(2)
        ],
        batch_size=5000,
    )


METRIC_COLUMNS = [
    "job_id",
    "step",
    "wall_time",
    "elapsed_s",
    "loss",
    "samples_per_s",
    "tokens_per_s",
    "step_time_s",
    "data_time_s",
    "checkpoint_blocking_s",
    "world_size",
]
METRIC_BASE_TIME = datetime(2025, 1, 1, tzinfo=UTC).timestamp()


def _metric_values(step: int) -> tuple[Any, ...]:
    """One point's columns after ``job_id`` and ``step``: a falling loss, steady rates."""
    wall = datetime.fromtimestamp(METRIC_BASE_TIME + step * 0.1, tz=UTC)
    return (wall, step * 0.1, 5.0 / (1 + step * 0.001), 400.0, 25600.0, 0.1, 0.01, 0.0, 1)


def insert_metric_points(job_ids: list[Any], points_per_job: int) -> None:
    """``points_per_job`` points for each job, straight into the table (no ingest)."""
    from django.db import connection

    for job_id in job_ids:
        if connection.vendor == "postgresql":
            _copy_points(job_id, points_per_job)
        else:
            _insert_points(job_id, points_per_job)


def _copy_points(job_id: Any, points_per_job: int) -> None:
    """PostgreSQL: one COPY per job."""
    from django.db import connection, transaction

    from jobs.models import MetricPoint

    copy_sql = f"COPY {MetricPoint._meta.db_table} ({', '.join(METRIC_COLUMNS)}) FROM STDIN"
    with (
        transaction.atomic(),
        connection.cursor() as cursor,
        cursor.cursor.copy(copy_sql) as copy,
    ):
        for step in range(points_per_job):
            copy.write_row((job_id, step, *_metric_values(step)))


def _insert_points(job_id: Any, points_per_job: int) -> None:
    """Other databases (SQLite): Django's bulk_create. No bench seeds points on SQLite today;
    the PostgreSQL COPY above is the path the web bench's figures depend on."""
    from jobs.models import MetricPoint

    fields = METRIC_COLUMNS[2:]
    MetricPoint.objects.bulk_create(
        (
            MetricPoint(
                job_id=job_id,
                step=step,
                **dict(zip(fields, _metric_values(step), strict=True)),
            )
            for step in range(points_per_job)
        ),
        batch_size=5000,
    )


# ---------------------------------------------------------------- fault trials


def fault_trials(
    test_path: str,
    trials_file: Path,
    summarize: Callable[[list[dict[str, Any]]], str],
    *,
    env: dict[str, str] | None,
    fresh: bool,
) -> int:
    """Run the fault test ``test_path`` on the dev cluster (``scripts/test``) with ``env``
    (None: only print), then print ``summarize`` of every trial ``trials_file`` holds."""
    if env is not None:
        if fresh and trials_file.exists():
            trials_file.unlink()
        done = subprocess.run(
            [str(REPO / "scripts" / "test"), "-q", test_path],
            env={**os.environ, "GANTRY_FAULTS_FULL": "1", **env},
            check=False,
        )
        if done.returncode != 0:
            print(f"the fault tests failed (exit {done.returncode}); figures below are partial")
    if not trials_file.exists():
        print(f"no trials recorded yet ({trials_file})")
        return 1
    records = [json.loads(line) for line in trials_file.read_text().splitlines() if line.strip()]
    print(summarize(records))
    return 0
