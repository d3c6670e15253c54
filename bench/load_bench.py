"""Web and API under concurrent load: gunicorn + PostgreSQL on 127.0.0.1.

    .venv/bin/python bench/load_bench.py [--quick] [--seconds 60] [--clients 50] \
        [--workers 4] [--reuse] [--keep]

Seeds PostgreSQL database gantry_bench_load (10k nodes with 2 GPUs each, 100k jobs over 4
researchers and 2 clusters, 1M metric points = 10 jobs x 100k; --reuse keeps an already
seeded one), collects static files, starts ``gunicorn controlplane.wsgi -w 4`` on a free
127.0.0.1 port with production settings (DEBUG=false, SECRET_KEY, ALLOWED_HOSTS=127.0.0.1,
GANTRY_TLS=false), then drives N concurrent clients (threads, http.client keep-alive where
the server keeps the connection) for a bounded time. Each client is a researcher who owns
the metric jobs; pages use a session cookie, the API a token. Each client loops over:
overview ``/``, job list ``/jobs/``, job detail page ``/jobs/<id>/`` (a 100k-point job),
its metrics API ``/api/v1/jobs/<id>/metrics/`` (what the page's charts fetch), and the API
job list ``/api/v1/jobs/?page_size=50``. Prints per endpoint: requests/s, p50/p95/p99,
errors (goal: 0 errors, p95 <= 250 ms). Then profiles the slowest endpoint in-process
(cProfile over a few requests, SQL query count). Stops gunicorn by its pid.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import http.client
import io
import os
import pstats
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as lib

DB = "gantry_bench_load"
SECRET = "bench-load-secret-key-not-for-production-0123456789abcdef"
GOAL_P95_MS = 250.0
KEYS = {
    "overview": "overview /",
    "jobs": "page /jobs/",
    "detail": "page job detail",
    "metrics": "api metrics (100k pts)",
    "apijobs": "api jobs page_size=50",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="15 s of load")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--reuse", action="store_true", help="reuse a seeded gantry_bench_load")
    parser.add_argument("--keep", action="store_true", help="keep the database")
    parser.add_argument("--dbname", default=DB, help="a gantry_bench* PostgreSQL database")
    parser.add_argument(
        "--endpoints",
        default="overview,jobs,detail,metrics,apijobs",
        help="subset of overview,jobs,detail,metrics,apijobs",
    )
    args = parser.parse_args()
    seconds = args.seconds or (15.0 if args.quick else 60.0)
    db = args.dbname
    started_all = time.perf_counter()

    os.environ["SECRET_KEY"] = SECRET  # the same key as gunicorn: session hashes must agree
    reuse = False
    if args.reuse:
        lib.pg_create(db, fresh=False)
    else:
        lib.pg_create(db)
    lib.django_setup(lib.pg_url(db))
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from rest_framework.authtoken.models import Token

    from jobs.models import Job, MetricPoint

    if (
        args.reuse
        and Job.objects.count() >= args.jobs
        and MetricPoint.objects.count() >= args.points
    ):
        reuse = True
        owner = User.objects.get(username="bench-user-0")
        metric_jobs = list(MetricPoint.objects.values_list("job_id", flat=True).distinct())
        print(f"# reusing {db}: {Job.objects.count()} jobs, {MetricPoint.objects.count()} points")
    else:
        seeded = lib.seed(
            jobs=args.jobs,
            metric_jobs=args.points // 100_000,
            points_per_job=100_000,
            nodes=args.nodes,
        )
        owner = seeded["owners"][0]
        metric_jobs = seeded["metric_job_ids"]
        Job.objects.filter(id__in=metric_jobs[:3]).update(state="running", files_final=False)
    token = Token.objects.get_or_create(user=owner)[0].key
    sessions = []
    for _ in range(args.clients):
        c = Client()
        c.force_login(owner)
        sessions.append(c.cookies[settings.SESSION_COOKIE_NAME].value)
    counts = {
        "jobs": Job.objects.count(),
        "points": MetricPoint.objects.count(),
        "nodes": __import__("nodes.models", fromlist=["Node"]).Node.objects.count(),
    }
    connection.close()

    static_root = lib.BENCH_DIR / "static"
    env = dict(os.environ)
    for key in ("DJANGO_SETTINGS_MODULE", "GANTRY_TEST_RUN_ID"):
        env.pop(key, None)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "DEBUG": "false",
            "SECRET_KEY": SECRET,
            "ALLOWED_HOSTS": "127.0.0.1",
            "GANTRY_TLS": "false",
            "DATABASE_URL": lib.pg_url(db),
            "GANTRY_DATA_DIR": str(lib.BENCH_DIR / "data"),
            "GANTRY_STATIC_ROOT": str(static_root),
            "REDIS_URL": "redis://127.0.0.1:6379/12",
            "GANTRY_LOG_LEVEL": "WARNING",
        }
    )
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
        cwd=lib.REPO,
        env=env,
        check=True,
    )
    port = free_port()
    log = (lib.BENCH_DIR / "gunicorn.log").open("wb")
    gunicorn = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "gunicorn"),
            "controlplane.wsgi",
            "-w",
            str(args.workers),
            "-b",
            f"127.0.0.1:{port}",
            "--timeout",
            "60",
            "--log-level",
            "warning",
        ],
        cwd=lib.REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the workers go with the master
    )
    print(f"# gunicorn pid {gunicorn.pid}: {args.workers} sync workers on 127.0.0.1:{port}")
    results: dict[str, list[float]] = {}
    errors: dict[str, int] = {}
    error_samples: list[str] = []
    lock = threading.Lock()
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/accounts/login/")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or gunicorn.poll() is not None:
                raise SystemExit("gunicorn did not come up; see var/bench/gunicorn.log")
            time.sleep(0.3)

        chosen = [KEYS[k] for k in args.endpoints.split(",")]

        def endpoints(rng: random.Random) -> list[tuple[str, str, dict[str, str]]]:
            job = rng.choice(metric_jobs)
            every = [
                ("overview /", "/", {}),
                ("page /jobs/", "/jobs/", {}),
                ("page job detail", f"/jobs/{job}/", {}),
                (
                    "api metrics (100k pts)",
                    f"/api/v1/jobs/{job}/metrics/",
                    {"Authorization": f"Token {token}"},
                ),
                (
                    "api jobs page_size=50",
                    "/api/v1/jobs/?page_size=50",
                    {"Authorization": f"Token {token}"},
                ),
            ]
            return [e for e in every if e[0] in chosen]

        stop_at = [0.0]

        def client(index: int) -> None:
            rng = random.Random(index)
            cookie = f"{settings.SESSION_COOKIE_NAME}={sessions[index]}"
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            local: dict[str, list[float]] = {}
            local_err: dict[str, int] = {}
            turn = index  # clients start at different endpoints
            while time.monotonic() < stop_at[0]:
                mix = endpoints(rng)
                name, path, headers = mix[turn % len(mix)]
                turn += 1
                headers = (
                    {**headers, "Cookie": cookie} if "Authorization" not in headers else headers
                )
                t = time.perf_counter()
                try:
                    conn.request("GET", path, headers=headers)
                    response = conn.getresponse()
                    response.read()
                    ok = response.status == 200
                    if response.getheader("Connection", "").lower() == "close":
                        conn.close()
                    detail = f"{name}: HTTP {response.status}"
                except (OSError, http.client.HTTPException) as error:
                    ok = False
                    detail = f"{name}: {type(error).__name__} {error}"
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                elapsed = (time.perf_counter() - t) * 1000
                if ok:
                    local.setdefault(name, []).append(elapsed)
                else:
                    local_err[name] = local_err.get(name, 0) + 1
                    with lock:
                        if len(error_samples) < 5:
                            error_samples.append(detail)
                    if time.monotonic() > stop_at[0]:
                        break
            conn.close()
            with lock:
                for k, v in local.items():
                    results.setdefault(k, []).extend(v)
                for k, v in local_err.items():
                    errors[k] = errors.get(k, 0) + v

        # Warm-up: 3 s with a few clients (connections, worker imports), not counted.
        stop_at[0] = time.monotonic() + 3
        warm = [threading.Thread(target=client, args=(i,)) for i in range(5)]
        for t in warm:
            t.start()
        for t in warm:
            t.join()
        results.clear()
        errors.clear()
        error_samples.clear()
        stop_at[0] = time.monotonic() + seconds
        load_started = time.perf_counter()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=seconds + 60)
        wall = time.perf_counter() - load_started
    finally:
        # The group we started (master + workers), by the master's pid: a worker stuck in a
        # slow request must not outlive the bench.
        os.killpg(gunicorn.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            gunicorn.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(gunicorn.pid, signal.SIGKILL)
        gunicorn.wait(timeout=10)
        log.close()
        # Queries the workers left running in the bench database (a killed worker's query
        # goes on in PostgreSQL until it ends): cancel them.
        subprocess.run(
            [
                "psql",
                "-h",
                lib.PG_HOST,
                "-U",
                lib.PG_USER,
                "-tAc",
                "select pg_terminate_backend(pid) from pg_stat_activity where "
                f"datname = '{db}' and pid <> pg_backend_pid()",
                "postgres",
            ],
            capture_output=True,
            check=False,
        )
        print(f"# gunicorn {gunicorn.pid} stopped (rc {gunicorn.returncode})")

    names = [KEYS[k] for k in args.endpoints.split(",")]
    rows = []
    all_times: list[float] = []
    total_err = 0
    for name in names:
        times = results.get(name, [])
        all_times += times
        total_err += errors.get(name, 0)
        rows.append(
            [
                name,
                len(times),
                f"{len(times) / wall:.1f}",
                f"{lib.med(times):.0f}",
                f"{lib.pct(times, 0.95):.0f}",
                f"{lib.pct(times, 0.99):.0f}",
                errors.get(name, 0),
            ]
        )
    rows.append(
        [
            "all",
            len(all_times),
            f"{len(all_times) / wall:.1f}",
            f"{lib.med(all_times):.0f}",
            f"{lib.pct(all_times, 0.95):.0f}",
            f"{lib.pct(all_times, 0.99):.0f}",
            total_err,
        ]
    )
    load = os.getloadavg()
    print(
        f"\n# load bench: endpoints {args.endpoints}; {args.clients} clients x {wall:.0f} s "
        f"against gunicorn -w {args.workers} (sync) + PostgreSQL; {counts['nodes']} nodes, "
        f"{counts['jobs']} jobs, "
        f"{counts['points']} metric points{' (reused)' if reuse else ''}; {os.cpu_count()} "
        f"cores, load average {load[0]:.1f} after the run; client threads share the cores"
    )
    print(
        lib.table(rows, ["endpoint", "requests", "req/s", "p50 ms", "p95 ms", "p99 ms", "errors"])
    )
    if error_samples:
        print("error samples: " + " | ".join(error_samples))
    worst = max(rows[:-1], key=lambda r: float(r[4]) if r[4] != "nan" else 0)
    p95_all = float(rows[-1][4])
    print(
        f"goal 0 errors: {'MET' if total_err == 0 else f'NOT MET ({total_err})'}; "
        f"goal p95 <= {GOAL_P95_MS:.0f} ms: {'MET' if p95_all <= GOAL_P95_MS else 'NOT MET'} "
        f"(all {p95_all:.0f} ms; worst endpoint {worst[0]} p95 {worst[4]} ms)"
    )

    # Where the time goes: each endpoint in-process, unloaded (median of 5, SQL count), and
    # a cProfile of the slowest one.
    connection.connect()
    c = Client()
    c.force_login(owner)
    job = metric_jobs[0]
    every_path = {
        "overview /": "/",
        "page /jobs/": "/jobs/",
        "page job detail": f"/jobs/{job}/",
        "api metrics (100k pts)": f"/api/v1/jobs/{job}/metrics/",
        "api jobs page_size=50": "/api/v1/jobs/?page_size=50",
    }
    paths = {name: every_path[name] for name in names}
    solo = []
    slow_ms = {}
    for name, path in paths.items():
        t = time.perf_counter()
        c.get(path)
        first = (time.perf_counter() - t) * 1000
        times = []
        for _ in range(5 if first < 5000 else 1):
            with CaptureQueriesContext(connection) as q:
                t = time.perf_counter()
                c.get(path)
                times.append((time.perf_counter() - t) * 1000)
        sql_ms = sum(float(x["time"]) for x in q.captured_queries) * 1000
        slow_ms[name] = lib.med(times)
        solo.append([name, f"{lib.med(times):.0f}", len(q.captured_queries), f"{sql_ms:.0f}"])
    print("\nunloaded, in-process (same database): median of 5")
    print(lib.table(solo, ["endpoint", "ms", "SQL queries", "SQL ms (last request)"]))
    slowest = worst[0]
    profile = cProfile.Profile()
    profile.enable()
    reps = 3 if slow_ms.get(slowest, 0) < 5000 else 1
    for _ in range(reps):
        c.get(paths[slowest])
    profile.disable()
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out).sort_stats("cumulative")
    stats.print_stats(r"(jobs|controlplane|nodes)/|execute\b|render\b|json", 14)
    print(f"\ncProfile of {reps} request(s) to the slowest endpoint ({slowest}), project frames:")
    print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[-3000:])
    connection.close()
    if not args.keep:
        lib.pg_drop(db)
    print(f"total {time.perf_counter() - started_all:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
