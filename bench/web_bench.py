"""The web tier at fleet scale, driven by a compiled load generator (wrk), today's code
against a baseline commit, side by side on the same PostgreSQL database.

    .venv/bin/python bench/web_bench.py [--quick] [--baseline 1d0a024] [--reuse] [--keep]
        [--workers 4] [--seconds 20] [--levels 2,4,8,16,32,64]

Seeds PostgreSQL database gantry_bench_web (10k nodes with 2 GPUs each, 100k jobs over 50
researchers and 2 clusters, 1M metric points = 10 running jobs x 100k; ``--reuse`` keeps a
seeded one), exports the baseline commit with ``git archive`` under var/bench/, and for each
tree (baseline, then this working tree) starts ``gunicorn controlplane.wsgi -w N`` (sync
workers, production settings, DEBUG off) on a free 127.0.0.1 port and measures:

1. **Unloaded**: one connection, no think time, per endpoint (overview, job page, the job
   page's two polls: status partial and metrics API, API job list): mean and p95 latency.
   In-process with Django's test client (this tree only): SQL queries per request.
2. **Realistic load** (open loop through think time): 50 researchers each polling their
   running job's page every 3 s (the status partial and the metrics API, as the page's
   poller does) and 5 API clients listing jobs every second. One wrk thread per client,
   so each client keeps its own state; two wrk processes, so each group has its own p95.
   Goal: p95 <= 250 ms, 0 errors.
3. **Capacity**: closed loop, the same request mix without think time, at increasing
   connection counts; the highest request rate at which p95 stays <= 250 ms. Goal: >= 3x
   the baseline's.

wrk (Debian package ``wrk``) runs on the same 2 cores as the server; it is compiled and
uses a small fraction of a core. Stops every gunicorn it started by pid.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as lib

DB = "gantry_bench_web"
SECRET = "bench-web-secret-key-not-for-production-0123456789abcdef"
GOAL_P95_MS = 250.0
RESEARCHERS = 50
API_CLIENTS = 5

# One Lua script for every run. Each wrk thread has one connection and its own Lua state:
# thread i takes client i's requests (a cycle of paths with its headers) and think times.
LUA = r"""
local clients = {}
local counter = 0
local think = tonumber(os.getenv("BENCH_THINK_MS") or "0")
local role = os.getenv("BENCH_ROLE")

function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
end

function init(args)
  local plan = {}
  for line in io.lines(os.getenv("BENCH_PLAN")) do table.insert(plan, line) end
  -- a plan line: "cookie|token<TAB>path1<TAB>path2..."
  local mine = plan[(id % #plan) + 1]
  local fields = {}
  for field in string.gmatch(mine, "[^\t]+") do table.insert(fields, field) end
  auth = fields[1]
  paths = {}
  for i = 2, #fields do table.insert(paths, fields[i]) end
  step = 0
  headers = {}
  if string.sub(auth, 1, 6) == "Token " then
    headers["Authorization"] = auth
  else
    headers["Cookie"] = auth
  end
end

function request()
  step = step + 1
  local path = paths[((step - 1) % #paths) + 1]
  return wrk.format("GET", path, headers)
end

function delay()
  -- think time after the last request of the cycle (a page's poll is its requests at once)
  if think > 0 and step % #paths == 0 then return think end
  return 0
end

function done(summary, latency, requests)
  local out = string.format(
    '{"role": "%s", "requests": %d, "duration_us": %d, "p50_ms": %.2f, "p95_ms": %.2f, ' ..
    '"p99_ms": %.2f, "mean_ms": %.2f, "max_ms": %.2f, "errors": {"connect": %d, ' ..
    '"read": %d, "write": %d, "status": %d, "timeout": %d}}',
    role, summary.requests, summary.duration, latency:percentile(50) / 1000,
    latency:percentile(95) / 1000, latency:percentile(99) / 1000, latency.mean / 1000,
    latency.max / 1000, summary.errors.connect, summary.errors.read, summary.errors.write,
    summary.errors.status, summary.errors.timeout)
  local f = io.open(os.getenv("BENCH_OUT"), "w")
  f:write(out)
  f:close()
end
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def seed_or_reuse(args: argparse.Namespace) -> dict[str, Any]:
    """The bench database and what the clients need: session cookies, tokens, job ids."""
    os.environ["SECRET_KEY"] = SECRET  # gunicorn uses the same key: sessions must verify
    lib.pg_create(DB, fresh=not args.reuse)
    lib.django_setup(lib.pg_url(DB))
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from rest_framework.authtoken.models import Token

    from jobs.models import Job, MetricPoint
    from nodes.models import Node

    if not (args.reuse and MetricPoint.objects.count() >= args.points):
        lib.seed(
            jobs=args.jobs,
            metric_jobs=args.points // 100_000,
            points_per_job=100_000,
            nodes=args.nodes,
            users=RESEARCHERS,
        )
    owner = User.objects.get(username="bench-user-0")
    metric_jobs = [
        str(j)
        for j in MetricPoint.objects.values_list("job_id", flat=True).distinct().order_by("job_id")
    ]
    Job.objects.filter(id__in=metric_jobs).update(state="running", files_final=False)
    cookies = []
    for _ in range(RESEARCHERS):
        client = Client()
        client.force_login(owner)
        cookies.append(
            f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
        )
    token = Token.objects.get_or_create(user=owner)[0].key
    counts = {
        "jobs": Job.objects.count(),
        "points": MetricPoint.objects.count(),
        "nodes": Node.objects.count(),
    }
    connection.close()
    return {"cookies": cookies, "token": token, "metric_jobs": metric_jobs, "counts": counts}


def endpoints(job: str) -> dict[str, str]:
    return {
        "overview": "/",
        "job page": f"/jobs/{job}/",
        "job status poll": f"/jobs/{job}/status/",
        "job metrics poll": f"/api/v1/jobs/{job}/metrics/",
        "api job list": "/api/v1/jobs/?page_size=50",
    }


def server_env(tree: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DJANGO_SETTINGS_MODULE", "GANTRY_TEST_RUN_ID")
    }
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "DEBUG": "false",
            "SECRET_KEY": SECRET,
            "ALLOWED_HOSTS": "127.0.0.1",
            "GANTRY_TLS": "false",
            "DATABASE_URL": lib.pg_url(DB),
            "GANTRY_DATA_DIR": str(lib.BENCH_DIR / "data"),
            "GANTRY_STATIC_ROOT": str(lib.BENCH_DIR / f"static-{tree.name}"),
            "REDIS_URL": "redis://127.0.0.1:6379/12",
            "GANTRY_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(tree),
            "PGOPTIONS": "-c jit=off",
        }
    )
    return env


class Server:
    def __init__(self, tree: Path, workers: int) -> None:
        self.tree, self.port = tree, free_port()
        env = server_env(tree)
        subprocess.run(
            [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
            cwd=tree,
            env=env,
            check=True,
        )
        self.log = (lib.BENCH_DIR / f"gunicorn-{tree.name}.log").open("wb")
        gunicorn = str(Path(sys.executable).parent / "gunicorn")
        argv = [gunicorn, "controlplane.wsgi", "-w", str(workers), "-b", f"127.0.0.1:{self.port}"]
        argv += ["--timeout", "60", "--log-level", "warning"]
        self.process = subprocess.Popen(
            argv,
            cwd=tree,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the workers go with the master
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/accounts/login/", timeout=5
                ) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise SystemExit(f"gunicorn for {tree} did not come up; see {self.log.name}")
            time.sleep(0.3)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()


def wrk(
    port: int,
    work: Path,
    role: str,
    plan: list[str],
    *,
    connections: int,
    seconds: float,
    think_ms: int = 0,
) -> subprocess.Popen[bytes]:
    script, plan_file, out = work / "bench.lua", work / f"{role}.plan", work / f"{role}.json"
    script.write_text(LUA)
    plan_file.write_text("\n".join(plan) + "\n")
    out.unlink(missing_ok=True)
    env = dict(
        os.environ,
        BENCH_PLAN=str(plan_file),
        BENCH_OUT=str(out),
        BENCH_ROLE=role,
        BENCH_THINK_MS=str(think_ms),
    )
    argv = [
        "wrk",
        f"-t{connections}",
        f"-c{connections}",
        f"-d{int(seconds)}s",
        "--timeout",
        "10s",
        "-s",
        str(script),
        f"http://127.0.0.1:{port}",
    ]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wrk_result(proc: subprocess.Popen[bytes], work: Path, role: str) -> dict[str, Any]:
    _, err = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"wrk {role} failed: {err.decode()[-1000:]}")
    result = json.loads((work / f"{role}.json").read_text())
    result["rate"] = result["requests"] / (result["duration_us"] / 1e6)
    result["error_count"] = sum(result["errors"].values())
    return result


def measure_tree(
    name: str, tree: Path, data: dict[str, Any], args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    server = Server(tree, args.workers)
    print(
        f"# {name}: gunicorn pid {server.process.pid}, {args.workers} sync workers, "
        f"port {server.port}",
        flush=True,
    )
    out: dict[str, Any] = {"unloaded": {}, "capacity": []}
    cookie, token = data["cookies"][0], f"Token {data['token']}"
    try:
        job = data["metric_jobs"][0]
        for label, path in endpoints(job).items():
            auth = token if path.startswith("/api/") else cookie
            # warm up: caches, connection, templates
            wrk_result(
                wrk(server.port, work, "warm", [f"{auth}\t{path}"], connections=1, seconds=2),
                work,
                "warm",
            )
            got = wrk_result(
                wrk(
                    server.port,
                    work,
                    "unloaded",
                    [f"{auth}\t{path}"],
                    connections=1,
                    seconds=args.unloaded_seconds,
                ),
                work,
                "unloaded",
            )
            out["unloaded"][label] = got
            print(
                f"  unloaded {label}: mean {got['mean_ms']:.1f} ms, p95 {got['p95_ms']:.1f} ms, "
                f"errors {got['error_count']}",
                flush=True,
            )
        # Realistic: researchers poll their job's page every 3 s; API clients list jobs each s.
        jobs = data["metric_jobs"]
        researchers = [
            f"{data['cookies'][i]}\t/jobs/{jobs[i % len(jobs)]}/status/\t"
            f"/api/v1/jobs/{jobs[i % len(jobs)]}/metrics/"
            for i in range(RESEARCHERS)
        ]
        # The metrics poll above goes with the session cookie, as the page's fetch does.
        api = [f"{token}\t/api/v1/jobs/?page_size=50"] * API_CLIENTS
        polls = wrk(
            server.port,
            work,
            "researchers",
            researchers,
            connections=RESEARCHERS,
            seconds=args.seconds,
            think_ms=3000,
        )
        lists = wrk(
            server.port,
            work,
            "api",
            api,
            connections=API_CLIENTS,
            seconds=args.seconds,
            think_ms=1000,
        )
        out["realistic"] = {
            "researchers": wrk_result(polls, work, "researchers"),
            "api": wrk_result(lists, work, "api"),
        }
        for role, got in out["realistic"].items():
            print(
                f"  realistic {role}: {got['rate']:.1f} req/s, p95 {got['p95_ms']:.1f} ms, "
                f"errors {got['error_count']}",
                flush=True,
            )
        # Capacity: the mix without think time at growing concurrency.
        mix = [
            f"{cookie}\t/jobs/{job}/status/\t/api/v1/jobs/{job}/metrics/\t/jobs/{job}/\t/",
            f"{token}\t/api/v1/jobs/?page_size=50",
        ]
        for level in args.levels:
            got = wrk_result(
                wrk(
                    server.port,
                    work,
                    "capacity",
                    mix,
                    connections=level,
                    seconds=args.level_seconds,
                ),
                work,
                "capacity",
            )
            got["connections"] = level
            out["capacity"].append(got)
            print(
                f"  capacity {level} connections: {got['rate']:.1f} req/s, "
                f"p95 {got['p95_ms']:.1f} ms, errors {got['error_count']}",
                flush=True,
            )
            if got["p95_ms"] > 4 * GOAL_P95_MS:
                break
    finally:
        server.stop()
    ok = [c for c in out["capacity"] if c["p95_ms"] <= GOAL_P95_MS and c["error_count"] == 0]
    out["capacity_rate"] = max((c["rate"] for c in ok), default=0.0)
    return out


def query_counts(data: dict[str, Any]) -> dict[str, int]:
    """SQL queries per request in this tree, in-process (Django's test client)."""
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    owner = User.objects.get(username="bench-user-0")
    page = Client()
    page.force_login(owner)
    counts = {}
    for label, path in endpoints(data["metric_jobs"][0]).items():
        page.get(path)  # warm caches as a second request would find them
        with CaptureQueriesContext(connection) as captured:
            response = page.get(path)
        assert response.status_code == 200, (path, response.status_code)
        counts[label] = len(captured.captured_queries)
    connection.close()
    return counts


def export_baseline(rev: str) -> Path:
    target = lib.BENCH_DIR / f"baseline-{rev}"
    if target.exists():
        return target
    tmp = Path(tempfile.mkdtemp(dir=lib.BENCH_DIR))
    archive = subprocess.run(
        ["git", "archive", rev], cwd=lib.REPO, check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(tmp, filter="data")
    tmp.rename(target)
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 s runs, levels 4,16,48")
    parser.add_argument("--baseline", default="1d0a024", help="the commit to compare with")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=None, help="realistic load length")
    parser.add_argument("--levels", default=None, help="capacity connection counts")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--reuse", action="store_true", help="reuse a seeded gantry_bench_web")
    parser.add_argument("--keep", action="store_true", help="keep the database")
    args = parser.parse_args()
    args.seconds = args.seconds or (10.0 if args.quick else 30.0)
    args.level_seconds = 8.0 if args.quick else 15.0
    args.unloaded_seconds = 3.0 if args.quick else 6.0
    args.levels = [
        int(x) for x in (args.levels or ("4,16,48" if args.quick else "2,4,8,16,32,64")).split(",")
    ]
    if shutil.which("wrk") is None:
        print("wrk is missing: apt-get install wrk")
        return 2
    started = time.perf_counter()
    data = seed_or_reuse(args)
    print(f"# database {DB}: {data['counts']}", flush=True)
    queries = query_counts(data)
    work = Path(tempfile.mkdtemp(prefix="web-bench-"))
    results = {}
    try:
        results["baseline"] = measure_tree(
            f"baseline {args.baseline}", export_baseline(args.baseline), data, args, work
        )
        results["now"] = measure_tree("this tree", lib.REPO, data, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not args.keep:
            lib.pg_drop(DB)
    report(results, queries, data, args)
    print(f"total {time.perf_counter() - started:.0f} s; load average {os.getloadavg()[0]:.1f}")
    return 0


def report(
    results: dict[str, Any], queries: dict[str, int], data: dict[str, Any], args: argparse.Namespace
) -> None:
    base, now = results["baseline"], results["now"]
    print(
        f"\n# web bench: {data['counts']['nodes']} nodes, {data['counts']['jobs']} jobs, "
        f"{data['counts']['points']} metric points, PostgreSQL, gunicorn -w {args.workers} (sync), "
        f"wrk 1 thread per connection; baseline {args.baseline} vs this tree, same database, "
        "same run"
    )
    print(
        f"{'unloaded (1 connection)':24} {'baseline mean ms':>17} {'now mean ms':>12} "
        f"{'now p95 ms':>11} {'SQL/request':>12}  goal"
    )
    for label in endpoints("x"):
        b, n = base["unloaded"][label], now["unloaded"][label]
        goal = (
            "<= 25 ms, <= 8 queries"
            if label == "overview"
            else ("<= 10 ms" if "poll" in label else "")
        )
        print(
            f"{label:24} {b['mean_ms']:17.1f} {n['mean_ms']:12.1f} {n['p95_ms']:11.1f} "
            f"{queries[label]:12d}  {goal}"
        )
    print(
        f"\n{'realistic load':24} {'baseline p95 ms':>16} {'now p95 ms':>11} {'now req/s':>10} "
        f"{'now errors':>11}  goal p95 <= {GOAL_P95_MS:.0f} ms, 0 errors"
    )
    for role in ("researchers", "api"):
        b, n = base["realistic"][role], now["realistic"][role]
        verdict = "MET" if n["p95_ms"] <= GOAL_P95_MS and n["error_count"] == 0 else "NOT MET"
        print(
            f"{role:24} {b['p95_ms']:16.1f} {n['p95_ms']:11.1f} {n['rate']:10.1f} "
            f"{n['error_count']:11d}  {verdict}"
        )
    print(
        f"\n{'capacity (closed loop)':24} "
        + " ".join(f"{c['connections']:>9}c" for c in now["capacity"])
    )
    for name, got in (("baseline req/s (p95 ms)", base), ("now req/s (p95 ms)", now)):
        print(
            f"{name:24} "
            + " ".join(f"{c['rate']:5.0f}({c['p95_ms']:4.0f})" for c in got["capacity"])
        )
    if base["capacity_rate"]:
        ratio = now["capacity_rate"] / base["capacity_rate"]
    else:  # the baseline never kept p95 under the goal: no ratio to state
        ratio = float("nan")
    print(
        f"highest rate with p95 <= {GOAL_P95_MS:.0f} ms and 0 errors: baseline "
        f"{base['capacity_rate']:.0f} req/s, now {now['capacity_rate']:.0f} req/s, ratio "
        f"{ratio:.2f} (goal >= 3: {'MET' if ratio >= 3 else 'NOT MET'})"
        + ("" if base["capacity_rate"] else "; the baseline met the p95 goal at no level tried")
    )


if __name__ == "__main__":
    sys.exit(main())
