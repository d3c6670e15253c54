"""A whole log of 1 GB through the production web server (issue 30, item 5): does the
download finish, how fast, does it tie up a worker, and what do other requests see while
it runs. The log is a real file in a researcher's run directory on the dev cluster, read
over SFTP as that researcher (``jobs.output``), served by gunicorn started as the README's
*Production* section says, and downloaded with a plain HTTP client that counts bytes.

Two servers, side by side in one run:

- **production**: ``gunicorn -c python:controlplane.gunicorn_conf`` (threaded workers,
  ``--timeout`` 30 s as configured), with ``--workers`` workers;
- **sync** (what the issue measured before): ``gunicorn -k sync --timeout 30`` with the
  same number of workers; a request that outlasts the timeout is cut off.

While the download runs, a second client asks for a small API page again and again; its
latency is compared with the same client on the idle server. The workers' largest resident
memory during the download is read from ``/proc``.

    DEVCLUSTER_DIR=/path/to/var/devcluster .venv/bin/python bench/log_stream_bench.py --size 1GiB

Not a test; nothing here runs in CI. It writes only a file in the researcher's run
directory of the bench job (removed at the end) and a SQLite database under ``var/bench``.
"""

from __future__ import annotations

import argparse
import http.client
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import _benchlib as lib
from _web_server import collect_static, server_env

ACCOUNT = "alice"  # a researcher account of the dev cluster
SLURM_ID = "990001"  # a Slurm job id no real job of the bench has


def _size(text: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(text)


def seed(dc: Any, size: int) -> tuple[str, str, str]:
    """The cluster, a researcher mapped to ``ACCOUNT``, a finished job with a Slurm id and
    its log of ``size`` bytes written as the researcher; returns (job id, token, path)."""
    from core.services import api_token_create
    from jobs.lifecycle import JOBS
    from jobs.models import Job

    cluster = lib.register_devcluster(dc, sync=False)
    user = lib.make_user("bench-logs", "researchers")
    lib.map_account(cluster, user, ACCOUNT)
    job = Job.objects.create(
        id=uuid.uuid4(),
        name="log-stream-bench",
        owner=user,
        cluster=cluster,
        run_as=ACCOUNT,
        partition=dc.default_partition,
        state=Job.State.COMPLETED,
        slurm_job_id=SLURM_ID,
        files_final=True,
    )
    directory = JOBS.run_directory(job)
    path = f"{directory}/slurm-{SLURM_ID}.out"
    # Lines of text, as a real log: 1 MiB written by Python, then doubled with cat.
    writer = (
        "import os,sys; d,p,n=sys.argv[1],sys.argv[2],int(sys.argv[3]); "
        "os.makedirs(d, exist_ok=True); "
        "line=b'step 000000 loss 2.302585 tokens/s 123456.7 rank 0 of 8\\n'; "
        "block=line*(1048576//len(line)); "
        "f=open(p,'wb'); w=0\n"
        "while w<n:\n  c=block[:n-w]; f.write(c); w+=len(c)\n"
        "f.close()"
    )
    dc.run_as(ACCOUNT, ["python3", "-c", writer, directory, path, str(size)], timeout=600)
    _, secret = api_token_create(user=user, name="log-stream-bench", expires_at=None)
    return str(job.id), secret, path


class Server:
    def __init__(self, mode: str, *, workers: int, env: dict[str, str]) -> None:
        self.mode = mode
        self.port = lib.free_port()
        gunicorn = str(Path(sys.executable).parent / "gunicorn")
        argv = [gunicorn, "controlplane.wsgi", "-b", f"127.0.0.1:{self.port}", "-w", str(workers)]
        if mode == "production":
            argv += ["-c", "python:controlplane.gunicorn_conf"]
        else:
            argv += ["-k", "sync", "--timeout", "30"]
        self.log = (lib.BENCH_DIR / f"gunicorn-logstream-{mode}.log").open("wb")
        self.process = subprocess.Popen(
            argv, cwd=lib.REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                status, _, _ = get(self.port, "/login/", None)
                if status < 500:
                    return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise SystemExit(f"gunicorn ({mode}) did not come up; see {self.log.name}")

    def worker_pids(self) -> list[int]:
        out = subprocess.run(
            ["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True, check=False
        ).stdout
        return [int(p) for p in out.split()]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def get(port: int, path: str, token: str | None) -> tuple[int, int, float]:
    """(status, bytes read, seconds); the body is counted, never kept."""
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Host": "127.0.0.1"}
    if token:
        headers["Authorization"] = f"Token {token}"
    conn.request("GET", path, headers=headers)
    response = conn.getresponse()
    read = 0
    try:
        while chunk := response.read(1 << 20):
            read += len(chunk)
    except (http.client.IncompleteRead, ConnectionError) as cut:
        read += len(getattr(cut, "partial", b""))
    conn.close()
    return response.status, read, time.monotonic() - started


def rss_kib(pids: list[int]) -> int:
    largest = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    largest = max(largest, int(line.split()[1]))
        except OSError:
            continue
    return largest


def probe(port: int, token: str, stop: threading.Event, seconds: float) -> list[float]:
    """Latencies (ms) of the job list API asked one after the other."""
    times: list[float] = []
    deadline = time.monotonic() + seconds
    while not stop.is_set() and time.monotonic() < deadline:
        status, _, took = get(port, "/api/v1/jobs/?limit=20", token)
        if status == 200:
            times.append(took * 1000)
    return times


def measure(server: Server, job_id: str, token: str, size: int) -> list[Any]:
    idle = probe(server.port, token, threading.Event(), 5.0)
    stop = threading.Event()
    during: list[float] = []
    prober = threading.Thread(
        target=lambda: during.extend(probe(server.port, token, stop, 600)), daemon=True
    )
    peak = [0]

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_kib(server.worker_pids()))
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    prober.start()
    watcher.start()
    status, read, took = get(server.port, f"/api/v1/jobs/{job_id}/output/", token)
    stop.set()
    prober.join()
    watcher.join()
    complete = "yes" if read == size and status == 200 else "NO (cut off)"
    return [
        server.mode,
        status,
        f"{read / (1 << 20):.0f} / {size / (1 << 20):.0f}",
        complete,
        f"{took:.1f}",
        f"{read / (1 << 20) / took:.1f}",
        f"{lib.pct(idle, 0.5):.0f} / {lib.pct(idle, 0.99):.0f}" if idle else "—",
        f"{lib.pct(during, 0.5):.0f} / {lib.pct(during, 0.99):.0f} ({len(during)})"
        if during
        else "none answered",
        f"{peak[0] / 1024:.0f}",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    size = _size(args.size)
    from devcluster_support import DevCluster, default_dir

    dc = DevCluster.from_env_file(default_dir() / "gantry.env")
    database_url = lib.sqlite_url("gantry_bench_logstream")
    lib.sqlite_remove("gantry_bench_logstream")
    lib.django_setup(database_url)
    from django.conf import settings

    # The server verifies with the key this process encrypted the cluster's secrets with.
    secret_key = settings.SECRET_KEY
    job_id, token, path = seed(dc, size)
    env = server_env(lib.REPO, database_url=database_url, secret_key=secret_key)
    collect_static(lib.REPO, env)
    rows = []
    try:
        for mode in ("sync", "production"):
            server = Server(mode, workers=args.workers, env=env)
            try:
                rows.append(measure(server, job_id, token, size))
            finally:
                server.stop()
    finally:
        dc.run_as(ACCOUNT, ["rm", "-f", path], check=False)
    print(
        lib.table(
            rows,
            [
                "server",
                "status",
                "MiB read / size",
                "complete",
                "seconds",
                "MiB/s",
                "job list API idle p50 / p99 ms",
                "during the download p50 / p99 ms (requests)",
                "largest worker RSS MiB",
            ],
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
