"""The web tier at fleet scale, driven by a compiled load generator (wrk), today's code
against a baseline commit, side by side on the same PostgreSQL database.

    .venv/bin/python bench/web_bench.py [--quick] [--baseline 1d0a024] [--reuse] [--keep]
        [--workers 4] [--seconds 20] [--levels 2,4,8,16,32,64] [--api-etags] [--no-proxy]
        [--profile]

Seeds PostgreSQL database gantry_bench_web (10k nodes with 2 GPUs each, 100k jobs over 50
researchers and 2 clusters, 1M metric points = 10 running jobs x 100k; ``--reuse`` keeps a
seeded one; the seed writes points straight into the table, so the job's point sums that
ingest keeps are filled in as ingest would have; a restore drill runs on a checkpoint of
the first of them), then VACUUM ANALYZE, exports the baseline commit with ``git archive``
under var/bench/, and for each tree (baseline, then this working tree) starts ``gunicorn
controlplane.wsgi -w N`` (sync workers, production settings, DEBUG off) on a free
127.0.0.1 port, behind nginx as in production (a sync worker must not wait for a client
that keeps an idle connection open: see ``_web_server.NGINX_CONF``; ``--no-proxy`` drives
gunicorn directly), and measures:

1. **Unloaded**: one client on one connection, no think time, per endpoint (overview, job
   page, the job page's two polls: status partial and metrics API, the overview's live
   part, the drill page's and the node list's polls, API job list; the job list page; the
   overview and the API job list as an operator, who sees every job of the fleet): mean and
   p95 latency, and how many answers were 304 (a Python client: see
   ``_web_load.one_client``). SQL queries per request of both trees, in-process with
   Django's test client: a warm request, and a revalidation where the response has an ETag.
2. **Realistic load** (open loop through think time): 50 researchers each polling their
   running job's page every 3 s (the status partial and the metrics API, as the page's
   poller does) and 5 API clients listing jobs every second. One wrk thread per client,
   so each client keeps its own state; each starts at its own phase within the think time
   (seeded, the same for both trees); two wrk processes, so each group has its own p95.
   Goal: p95 <= 250 ms, 0 errors.
3. **Capacity**: closed loop, the same request mix without think time, at increasing
   connection counts; the highest request rate at which p95 stays <= 250 ms. Goal: >= 3x
   the baseline's.

With ``--profile``, then a cProfile of three requests to this tree's slowest endpoint
(in-process; its own frames and Django's execute, render and JSON calls).

Clients behave like theirs: a browser's fetch keeps each path's ETag and revalidates with
If-None-Match (the Lua script keeps them per thread: one connection, one Lua state each);
API clients (a script) do not, unless ``--api-etags``. The baseline sends no ETags, so
for it every request is a full one. wrk (Debian package ``wrk``) and nginx
(``nginx-light``) run on the same 2 cores as the server; both are compiled and use a small
fraction of a core. Stops every gunicorn and nginx it started by pid, and ends the queries
their workers left running in the bench database.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as lib
from _web_inprocess import OPERATOR, RESEARCHER, profile, query_counts
from _web_load import one_client, wrk, wrk_result
from _web_seed import DB, RESEARCHERS, SECRET_KEY, Seeded, seed_or_reuse, tree_backend
from _web_server import REDIS_URL, Server, collect_static, export_baseline, server_env

GOAL_P95_MS = 250.0
API_CLIENTS = 5
# What the Lua script's clients do with ETags: a browser's fetch keeps them and revalidates;
# API clients do not unless --api-etags says so (a script with requests does not).
BROWSER = "1"


@dataclass
class Credentials:
    """What the clients of one tree send: sessions its backend accepts, and API tokens."""

    cookies: list[str]
    operator_cookie: str
    token: str
    operator_token: str

    @classmethod
    def for_tree(cls, tree: Path, seeded: Seeded) -> Credentials:
        backend = tree_backend(tree, seeded)
        return cls(
            cookies=list(seeded.cookies[backend]),
            operator_cookie=seeded.operator_cookies[backend],
            token=f"Token {seeded.token}",
            operator_token=f"Token {seeded.operator_token}",
        )

    def headers(self, path: str, persona: str) -> dict[str, str]:
        """An API client's token for the API job list; a session cookie for the rest (the
        job page's metrics fetch goes with the session cookie, as the page's does)."""
        if is_api_list(path):
            return {"Authorization": self.operator_token if persona == OPERATOR else self.token}
        return {"Cookie": self.operator_cookie if persona == OPERATOR else self.cookies[0]}


def is_api_list(path: str) -> bool:
    return path.startswith("/api/v1/jobs/?")


def endpoints(job: str, drill: str) -> dict[str, tuple[str, str]]:
    """Label -> (path, who asks) of every endpoint measured unloaded and counted."""
    return {
        "overview": ("/", RESEARCHER),
        "job page": (f"/jobs/{job}/", RESEARCHER),
        "job status poll": (f"/jobs/{job}/status/", RESEARCHER),
        "job metrics poll": (f"/api/v1/jobs/{job}/metrics/", RESEARCHER),
        "overview live poll": ("/overview/live/", RESEARCHER),
        "drill status poll": (f"/drills/{drill}/status/", RESEARCHER),
        "node list poll": ("/nodes/live/", RESEARCHER),
        "api job list": ("/api/v1/jobs/?page_size=50", RESEARCHER),
        # What the load and API benches measured besides: the job list page, and the views
        # of an operator, who sees all 100k jobs.
        "job list page": ("/jobs/", RESEARCHER),
        "operator overview": ("/", OPERATOR),
        "operator api list": ("/api/v1/jobs/?page_size=50", OPERATOR),
    }


def inprocess_env(tree: Path, seeded: Seeded) -> dict[str, str]:
    """The environment of an in-process child in ``tree`` (see ``_web_inprocess``)."""
    env = server_env(tree, database_url=lib.pg_url(DB), secret_key=SECRET_KEY)
    env.update(
        ALLOWED_HOSTS="testserver,127.0.0.1",
        BENCH_USER="bench-user-0",
        BENCH_TOKEN=seeded.token,
        BENCH_OPERATOR="bench-operator",
        BENCH_OPERATOR_TOKEN=seeded.operator_token,
    )
    return env


def tree_query_counts(tree: Path, seeded: Seeded) -> dict[str, list[int | None]]:
    """SQL queries per request of each endpoint in ``tree``."""
    env = inprocess_env(tree, seeded)
    collect_static(tree, env)
    return query_counts(tree, env, endpoints(seeded.metric_jobs[0], seeded.drill))


# ---------------------------------------------------------------- one tree under load


def measure_tree(
    name: str, tree: Path, seeded: Seeded, args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    # Each tree starts with an empty page cache: nothing one computed serves the other.
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()
    env = server_env(tree, database_url=lib.pg_url(DB), secret_key=SECRET_KEY)
    server = Server(tree, args.workers, env, proxy=args.proxy)
    print(
        f"# {name}: gunicorn pid {server.process.pid}, {args.workers} sync workers, "
        + (
            f"behind nginx pid {server.proxy.pid} on port {server.port}"
            if server.proxy is not None
            else f"port {server.port} (no proxy)"
        ),
        flush=True,
    )
    credentials = Credentials.for_tree(tree, seeded)
    out: dict[str, Any] = {"unloaded": {}, "capacity": []}
    try:
        out["unloaded"] = measure_unloaded(server.port, credentials, seeded, args)
        out["realistic"] = measure_realistic(server.port, work, credentials, seeded, args)
        out["capacity"] = measure_capacity(server.port, work, credentials, seeded, args)
    finally:
        server.stop()
        lib.pg_terminate_backends(DB)
    ok = [c for c in out["capacity"] if c["p95_ms"] <= GOAL_P95_MS and c["error_count"] == 0]
    out["capacity_rate"] = max((c["rate"] for c in ok), default=0.0)
    return out


def measure_unloaded(
    port: int, credentials: Credentials, seeded: Seeded, args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    """Each endpoint alone: one client, one connection, no think time."""
    unloaded = {}
    for label, (path, persona) in endpoints(seeded.metric_jobs[0], seeded.drill).items():
        headers = credentials.headers(path, persona)
        revalidates = args.api_etags or not is_api_list(path)
        # warm up: caches, connection, templates
        one_client(port, path, headers, revalidates=revalidates, seconds=2)
        got = one_client(
            port, path, headers, revalidates=revalidates, seconds=args.unloaded_seconds
        )
        unloaded[label] = got
        print(
            f"  unloaded {label}: mean {got['mean_ms']:.1f} ms, p95 {got['p95_ms']:.1f} ms, "
            f"{got['not_modified']} of {got['requests']} answered 304, "
            f"errors {got['error_count']}",
            flush=True,
        )
    return unloaded


def measure_realistic(
    port: int, work: Path, credentials: Credentials, seeded: Seeded, args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    """Researchers poll their job's page every 3 s; API clients list jobs every second."""
    jobs = seeded.metric_jobs
    # The metrics poll goes with the session cookie, as the page's fetch does.
    researchers = [
        f"{BROWSER}\t{credentials.cookies[i]}\t/jobs/{jobs[i % len(jobs)]}/status/\t"
        f"/api/v1/jobs/{jobs[i % len(jobs)]}/metrics/"
        for i in range(RESEARCHERS)
    ]
    api_etags = "1" if args.api_etags else "0"
    api = [f"{api_etags}\t{credentials.token}\t/api/v1/jobs/?page_size=50"] * API_CLIENTS
    polls = wrk(
        port,
        work,
        "researchers",
        researchers,
        connections=RESEARCHERS,
        seconds=args.seconds,
        think_ms=3000,
    )
    lists = wrk(
        port, work, "api", api, connections=API_CLIENTS, seconds=args.seconds, think_ms=1000
    )
    realistic = {
        "researchers": wrk_result(polls, work, "researchers"),
        "api": wrk_result(lists, work, "api"),
    }
    for role, got in realistic.items():
        print(
            f"  realistic {role}: {got['rate']:.1f} req/s, p95 {got['p95_ms']:.1f} ms, "
            f"errors {got['error_count']}",
            flush=True,
        )
    return realistic


def measure_capacity(
    port: int, work: Path, credentials: Credentials, seeded: Seeded, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """The mix without think time at growing concurrency, until p95 passes 4x the goal."""
    job = seeded.metric_jobs[0]
    api_etags = "1" if args.api_etags else "0"
    mix = [
        f"{BROWSER}\t{credentials.cookies[0]}\t/jobs/{job}/status/\t/api/v1/jobs/{job}/metrics/\t"
        f"/jobs/{job}/\t/",
        f"{api_etags}\t{credentials.token}\t/api/v1/jobs/?page_size=50",
    ]
    capacity = []
    for level in args.levels:
        load = wrk(port, work, "capacity", mix, connections=level, seconds=args.level_seconds)
        got = wrk_result(load, work, "capacity")
        got["connections"] = level
        capacity.append(got)
        print(
            f"  capacity {level} connections: {got['rate']:.1f} req/s, "
            f"p95 {got['p95_ms']:.1f} ms, errors {got['error_count']}",
            flush=True,
        )
        if got["p95_ms"] > 4 * GOAL_P95_MS:
            break
    return capacity


# ---------------------------------------------------------------- the run


def parse_args() -> argparse.Namespace:
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
    parser.add_argument(
        "--profile",
        action="store_true",
        help="then cProfile this tree's slowest endpoint (unloaded mean), in-process",
    )
    args = parser.parse_args()
    args.seconds = args.seconds or (10.0 if args.quick else 30.0)
    args.level_seconds = 8.0 if args.quick else 15.0
    args.unloaded_seconds = 3.0 if args.quick else 6.0
    args.levels = [
        int(x) for x in (args.levels or ("4,16,48" if args.quick else "2,4,8,16,32,64")).split(",")
    ]
    return args


def missing_tool(args: argparse.Namespace) -> str | None:
    if shutil.which("wrk") is None:
        return "wrk is missing: apt-get install wrk"
    if args.proxy and shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
        return "nginx is missing: apt-get install nginx-light (or pass --no-proxy)"
    return None


def main() -> int:
    args = parse_args()
    missing = missing_tool(args)
    if missing:
        print(missing)
        return 2
    started = time.perf_counter()
    seeded = seed_or_reuse(args)
    print(f"# database {DB}: {seeded.counts}", flush=True)
    baseline = export_baseline(args.baseline)
    queries = {
        "baseline": tree_query_counts(baseline, seeded),
        "now": tree_query_counts(lib.REPO, seeded),
    }
    work = Path(tempfile.mkdtemp(prefix="web-bench-"))
    try:
        results = {
            "baseline": measure_tree(f"baseline {args.baseline}", baseline, seeded, args, work),
            "now": measure_tree("this tree", lib.REPO, seeded, args, work),
        }
        report(results, queries, seeded, args)
        if args.profile:
            print_profile(results["now"], seeded)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not args.keep:
            lib.pg_drop(DB)
    print(f"total {time.perf_counter() - started:.0f} s; load average {os.getloadavg()[0]:.1f}")
    return 0


# ---------------------------------------------------------------- the report


def report(
    results: dict[str, Any],
    queries: dict[str, dict[str, list[int | None]]],
    seeded: Seeded,
    args: argparse.Namespace,
) -> None:
    counts = seeded.counts
    print(
        f"\n# web bench: {counts['nodes']} nodes, {counts['jobs']} jobs, "
        f"{counts['points']} metric points, PostgreSQL, gunicorn -w {args.workers} (sync)"
        f"{' behind nginx' if args.proxy else ''}, "
        f"wrk 1 thread per connection; baseline {args.baseline} vs this tree, same database, "
        f"same run; browser clients revalidate with If-None-Match, API clients "
        f"{'do too (--api-etags)' if args.api_etags else 'do not'}"
    )
    report_unloaded(results, queries)
    report_realistic(results)
    report_capacity(results)


def _queries(counts: list[int | None]) -> str:
    """'8' or '8/5': queries of a second request, and of a revalidation answered 304."""
    full, again = counts
    return f"{full}" if again is None else f"{full}/{again}"


def _share_304(got: dict[str, Any]) -> str:
    return f"{100 * got['not_modified'] / max(1, got['requests']):.0f}%"


def report_unloaded(
    results: dict[str, Any], queries: dict[str, dict[str, list[int | None]]]
) -> None:
    base, now = results["baseline"], results["now"]
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
        print(
            f"{label:20} {b['mean_ms']:12.1f} {n['mean_ms']:11.1f} {n['p95_ms']:10.1f} "
            f"{_share_304(n):>9} {_queries(queries['baseline'][label]):>9} "
            f"{_queries(queries['now'][label]):>8}  {goal}"
        )
    print("SQL: queries of a warm request / of a revalidation answered 304 (in-process)")


def report_realistic(results: dict[str, Any]) -> None:
    base, now = results["baseline"], results["now"]
    print(
        f"\n{'realistic load':20} {'base p95 ms':>12} {'now p95 ms':>11} {'now req/s':>10} "
        f"{'now 304s':>9} {'now errors':>11}  goal p95 <= {GOAL_P95_MS:.0f} ms, 0 errors"
    )
    for role in ("researchers", "api"):
        b, n = base["realistic"][role], now["realistic"][role]
        verdict = "MET" if n["p95_ms"] <= GOAL_P95_MS and n["error_count"] == 0 else "NOT MET"
        print(
            f"{role:20} {b['p95_ms']:12.1f} {n['p95_ms']:11.1f} {n['rate']:10.1f} "
            f"{_share_304(n):>9} {n['error_count']:11d}  {verdict}"
        )


def report_capacity(results: dict[str, Any]) -> None:
    base, now = results["baseline"], results["now"]
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


def print_profile(now: dict[str, Any], seeded: Seeded) -> None:
    """Where the time of this tree's slowest endpoint (unloaded mean) goes."""
    slowest = max(now["unloaded"], key=lambda label: now["unloaded"][label]["mean_ms"])
    path, persona = endpoints(seeded.metric_jobs[0], seeded.drill)[slowest]
    listing = profile(lib.REPO, inprocess_env(lib.REPO, seeded), path, persona, requests=3)
    print(f"\ncProfile of 3 requests to this tree's slowest endpoint ({slowest}), in-process:")
    print(listing)


if __name__ == "__main__":
    sys.exit(main())
