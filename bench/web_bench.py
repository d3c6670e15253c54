"""The web tier at fleet scale, driven by a compiled load generator (wrk), today's code
against a baseline commit, side by side on the same PostgreSQL database.

    .venv/bin/python bench/web_bench.py [--quick] [--baseline 1d0a024] [--reuse] [--keep]
        [--workers 4] [--seconds 20] [--levels 2,4,8,16,32,64] [--api-etags] [--no-proxy]

Seeds PostgreSQL database gantry_bench_web (10k nodes with 2 GPUs each, 100k jobs over 50
researchers and 2 clusters, 1M metric points = 10 running jobs x 100k; ``--reuse`` keeps a
seeded one; the seed writes points straight into the table, so the job's point sums that
ingest keeps are filled in as ingest would have; a restore drill runs on a checkpoint of
the first of them), then VACUUM ANALYZE, exports the baseline commit with ``git archive``
under var/bench/, and for each tree (baseline, then this working tree) starts ``gunicorn
controlplane.wsgi -w N`` (sync workers, production settings, DEBUG off) on a free
127.0.0.1 port, behind nginx as in production (a sync worker must not wait for a client
that keeps an idle connection open: see ``NGINX_CONF``; ``--no-proxy`` drives gunicorn
directly), and measures:

1. **Unloaded**: one client on one connection, no think time, per endpoint (overview, job
   page, the job page's two polls: status partial and metrics API, the overview's live
   part, the drill page's and the node list's polls, API job list): mean and p95 latency,
   and how many answers were 304 (a Python client: see ``one_client``). SQL queries per
   request of both trees, in-process with Django's test client: a warm request, and a
   revalidation where the response has an ETag.
2. **Realistic load** (open loop through think time): 50 researchers each polling their
   running job's page every 3 s (the status partial and the metrics API, as the page's
   poller does) and 5 API clients listing jobs every second. One wrk thread per client,
   so each client keeps its own state; each starts at its own phase within the think time
   (seeded, the same for both trees); two wrk processes, so each group has its own p95.
   Goal: p95 <= 250 ms, 0 errors.
3. **Capacity**: closed loop, the same request mix without think time, at increasing
   connection counts; the highest request rate at which p95 stays <= 250 ms. Goal: >= 3x
   the baseline's.

Clients behave like theirs: a browser's fetch keeps each path's ETag and revalidates with
If-None-Match (the Lua script keeps them per thread: one connection, one Lua state each);
API clients (a script) do not, unless ``--api-etags``. The baseline sends no ETags, so
for it every request is a full one. wrk (Debian package ``wrk``) and nginx
(``nginx-light``) run on the same 2 cores as the server; both are compiled and use a small
fraction of a core. Stops every gunicorn and nginx it started by pid.
"""

from __future__ import annotations

import argparse
import http.client
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
# The page cache of the servers under test (a database of its own, emptied for each tree).
REDIS_URL = "redis://127.0.0.1:6379/12"

# One Lua script for every run. Each wrk thread has one connection and its own Lua state:
# thread i takes client i's requests (a cycle of paths with its headers) and think times.
LUA = r"""
local counter = 0
local think = tonumber(os.getenv("BENCH_THINK_MS") or "0")
local role = os.getenv("BENCH_ROLE")
local threads = {}

function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

function init(args)
  local plan = {}
  for line in io.lines(os.getenv("BENCH_PLAN")) do table.insert(plan, line) end
  -- a plan line: "0|1<TAB>cookie|token<TAB>path1<TAB>path2...": whether the client keeps
  -- ETags and revalidates (a browser's fetch does), its credentials, its cycle of paths
  local mine = plan[(id % #plan) + 1]
  local fields = {}
  for field in string.gmatch(mine, "[^\t]+") do table.insert(fields, field) end
  revalidate = fields[1] == "1"
  auth = fields[2]
  paths = {}
  for i = 3, #fields do table.insert(paths, fields[i]) end
  not_modified = 0
  step = 0
  headers = {}
  if string.sub(auth, 1, 6) == "Token " then
    headers["Authorization"] = auth
  else
    headers["Cookie"] = auth
  end
  -- The browser's cache: the ETag each path last came with (one connection per thread,
  -- so the response that comes back is always that of the path sent last).
  etags = {}
  sent = nil
  -- Clients do not all start polling at the same instant: each starts at its own phase
  -- within the think time (the same phases for every tree: seeded by the thread's id).
  math.randomseed(1000 + id)
  phase = think > 0 and math.random(0, think) or 0
  started = false
end

function request()
  step = step + 1
  local path = paths[((step - 1) % #paths) + 1]
  local sending = {}
  for name, value in pairs(headers) do sending[name] = value end
  if revalidate and etags[path] then sending["If-None-Match"] = etags[path] end
  sent = path
  return wrk.format("GET", path, sending)
end

function response(status, response_headers, body)
  if revalidate and sent then
    local etag = response_headers["ETag"] or response_headers["etag"]
    if etag and status == 200 then etags[sent] = etag end
    if status == 304 then not_modified = not_modified + 1 end
  end
end

function delay()
  if not started then
    started = true
    return phase
  end
  -- think time after the last request of the cycle (a page's poll is its requests at once)
  if think > 0 and step % #paths == 0 then return think end
  return 0
end

function done(summary, latency, requests)
  local revalidated = 0
  for _, thread in ipairs(threads) do
    revalidated = revalidated + (thread:get("not_modified") or 0)
  end
  local out = string.format(
    '{"role": "%s", "requests": %d, "not_modified": %d, "duration_us": %d, "p50_ms": %.2f, ' ..
    '"p95_ms": %.2f, ' ..
    '"p99_ms": %.2f, "mean_ms": %.2f, "max_ms": %.2f, "errors": {"connect": %d, ' ..
    '"read": %d, "write": %d, "status": %d, "timeout": %d}}',
    role, summary.requests, revalidated, summary.duration, latency:percentile(50) / 1000,
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

    from jobs.ingest import point_totals_refresh
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
    # The seed stores points straight into the table; ingest keeps each job's sums as it
    # stores them (``jobs.ingest``): fill them as ingest would have.
    point_totals_refresh(job_ids=metric_jobs)
    drill = _running_drill(metric_jobs[0])
    # A steady state, as autovacuum leaves a production database: no dead rows from the
    # seed's updates, the visibility map set (index-only scans), statistics fresh.
    connection.close()
    psql = ["psql", "-h", lib.PG_HOST, "-p", lib.PG_PORT, "-U", lib.PG_USER]
    subprocess.run([*psql, "-qc", "VACUUM ANALYZE", DB], check=True)
    # A session names the authentication backend that signed it in, and a tree accepts only
    # its own (this one's loads the user with their roles; the baseline's is Django's).
    cookies: dict[str, list[str]] = {}
    for backend in (settings.AUTHENTICATION_BACKENDS[0], DJANGO_BACKEND):
        cookies[backend] = []
        for _ in range(RESEARCHERS):
            client = Client()
            client.force_login(owner, backend=backend)
            value = client.cookies[settings.SESSION_COOKIE_NAME].value
            cookies[backend].append(f"{settings.SESSION_COOKIE_NAME}={value}")
    token = Token.objects.get_or_create(user=owner)[0].key
    counts = {
        "jobs": Job.objects.count(),
        "points": MetricPoint.objects.count(),
        "nodes": Node.objects.count(),
    }
    connection.close()
    return {
        "cookies": cookies,
        "token": token,
        "metric_jobs": metric_jobs,
        "drill": drill,
        "counts": counts,
    }


DJANGO_BACKEND = "django.contrib.auth.backends.ModelBackend"


def tree_cookies(tree: Path, data: dict[str, Any]) -> list[str]:
    """The session cookies ``tree`` accepts (see ``seed_or_reuse``)."""
    settings_py = (tree / "controlplane" / "settings.py").read_text()
    for backend, cookies in data["cookies"].items():
        if backend != DJANGO_BACKEND and f'"{backend}"' in settings_py:
            return list(cookies)
    return list(data["cookies"][DJANGO_BACKEND])


def _running_drill(job_id: str) -> str:
    """A checkpoint of the first metric job with a restore drill running on it (the drill
    page polls its status while it runs)."""
    from datetime import timedelta

    from django.utils import timezone

    from drills.models import RestoreDrill
    from jobs.models import Checkpoint, Job

    job = Job.objects.get(id=job_id)
    checkpoint, _ = Checkpoint.objects.get_or_create(
        job=job, step=1000, defaults={"path": f"/runs/{job_id}/checkpoints/step-001000"}
    )
    drill, _ = RestoreDrill.objects.get_or_create(
        checkpoint=checkpoint,
        defaults={
            "cluster": job.cluster,
            "state": RestoreDrill.State.RUNNING,
            "slurm_job_id": "900001",
            "started_at": timezone.now() - timedelta(minutes=2),
        },
    )
    return str(drill.id)


# What the Lua script's clients do with ETags: a browser's fetch keeps them and revalidates;
# API clients do not unless --api-etags says so (a script with requests does not).
BROWSER = "1"


def endpoints(job: str, drill: str) -> dict[str, str]:
    return {
        "overview": "/",
        "job page": f"/jobs/{job}/",
        "job status poll": f"/jobs/{job}/status/",
        "job metrics poll": f"/api/v1/jobs/{job}/metrics/",
        "overview live poll": "/overview/live/",
        "drill status poll": f"/drills/{drill}/status/",
        "node list poll": "/nodes/live/",
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
            "REDIS_URL": REDIS_URL,
            "GANTRY_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(tree),
            "PGOPTIONS": "-c jit=off",
        }
    )
    return env


# In production gunicorn's sync workers sit behind a proxy that buffers each request
# (README: "behind a TLS proxy"): a sync worker reads a request only once it is all there.
# Without one, a client's idle keep-alive connection holds a worker until the client
# sends (wrk reconnects at once after each response, then thinks for 3 s on the open
# connection), and every client waits behind it. nginx plays that proxy here, for both
# trees alike; --no-proxy drives gunicorn directly.
NGINX_CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  upstream gantry {{ server 127.0.0.1:{upstream}; }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    keepalive_timeout 75s;
    keepalive_requests 1000000;
    location / {{
      proxy_pass http://gantry;
      proxy_http_version 1.0;
      proxy_set_header Host $http_host;
      proxy_buffer_size 16k;
      proxy_buffers 64 16k;
      proxy_max_temp_file_size 0;
      proxy_read_timeout 60s;
    }}
  }}
}}
"""


def collect_static(tree: Path, env: dict[str, str]) -> None:
    """The tree's static files where its production settings look (manifest storage)."""
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
        cwd=tree,
        env=env,
        check=True,
    )


class Server:
    """gunicorn (sync workers) for one tree, with nginx in front unless ``proxy`` is off;
    ``port`` is where clients connect."""

    def __init__(self, tree: Path, workers: int, *, proxy: bool = True) -> None:
        self.tree, self.upstream = tree, free_port()
        env = server_env(tree)
        collect_static(tree, env)
        self.log = (lib.BENCH_DIR / f"gunicorn-{tree.name}.log").open("wb")
        gunicorn = str(Path(sys.executable).parent / "gunicorn")
        argv = [gunicorn, "controlplane.wsgi", "-w", str(workers)]
        argv += ["-b", f"127.0.0.1:{self.upstream}", "--timeout", "60", "--log-level", "warning"]
        self.process = subprocess.Popen(
            argv,
            cwd=tree,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the workers go with the master
        )
        self.proxy: subprocess.Popen[bytes] | None = None
        self.port = self.upstream
        if proxy:
            self.port = free_port()
            self.proxy = self._start_proxy()
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
            stopped = self.process.poll() is not None or (
                self.proxy is not None and self.proxy.poll() is not None
            )
            if time.monotonic() > deadline or stopped:
                self.stop()
                raise SystemExit(f"gunicorn for {tree} did not come up; see {self.log.name}")
            time.sleep(0.3)

    def _start_proxy(self) -> subprocess.Popen[bytes]:
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        folder = Path(tempfile.mkdtemp(prefix="web-bench-nginx-"))
        # nginx's workers drop to an unprivileged user when started as root.
        folder.chmod(0o755)
        for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (folder / name).mkdir(mode=0o777)
            (folder / name).chmod(0o777)
        conf = folder / "nginx.conf"
        conf.write_text(NGINX_CONF.format(dir=folder, upstream=self.upstream, port=self.port))
        self.proxy_dir = folder
        return subprocess.Popen(
            [nginx, "-c", str(conf), "-p", str(folder)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self) -> None:
        for process in (self.proxy, self.process):
            if process is None or process.poll() is not None:
                continue
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if self.proxy is not None:
            shutil.rmtree(self.proxy_dir, ignore_errors=True)
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


def one_client(
    port: int, path: str, headers: dict[str, str], *, revalidates: bool, seconds: float
) -> dict[str, Any]:
    """One client on one kept-alive connection, a request as soon as the last answer is in
    (the unloaded figures), keeping the ETag like a browser when ``revalidates``.

    Timed here with a monotonic clock rather than by wrk: with one connection wrk's
    latencies on this VM added up to more than the run's length (a mean of 13 ms at 116
    requests/s), while this client's add up to its wall time; its own cost (a few tenths
    of a millisecond) is in every figure, for both trees alike."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    times: list[float] = []
    not_modified = errors = 0
    etag = None
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            sending = dict(headers)
            if etag and revalidates:
                sending["If-None-Match"] = etag
            started = time.monotonic()
            connection.request("GET", path, headers=sending)
            response = connection.getresponse()
            response.read()
            times.append((time.monotonic() - started) * 1000)
            if response.status == 304:
                not_modified += 1
            elif response.status == 200:
                etag = response.getheader("ETag") or etag
            else:
                errors += 1
    finally:
        connection.close()
    return {
        "requests": len(times),
        "not_modified": not_modified,
        "mean_ms": sum(times) / len(times),
        "p95_ms": lib.pct(times, 0.95),
        "error_count": errors,
    }


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
    # Each tree starts with an empty page cache: nothing one computed serves the other.
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()
    server = Server(tree, args.workers, proxy=args.proxy)
    print(
        f"# {name}: gunicorn pid {server.process.pid}, {args.workers} sync workers, "
        + (
            f"behind nginx pid {server.proxy.pid} on port {server.port}"
            if server.proxy is not None
            else f"port {server.port} (no proxy)"
        ),
        flush=True,
    )
    out: dict[str, Any] = {"unloaded": {}, "capacity": []}
    cookies = tree_cookies(tree, data)
    cookie, token = cookies[0], f"Token {data['token']}"
    api_etags = "1" if args.api_etags else "0"
    try:
        job = data["metric_jobs"][0]
        for label, path in endpoints(job, data["drill"]).items():
            api_client = path.startswith("/api/v1/jobs/?")
            # The job page's metrics fetch goes with the session cookie, as the page's does.
            headers = {"Authorization": token} if api_client else {"Cookie": cookie}
            revalidates = args.api_etags or not api_client
            # warm up: caches, connection, templates
            one_client(server.port, path, headers, revalidates=revalidates, seconds=2)
            got = one_client(
                server.port, path, headers, revalidates=revalidates, seconds=args.unloaded_seconds
            )
            out["unloaded"][label] = got
            print(
                f"  unloaded {label}: mean {got['mean_ms']:.1f} ms, p95 {got['p95_ms']:.1f} ms, "
                f"{got['not_modified']} of {got['requests']} answered 304, "
                f"errors {got['error_count']}",
                flush=True,
            )
        # Realistic: researchers poll their job's page every 3 s; API clients list jobs each s.
        jobs = data["metric_jobs"]
        researchers = [
            f"{BROWSER}\t{cookies[i]}\t/jobs/{jobs[i % len(jobs)]}/status/\t"
            f"/api/v1/jobs/{jobs[i % len(jobs)]}/metrics/"
            for i in range(RESEARCHERS)
        ]
        # The metrics poll above goes with the session cookie, as the page's fetch does.
        api = [f"{api_etags}\t{token}\t/api/v1/jobs/?page_size=50"] * API_CLIENTS
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
            f"{BROWSER}\t{cookie}\t/jobs/{job}/status/\t/api/v1/jobs/{job}/metrics/\t"
            f"/jobs/{job}/\t/",
            f"{api_etags}\t{token}\t/api/v1/jobs/?page_size=50",
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


# Run in a tree's own directory and Python path: SQL queries per request of each endpoint,
# in-process with Django's test client, as a second request finds the caches, and for a
# revalidation (If-None-Match with the ETag the response came with) where there is one.
QUERY_COUNTER = r"""
import json, os, sys
import django
django.setup()
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

page = Client()
page.force_login(User.objects.get(username=os.environ["BENCH_USER"]))
api = Client(HTTP_AUTHORIZATION="Token " + os.environ["BENCH_TOKEN"])
counts = {}
for label, path in json.loads(os.environ["BENCH_PATHS"]).items():
    client = api if path.startswith("/api/v1/jobs/?") else page
    client.get(path)
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path)
    assert response.status_code == 200, (path, response.status_code)
    again = None
    if response.get("ETag"):
        with CaptureQueriesContext(connection) as revalidated:
            second = client.get(path, HTTP_IF_NONE_MATCH=response["ETag"])
        again = len(revalidated.captured_queries) if second.status_code == 304 else None
    counts[label] = [len(captured.captured_queries), again]
print(json.dumps(counts))
"""


def query_counts(tree: Path, data: dict[str, Any]) -> dict[str, list[int | None]]:
    """SQL queries per request of each endpoint in ``tree`` (see ``QUERY_COUNTER``)."""
    env = server_env(tree)
    env.update(
        ALLOWED_HOSTS="testserver,127.0.0.1",
        BENCH_USER="bench-user-0",
        BENCH_TOKEN=data["token"],
        BENCH_PATHS=json.dumps(endpoints(data["metric_jobs"][0], data["drill"])),
    )
    collect_static(tree, env)
    done = subprocess.run(
        [sys.executable, "-c", QUERY_COUNTER],
        cwd=tree,
        env=env,
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"counting queries in {tree} failed:\n{done.stderr[-4000:]}")
    counts: dict[str, list[int | None]] = json.loads(done.stdout.strip().splitlines()[-1])
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
    parser.add_argument(
        "--no-proxy",
        dest="proxy",
        action="store_false",
        help="drive gunicorn directly, without nginx in front",
    )
    parser.add_argument(
        "--api-etags",
        action="store_true",
        help="API clients keep ETags and revalidate too (by default only the browser's do)",
    )
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
    if args.proxy and shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
        print("nginx is missing: apt-get install nginx-light (or pass --no-proxy)")
        return 2
    started = time.perf_counter()
    data = seed_or_reuse(args)
    print(f"# database {DB}: {data['counts']}", flush=True)
    baseline = export_baseline(args.baseline)
    queries = {"baseline": query_counts(baseline, data), "now": query_counts(lib.REPO, data)}
    work = Path(tempfile.mkdtemp(prefix="web-bench-"))
    results = {}
    try:
        results["baseline"] = measure_tree(f"baseline {args.baseline}", baseline, data, args, work)
        results["now"] = measure_tree("this tree", lib.REPO, data, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not args.keep:
            lib.pg_drop(DB)
    report(results, queries, data, args)
    print(f"total {time.perf_counter() - started:.0f} s; load average {os.getloadavg()[0]:.1f}")
    return 0


def _queries(counts: list[int | None]) -> str:
    """'8' or '8/5': queries of a second request, and of a revalidation answered 304."""
    full, again = counts
    return f"{full}" if again is None else f"{full}/{again}"


def report(
    results: dict[str, Any],
    queries: dict[str, dict[str, list[int | None]]],
    data: dict[str, Any],
    args: argparse.Namespace,
) -> None:
    base, now = results["baseline"], results["now"]
    print(
        f"\n# web bench: {data['counts']['nodes']} nodes, {data['counts']['jobs']} jobs, "
        f"{data['counts']['points']} metric points, PostgreSQL, gunicorn -w {args.workers} (sync)"
        f"{' behind nginx' if args.proxy else ''}, "
        f"wrk 1 thread per connection; baseline {args.baseline} vs this tree, same database, "
        f"same run; browser clients revalidate with If-None-Match, API clients "
        f"{'do too (--api-etags)' if args.api_etags else 'do not'}"
    )
    print(
        f"{'unloaded (1 connection)':20} {'base mean ms':>12} {'now mean ms':>11} "
        f"{'now p95 ms':>10} {'now 304s':>9} {'base SQL':>9} {'now SQL':>8}  goal"
    )
    for label in endpoints("x", "y"):
        b, n = base["unloaded"][label], now["unloaded"][label]
        goal = (
            "<= 25 ms, <= 8 queries"
            if label == "overview"
            else ("<= 10 ms" if "poll" in label else "")
        )
        share = f"{100 * n['not_modified'] / max(1, n['requests']):.0f}%"
        print(
            f"{label:20} {b['mean_ms']:12.1f} {n['mean_ms']:11.1f} {n['p95_ms']:10.1f} "
            f"{share:>9} {_queries(queries['baseline'][label]):>9} "
            f"{_queries(queries['now'][label]):>8}  {goal}"
        )
    print("SQL: queries of a warm request / of a revalidation answered 304 (in-process)")
    print(
        f"\n{'realistic load':20} {'base p95 ms':>12} {'now p95 ms':>11} {'now req/s':>10} "
        f"{'now 304s':>9} {'now errors':>11}  goal p95 <= {GOAL_P95_MS:.0f} ms, 0 errors"
    )
    for role in ("researchers", "api"):
        b, n = base["realistic"][role], now["realistic"][role]
        verdict = "MET" if n["p95_ms"] <= GOAL_P95_MS and n["error_count"] == 0 else "NOT MET"
        share = f"{100 * n['not_modified'] / max(1, n['requests']):.0f}%"
        print(
            f"{role:20} {b['p95_ms']:12.1f} {n['p95_ms']:11.1f} {n['rate']:10.1f} "
            f"{share:>9} {n['error_count']:11d}  {verdict}"
        )
    print("\ncapacity (closed loop): connections: req/s (p95 ms)")
    for name, got in (("baseline", base), ("now", now)):
        print(
            f"{name:9} "
            + "  ".join(
                f"{c['connections']}c: {c['rate']:.0f} ({c['p95_ms']:.0f})" for c in got["capacity"]
            )
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
