"""First views under load: the job list page and API, the metrics API and the job page at a
fixed connection count, full renders (no If-None-Match) and revalidations side by side, for
a baseline commit and this tree in the same run on the same PostgreSQL database.

    .venv/bin/python bench/web_list_bench.py [--baseline f5735ce] [--jobs 20000]
        [--points 200000] [--nodes 1000] [--connections 8] [--seconds 10] [--reuse] [--keep]
        [--workers 4] [--no-proxy] [--only now] [--pyspy LABEL] [--gc-log]

Seeds ``gantry_bench_weblist`` (its own database, so that it never shares one with
``web_bench.py``; by default a reduced scale: 20k jobs, 200k points on 2 running jobs,
1k nodes; ``--reuse`` keeps a seeded one), then per tree starts gunicorn (sync workers,
production settings) behind nginx as ``web_bench.py`` does, and for each endpoint and mode
runs wrk with ``--connections`` connections for ``--seconds`` seconds: p50, p99, max and
req/s. Each tree starts with an empty page cache, and each endpoint is first asked once
(warm-up: what a first view after a deploy costs is the unloaded bench's business).

``--pyspy LABEL``: while this tree serves LABEL's full renders, py-spy samples every worker
(``--subprocesses``, idle frames included: a worker waiting on the database or on a lock
counts), and the frames that hold the most samples are printed, inclusive.
``--gc-log``: the workers time every garbage collection (``GANTRY_BENCH_GC_LOG``, read by
``bench/_web_gc.py`` through ``sitecustomize``) and the longest pauses are printed.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as lib
import _web_seed
from _web_load import wrk, wrk_result
from _web_seed import SECRET_KEY, Seeded, seed_or_reuse
from _web_server import REDIS_URL, Server, export_baseline, server_env
from web_bench import OPERATOR, RESEARCHER, Credentials

DB = "gantry_bench_weblist"
_web_seed.DB = DB
MODES = ("full", "revalidate")


def endpoints(job: str) -> dict[str, tuple[str, str]]:
    """Label -> (path, who asks)."""
    return {
        "job list page": ("/jobs/", RESEARCHER),
        "operator job list page": ("/jobs/?mine=0", OPERATOR),
        "api job list": ("/api/v1/jobs/?page_size=50", RESEARCHER),
        "operator api job list": ("/api/v1/jobs/?page_size=50", OPERATOR),
        "job metrics api": (f"/api/v1/jobs/{job}/metrics/", RESEARCHER),
        "job page": (f"/jobs/{job}/", RESEARCHER),
        "overview": ("/", RESEARCHER),
    }


# The mix of first views: each connection cycles through one of these in turn.
MIX = ("overview", "job list page", "job page", "job metrics api", "api job list")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="f5735ce")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--points", type=int, default=200_000)
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--reuse", action="store_true")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--no-proxy", dest="proxy", action="store_false")
    parser.add_argument("--only", choices=("now", "baseline"), default=None)
    parser.add_argument("--labels", default=None, help="endpoint labels, comma-separated")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--pyspy", default=None, help="an endpoint label to sample")
    parser.add_argument("--gc-log", action="store_true")
    parser.add_argument(
        "--no-conf",
        dest="conf",
        action="store_false",
        help="serve this tree with sync workers too (not controlplane.gunicorn_conf)",
    )
    return parser.parse_args()


def run_endpoint(
    port: int, work: Path, credentials: Credentials, path: str, persona: str, **load: Any
) -> dict[str, Any]:
    """wrk on one path with ``load`` (mode, connections, seconds)."""
    revalidate = "1" if load["mode"] == "revalidate" else "0"
    plan = []
    for one_path, one_persona in [(path, persona)] if path != "mix" else load["mix"]:
        headers = credentials.headers(one_path, one_persona)
        auth = headers.get("Authorization") or headers["Cookie"]
        plan.append(f"{revalidate}\t{auth}\t{one_path}")
    warm = wrk(port, work, "warm", plan, connections=1, seconds=1)
    wrk_result(warm, work, "warm")
    proc = wrk(port, work, "list", plan, connections=load["connections"], seconds=load["seconds"])
    return wrk_result(proc, work, "list")


def pyspy_summary(folded: Path, top: int = 30) -> str:
    """Where the workers' request time goes, from py-spy's folded stacks: of the samples
    inside a request (``handle_request``), the share each frame is in (inclusive) and the
    share it is the innermost Python frame of (self: on the CPU, or waiting in a call into
    C such as a socket read from the database)."""
    inclusive: collections.Counter[str] = collections.Counter()
    innermost: collections.Counter[str] = collections.Counter()
    total = 0
    for line in folded.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not any("handle_request" in frame for frame in frames):
            continue
        n = int(count)
        total += n
        innermost[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    lines = [f"{total} samples in requests (all workers, waits included); inclusive:"]
    for frame, n in inclusive.most_common(top):
        lines.append(f"{100 * n / max(1, total):5.1f}%  {frame}")
    lines.append("self (innermost frame):")
    for frame, n in innermost.most_common(15):
        lines.append(f"{100 * n / max(1, total):5.1f}%  {frame}")
    return "\n".join(lines)


def measure_tree(
    name: str, tree: Path, seeded: Seeded, args: argparse.Namespace, work: Path
) -> dict[str, dict[str, Any]]:
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()
    env = server_env(tree, database_url=lib.pg_url(DB), secret_key=SECRET_KEY)
    if args.gc_log:
        env["GANTRY_BENCH_GC_LOG"] = str(work / f"gc-{name}.log")
        env["PYTHONPATH"] = f"{lib.REPO / 'bench' / 'gc_hook'}:{env['PYTHONPATH']}"
    # The tree's production server settings where it has them (gthread, frozen startup heap).
    conf = tree / "controlplane" / "gunicorn_conf.py"
    extra = ("-c", "python:controlplane.gunicorn_conf") if conf.exists() and args.conf else ()
    server = Server(tree, args.workers, env, proxy=args.proxy, extra=extra)
    print(f"# {name}: gunicorn {' '.join(extra) or '(sync workers)'}", flush=True)
    credentials = Credentials.for_tree(tree, seeded)
    out: dict[str, dict[str, Any]] = {}
    labels = args.labels.split(",") if args.labels else [*endpoints("x"), "mix"]
    try:
        for label in labels:
            known = endpoints(seeded.metric_jobs[0])
            path, persona = ("mix", RESEARCHER) if label == "mix" else known[label]
            for mode in args.modes.split(","):
                spy = None
                if args.pyspy == label and mode == "full" and name == "now":
                    spy = start_pyspy(server.process.pid, work, args.seconds)
                got = run_endpoint(
                    server.port,
                    work,
                    credentials,
                    path,
                    persona,
                    mode=mode,
                    connections=args.connections,
                    seconds=args.seconds,
                    mix=[known[one] for one in MIX],
                )
                if spy is not None:
                    spy.wait(timeout=120)
                    got["pyspy"] = pyspy_summary(work / "pyspy.folded")
                out[f"{label}|{mode}"] = got
                print(
                    f"  {name:8} {label:26} {mode:10} {got['rate']:7.1f} req/s  "
                    f"p50 {got['p50_ms']:7.1f}  p99 {got['p99_ms']:7.1f}  max "
                    f"{got['max_ms']:7.1f} ms  304s {got['not_modified']:5d}  errors "
                    f"{got['error_count']}",
                    flush=True,
                )
                if "pyspy" in got:
                    print(got["pyspy"], flush=True)
    finally:
        server.stop()
        lib.pg_terminate_backends(DB)
    if args.gc_log:
        print(gc_summary(work / f"gc-{name}.log"))
    return out


def start_pyspy(master: int, work: Path, seconds: float) -> subprocess.Popen[bytes]:
    py_spy = str(Path(sys.executable).parent / "py-spy")
    argv = [py_spy, "record", "--pid", str(master), "--subprocesses", "--idle"]
    argv += ["--format", "raw", "-o", str(work / "pyspy.folded"), "-r", "200"]
    argv += ["-d", str(int(seconds)), "--nonblocking"]
    # wrk's warm-up second runs first: start sampling with the measured load.
    time.sleep(1.2)
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def gc_summary(log: Path) -> str:
    if not log.exists():
        return "gc: no log"
    pauses = sorted(
        (float(ms), gen) for ms, gen in (line.split() for line in log.read_text().splitlines())
    )
    if not pauses:
        return "gc: no collections"
    slow = [f"{ms:.1f} ms (gen {gen})" for ms, gen in pauses[-5:]]
    return (
        f"gc: {len(pauses)} collections, total {sum(ms for ms, _ in pauses):.0f} ms, "
        f"longest: {', '.join(slow)}"
    )


def report(results: dict[str, dict[str, dict[str, Any]]], args: argparse.Namespace) -> None:
    print(
        f"\n# job list bench: {args.connections} connections, {args.seconds:.0f} s per row, "
        f"gunicorn -w {args.workers}{' behind nginx' if args.proxy else ''}; baseline: sync "
        f"workers; now: its controlplane.gunicorn_conf (gthread) unless --no-conf"
    )
    print(
        f"{'endpoint':26} {'mode':10} {'base p50':>9} {'base p99':>9} {'base r/s':>9} "
        f"{'now p50':>8} {'now p99':>8} {'now r/s':>8} {'r/s ratio':>9}"
    )
    now, base = results.get("now", {}), results.get("baseline", {})
    for key in now or base:
        label, mode = key.split("|")
        b, n = base.get(key), now.get(key)
        cells = []
        for got in (b, n):
            cells += (
                ["-", "-", "-"]
                if got is None
                else [f"{got['p50_ms']:.1f}", f"{got['p99_ms']:.1f}", f"{got['rate']:.0f}"]
            )
        ratio = f"{n['rate'] / b['rate']:.2f}" if b and n and b["rate"] else "-"
        print(
            f"{label:26} {mode:10} {cells[0]:>9} {cells[1]:>9} {cells[2]:>9} "
            f"{cells[3]:>8} {cells[4]:>8} {cells[5]:>8} {ratio:>9}"
        )


def main() -> int:
    args = parse_args()
    if shutil.which("wrk") is None:
        print("wrk is missing: apt-get install wrk")
        return 2
    started = time.perf_counter()
    seeded = seed_or_reuse(args)
    print(f"# database {DB}: {seeded.counts}; load average {os.getloadavg()[0]:.1f}", flush=True)
    trees = {"baseline": export_baseline(args.baseline), "now": lib.REPO}
    work = Path(tempfile.mkdtemp(prefix="web-list-bench-"))
    results: dict[str, dict[str, dict[str, Any]]] = {}
    try:
        for name, tree in trees.items():
            if args.only in (None, name):
                results[name] = measure_tree(name, tree, seeded, args, work)
        report(results, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not args.keep:
            lib.pg_drop(DB)
    print(f"total {time.perf_counter() - started:.0f} s; load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
