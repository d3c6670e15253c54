"""Watcher cost at fleet scale: one cycle's reading of run directories with 1, 10 and 100
active accounts and 1,000 running jobs, before (per-account listing and reads, as each
account) and after (the batched reader as the service account), side by side.

    .venv/bin/python bench/watcher_cost_bench.py [--accounts 1,10,100] [--jobs 1000]
        [--cycles 3] [--keep]

Needs root (it creates the Unix accounts gbench001.. with useradd and removes them at the
end, and runs commands as them with runuser) and setfacl. No dev cluster, no SSH: this is
a MODEL that runs the real code paths (``runs.rundir.RunDirectories`` and
``jobs.rundir.run_files_read``, as ``watcher.cycle`` calls them, on Job rows in a bench
SQLite database) against a real tree of 0700 areas owned by those accounts under a temp
work directory, with a transport that runs each remote command here as its account (the
shell listing under bash, the batched reader under the account ``gantry``, each SFTP read
as ``tail -c | head -c``). Counted exactly: remote commands and SFTP reads as the code
issues them, and the identities used in order; SSH logins are modelled as the pool does
them (one connection per identity, at most 8 per login node, the least recently used
closed to make room, the pool warm from the cycle before). Wall time is this machine's
(process starts, no SSH handshake); ``est. wall`` adds the logins at the cost of one real
SSH login to the dev cluster's sshd, measured once when it is up. Not counted: squeue and
sacct (one each per cycle whatever the accounts; see reconcile_bench.py).
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as lib

SERVICE = "gantry"
POOL = 8
LINE = b'{"step": %d, "time": 1800000000, "loss": 2.5}\n'


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accounts", default="1,10,100")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the bench database")
    args = parser.parse_args()
    args.accounts = [int(n) for n in args.accounts.split(",")]
    return args


@dataclass
class _Result:
    rc: int
    stdout: str
    stderr: str = ""


class Meter:
    """What a cycle cost: commands, SFTP reads, and logins under the pool model."""

    def __init__(self) -> None:
        self.pool: OrderedDict[str, None] = OrderedDict()
        self.reset()

    def reset(self) -> None:
        self.commands = self.reads = self.logins = 0

    def use(self, identity: str) -> None:
        if identity in self.pool:
            self.pool.move_to_end(identity)
            return
        self.logins += 1
        self.pool[identity] = None
        while len(self.pool) > POOL:
            self.pool.popitem(last=False)


class LocalAs:
    """A transport that runs each command here as ``account`` (see the module docstring)."""

    def __init__(self, account: str, meter: Meter) -> None:
        self.account, self.meter = account, meter
        self.config = type("Config", (), {"user": account})()

    def _run(self, argv: Sequence[str], stdin: bytes | None = None) -> _Result:
        self.meter.use(self.account)
        self.meter.commands += 1
        done = subprocess.run(
            ["runuser", "-u", self.account, "--", *argv], input=stdin, capture_output=True
        )
        return _Result(done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode())

    def exec_shell(self, script: str, **_: Any) -> _Result:
        # On stdin: as one argument (sshd runs ``$SHELL -c <command>``) a listing of more
        # than ~130 directories is over Linux's 128 KiB limit for one argument.
        return self._run(["bash", "-s"], script.encode())

    def exec(self, argv: Sequence[str], *, stdin: bytes | None = None, **_: Any) -> _Result:
        result = self._run(argv, stdin)
        if result.rc != 0:
            from slurm.errors import SlurmCommandError

            raise SlurmCommandError(result.stderr[:300], argv=list(argv), rc=result.rc)
        return result

    def read_from(self, path: str, offset: int, max_bytes: int = 1 << 20) -> bytes:
        self.meter.use(self.account)
        self.meter.reads += 1
        script = 'tail -c +"$1" -- "$2" | head -c "$3"'
        arguments = [str(offset + 1), path, str(max_bytes)]
        argv = ["runuser", "-u", self.account, "--", "bash", "-c", script, "-", *arguments]
        done = subprocess.run(argv, capture_output=True)
        return done.stdout


def make_accounts(count: int) -> list[str]:
    names = [f"gbench{i:03d}" for i in range(1, count + 1)]
    for name in names:
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", name], check=True)
    return names


def remove_accounts(names: list[str]) -> None:
    for name in names:
        subprocess.run(["userdel", name], check=False, capture_output=True)
    print(f"# removed {len(names)} Unix accounts")


def build_tree(workdir: Path, jobs: list[Any], accounts: list[str]) -> None:
    """Each account's 0700 area with the service account's grant (as Gantry makes it), and
    each job's run directory with a metrics file, owned by the job's account."""
    for account in accounts:
        area = workdir / "users" / account
        (area / "runs").mkdir(parents=True, exist_ok=True)
    for job in jobs:
        run = workdir / "users" / job.run_as / "runs" / str(job.id)
        run.mkdir(exist_ok=True)
        (run / "metrics.jsonl").write_bytes(b"".join(LINE % s for s in range(1, 11)))
    for account in accounts:
        area = workdir / "users" / account
        subprocess.run(["chown", "-R", f"{account}:", str(area)], check=True)
        area.chmod(0o700)
        entry = f"u:{SERVICE}:rX"
        subprocess.run(["setfacl", "-R", "-m", f"{entry},d:{entry}", str(area)], check=True)


def measure(
    cluster: Any, jobs: list[Any], workdir: Path, batched: bool, cycles: int
) -> dict[str, Any]:
    from unittest import mock

    from jobs.models import Job
    from jobs.rundir import run_files_read
    from runs.rundir import RunDirectories
    from runs.rundir_batch import BatchReader

    meter = Meter()
    owners: dict[str, LocalAs] = {}
    service = LocalAs(SERVICE, meter)

    def transport_as(_cluster: Any, account: str) -> LocalAs:
        return owners.setdefault(account, LocalAs(account, meter))

    rows: list[tuple[int, int, int, float, int]] = []
    with mock.patch("jobs.rundir.transport_as", transport_as):
        for cycle in range(cycles + 1):
            for job in jobs:  # one new line per job and cycle
                path = workdir / "users" / job.run_as / "runs" / str(job.id) / "metrics.jsonl"
                with open(path, "ab") as handle:
                    handle.write(LINE % (100 + cycle))
            fresh = list(Job.objects.filter(id__in=[j.id for j in jobs]).select_related("cluster"))
            batch = (
                BatchReader(
                    service,
                    workdir=str(workdir),
                    service_account=SERVICE,
                    python="/usr/bin/python3",
                )
                if batched
                else None
            )
            meter.reset()
            started = time.perf_counter()
            listing = RunDirectories(batch=batch)
            files = run_files_read(cluster=cluster, jobs=fresh, listing=listing)
            seconds = time.perf_counter() - started
            assert not files.errors, files.errors[:3]
            if cycle:  # the first warms the pool, as the cycle before would have
                rows.append(
                    (meter.commands, meter.reads, meter.logins, seconds, files.metric_points)
                )
    return {
        "commands": lib.med([r[0] for r in rows]),
        "reads": lib.med([r[1] for r in rows]),
        "logins": lib.med([r[2] for r in rows]),
        "seconds": lib.med([r[3] for r in rows]),
        "points": rows[-1][4],
    }


def login_seconds() -> float | None:
    """One real SSH login to the dev cluster's sshd as the service account (if it is up)."""
    key = Path("var/devcluster/ssh/id_ed25519")
    known = Path("var/devcluster/ssh/known_hosts")
    if not key.exists():
        return None
    argv = ["ssh", "-i", str(key), "-p", "2222", "-o", f"UserKnownHostsFile={known}"]
    argv += ["-o", "BatchMode=yes", f"{SERVICE}@127.0.0.1", "true"]
    times = []
    for _ in range(3):
        started = time.perf_counter()
        if subprocess.run(argv, capture_output=True, timeout=30).returncode != 0:
            return None
        times.append(time.perf_counter() - started)
    return lib.med(times)


HEADER = [
    "accounts",
    "jobs",
    "path",
    "commands",
    "sftp reads",
    "logins",
    "wall s",
    "est. wall s",
    "points/cycle",
]


def fresh_jobs(cluster: Any, owner: Any, accounts: list[str], count: int, jobs: int) -> list[Any]:
    """Fresh running jobs (nothing read yet) spread over the first ``count`` accounts."""
    from jobs.models import Job

    Job.objects.filter(cluster=cluster).update(state=Job.State.CANCELLED, files_final=True)
    Job.objects.bulk_create(
        Job(
            owner=owner,
            cluster=cluster,
            name=f"wcost-{count}-{i}",
            config={},
            partition="batch",
            state=Job.State.RUNNING,
            slurm_job_id=str(count * 100000 + i),
            run_as=accounts[i % count],
        )
        for i in range(jobs)
    )
    return list(Job.objects.filter(cluster=cluster, state=Job.State.RUNNING))


def run_sizes(args: argparse.Namespace, top: Path, accounts: list[str]) -> list[list[Any]]:
    from nodes.models import Cluster

    cluster = Cluster.objects.create(
        name="wcost",
        ssh_host="127.0.0.1",
        ssh_user=SERVICE,
        ssh_key_name="none",
        workdir=str(top),
        python="/usr/bin/python3",
    )
    owner = lib.make_user("bench-wcost", "researchers")
    login_s = login_seconds()
    print(f"# one SSH login to the dev cluster: {login_s:.3f} s" if login_s else "# no login")
    table = []
    for count in args.accounts:
        jobs = fresh_jobs(cluster, owner, accounts, count, args.jobs)
        build_tree(top, jobs, accounts[:count])
        for batched in (False, True):
            got = measure(cluster, jobs, top, batched, args.cycles)
            estimate = got["seconds"] + got["logins"] * (login_s or 0)
            path = "after (batched)" if batched else "before (per account)"
            table.append(
                [
                    count,
                    args.jobs,
                    path,
                    got["commands"],
                    got["reads"],
                    got["logins"],
                    f"{got['seconds']:.2f}",
                    f"{estimate:.2f}" if login_s else "-",
                    got["points"],
                ]
            )
    return table


def main() -> int:
    args = parse_args()
    if os.geteuid() != 0 or shutil.which("setfacl") is None:
        print("needs root and setfacl")
        return 2
    name, url = lib.bench_database("sqlite", "watcher-cost")
    lib.django_setup(url)
    accounts = make_accounts(max(args.accounts))
    top = Path(tempfile.mkdtemp(prefix="gantry-wcost-"))
    try:
        top.chmod(0o755)
        (top / "users").mkdir()
        (top / "users").chmod(0o1777)
        table = run_sizes(args, top, accounts)
        print(lib.table(table, HEADER))
        after = [row for row in table if row[2].startswith("after")]
        flat = len({(row[3], row[5]) for row in after}) == 1
        verdict = "MET" if flat else "NOT MET"
        print(f"goal: commands and logins flat in the number of accounts (after): {verdict}")
    finally:
        shutil.rmtree(top, ignore_errors=True)
        remove_accounts(accounts)
        if not args.keep:
            lib.bench_database_drop("sqlite", name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
