"""Helpers for tests that use the real dev cluster (``scripts/devcluster``).

Plain Python, no Django. ``ensure_up()`` brings the cluster up (idempotent,
a few seconds when it already runs) and returns a :class:`DevCluster` with
what ``DIR/gantry.env`` says.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sshd_support import listener_stop

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "devcluster"


class DevClusterError(RuntimeError):
    pass


def default_dir() -> Path:
    return Path(os.environ.get("DEVCLUSTER_DIR") or REPO / "var" / "devcluster").resolve()


def parse_env_file(path: str | os.PathLike[str]) -> dict[str, str]:
    """Parse ``KEY=value`` lines (``#`` comments and blank lines ignored)."""
    env: dict[str, str] = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        env[key.strip()] = value.strip()
    return env


@dataclass(frozen=True)
class DevCluster:
    dir: Path
    name: str
    host: str
    port: int
    user: str
    key: Path
    known_hosts: Path
    host_fingerprint: str
    workdir: str
    python: str
    python_ready: bool
    default_partition: str
    slurm_cluster_name: str
    slurm_conf: str
    # Unix users the researchers' work runs as (the service account is ``user``).
    researchers: tuple[str, ...]
    trusted_ca_keys: Path
    env: dict[str, str] = field(repr=False, compare=False, hash=False)

    @classmethod
    def from_env_file(cls, path: str | os.PathLike[str]) -> DevCluster:
        env = parse_env_file(path)
        return cls(
            dir=Path(env["DEVCLUSTER_DIR"]),
            name=env["GANTRY_CLUSTER_NAME"],
            host=env["GANTRY_CLUSTER_HOST"],
            port=int(env["GANTRY_CLUSTER_PORT"]),
            user=env["GANTRY_CLUSTER_USER"],
            key=Path(env["GANTRY_CLUSTER_KEY"]),
            known_hosts=Path(env["GANTRY_CLUSTER_KNOWN_HOSTS"]),
            host_fingerprint=env["GANTRY_CLUSTER_HOST_FINGERPRINT"],
            workdir=env["GANTRY_CLUSTER_WORKDIR"],
            python=env["GANTRY_CLUSTER_PYTHON"],
            python_ready=env.get("DEVCLUSTER_PYTHON_READY") == "1",
            default_partition=env["GANTRY_CLUSTER_DEFAULT_PARTITION"],
            slurm_cluster_name=env.get("GANTRY_CLUSTER_SLURM_NAME", "gantrydev"),
            slurm_conf=env["SLURM_CONF"],
            researchers=tuple(filter(None, env.get("GANTRY_CLUSTER_RESEARCHERS", "").split(","))),
            trusted_ca_keys=Path(
                env.get("DEVCLUSTER_TRUSTED_CA_KEYS")
                or Path(env["DEVCLUSTER_DIR"]) / "ssh" / "trusted_user_ca_keys"
            ),
            env=env,
        )

    # ------------------------------------------------------------ commands
    def script(self, *args: str, check: bool = True, timeout: float = 120) -> str:
        """Run ``scripts/devcluster ARGS... DIR``; return its stdout."""
        return run_script(*args, dir=self.dir, check=check, timeout=timeout).stdout

    def slurm_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["SLURM_CONF"] = self.slurm_conf
        return env

    def slurm(
        self, args: Sequence[str] | str, *, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command locally as root, with SLURM_CONF set.

        ``cluster.slurm(["scontrol", "ping"])`` or ``cluster.slurm("sinfo -N")``.
        """
        argv = shlex.split(args) if isinstance(args, str) else list(args)
        return _run(argv, env=self.slurm_env(), check=check, timeout=timeout)

    def wait_quiet(self, timeout: float = 120) -> None:
        """Wait until no job is in the queue and every node is idle again, so a test
        starts from the same cluster whatever ran before it."""

        def quiet() -> bool:
            queue = self.slurm(["squeue", "-h", "-o", "%i"], check=False).stdout.strip()
            states = self.slurm(["sinfo", "-h", "-N", "-o", "%T"], check=False).stdout.split()
            return not queue and bool(states) and all(state == "idle" for state in states)

        wait_for(quiet, timeout=timeout, interval=0.5, message="an idle dev cluster")

    def run_as_cluster_user(
        self, cmd: Sequence[str] | str, *, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run a command locally as the cluster user (in its work directory)."""
        return self.run_as(self.user, cmd, check=check, timeout=timeout)

    def run_as(
        self, user: str, cmd: Sequence[str] | str, *, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run a command locally as Unix user ``user`` (in the work directory)."""
        argv = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
        full = [
            "runuser",
            "-u",
            user,
            "--",
            "env",
            f"SLURM_CONF={self.slurm_conf}",
            "PATH=/usr/local/bin:/usr/bin:/bin",
            f"HOME={pwd.getpwnam(user).pw_dir}",
            *argv,
        ]
        return _run(full, env=self.slurm_env(), check=check, timeout=timeout, cwd=self.workdir)

    def trust_user_ca(self, public_key_line: str) -> None:
        """What the login node's admin does: trust this user CA (idempotent, a few ms)."""
        if not public_key_line.strip():
            raise DevClusterError("no user CA public key to trust")
        _run(
            [str(SCRIPT), "trust-ca", str(self.dir)],
            input_text=public_key_line.strip() + "\n",
            timeout=60,
        )

    def pids(self) -> dict[str, int]:
        """The pids recorded in DIR/run/*.pid."""
        out: dict[str, int] = {}
        for p in sorted((self.dir / "run").glob("*.pid")):
            try:
                out[p.stem] = int(p.read_text().strip())
            except ValueError:
                continue
        return out

    def status(self) -> subprocess.CompletedProcess[str]:
        return run_script("status", dir=self.dir, check=False)

    @property
    def shims(self) -> Path:
        """A directory first on the cluster user's PATH over SSH (for fault tests)."""
        return Path(self.env.get("DEVCLUSTER_SHIMS") or self.dir / "shims")

    @contextlib.contextmanager
    def shim(self, name: str, script: str) -> Iterator[Path]:
        """Put a stand-in for the login node's command ``name`` in place for the block:
        every SSH command Gantry runs finds it before the real one."""
        self.shims.mkdir(parents=True, exist_ok=True)
        path = self.shims / name
        path.write_text(script)
        path.chmod(0o755)
        try:
            yield path
        finally:
            path.unlink(missing_ok=True)

    def sshd_stop(self) -> None:
        self.script("stop-sshd")

    def sshd_start(self) -> None:
        self.script("start-sshd")

    def restart_slurmctld(self) -> None:
        self.script("restart-slurmctld")

    def ssh_client(self, timeout: float = 10) -> Any:
        """A connected paramiko SSHClient (known_hosts + RejectPolicy)."""
        import paramiko

        client = paramiko.SSHClient()
        client.load_host_keys(str(self.known_hosts))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(
            self.host,
            port=self.port,
            username=self.user,
            key_filename=str(self.key),
            look_for_keys=False,
            allow_agent=False,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
        )
        return client


class LoginNode:
    """A login node of a test's own: a second sshd of the dev cluster on a free port of its
    own, with the main one's host key, users and trust (the same sshd_config, but its port,
    pid file and shims directory), so a test can stop it or put stand-ins in front of the
    login node's commands without disturbing any other test sharing the cluster. Gantry
    reaches it like any login node: register the cluster with ``port``."""

    def __init__(self, cluster: DevCluster) -> None:
        self.cluster = cluster
        self.port = _free_port()
        self.dir = cluster.dir / "login-nodes" / str(self.port)
        self.shims = self.dir / "shims"
        self.config = self.dir / "sshd_config"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> LoginNode:
        self.shims.mkdir(parents=True, exist_ok=True)
        for path in (self.dir.parent, self.dir, self.shims):
            path.chmod(0o755)
        main = (self.cluster.dir / "ssh" / "sshd_config").read_text()
        main_shims = f"PATH={self.cluster.shims}:"
        if main_shims not in main or "\nPort " not in main:
            raise DevClusterError("the dev cluster's sshd_config has no Port or shims PATH")
        lines = []
        for line in main.splitlines():
            if line.startswith("Port "):
                line = f"Port {self.port}"
            elif line.startswith("PidFile "):
                line = f"PidFile {self.dir / 'sshd.pid'}"
            lines.append(line.replace(main_shims, f"PATH={self.shims}:"))
        self.config.write_text("\n".join(lines) + "\n")
        self.config.chmod(0o644)
        self.sshd_start()
        return self

    def sshd_start(self) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        log = self.dir / "sshd.log"
        self.process = subprocess.Popen(
            ["/usr/sbin/sshd", "-D", "-f", str(self.config), "-E", str(log)],
            stdin=subprocess.DEVNULL,
        )

        def listening() -> bool:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 1),
            ):
                return True
            return False

        wait_for(listening, timeout=20, interval=0.1, message=f"an sshd on port {self.port}")

    def sshd_stop(self) -> None:
        """Like a login node going away: the listener stops and its sessions are cut."""
        listener_stop(self.process)

    @contextlib.contextmanager
    def shim(self, name: str, script: str) -> Iterator[Path]:
        """A stand-in for the login node's command ``name``, for this login node only."""
        path = self.shims / name
        path.write_text(script)
        path.chmod(0o755)
        try:
            yield path
        finally:
            path.unlink(missing_ok=True)

    def close(self) -> None:
        self.sshd_stop()
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run(
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    check: bool = True,
    timeout: float = 60,
    cwd: str | os.PathLike[str] | None = None,
    input_text: str | None = None,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        list(argv),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        **({"input": input_text} if input_text is not None else {"stdin": subprocess.DEVNULL}),
    )
    if check and proc.returncode != 0:
        raise DevClusterError(
            f"{shlex.join(argv)} exited {proc.returncode}\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc


def run_script(
    *args: str,
    dir: str | os.PathLike[str] | None = None,
    check: bool = True,
    timeout: float = 600,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``scripts/devcluster ARGS... DIR`` (``env``: added to this environment)."""
    d = Path(dir) if dir is not None else default_dir()
    full = {**os.environ, **env} if env else None
    return _run([str(SCRIPT), *args, str(d)], check=check, timeout=timeout, env=full)


def ensure_up(dir: str | os.PathLike[str] | None = None, *, python: bool = True) -> DevCluster:
    """Bring the dev cluster up (idempotent) and describe it.

    ``python=False`` (or env DEVCLUSTER_PYTHON=0) skips building the job venv.
    """
    d = Path(dir) if dir is not None else default_dir()
    args = ["up"] if python else ["up", "--no-python"]
    run_script(*args, dir=d, timeout=900)
    return DevCluster.from_env_file(d / "gantry.env")


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 30,
    interval: float = 0.25,
    message: str | None = None,
) -> Any:
    """Poll ``predicate`` until it returns something truthy; return that value."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = predicate()
        except Exception as exc:
            value = None
            last_exc = exc
        if value:
            return value
        if time.monotonic() >= deadline:
            what = message or getattr(predicate, "__name__", "condition")
            raise TimeoutError(
                f"{what} not met within {timeout}s"
                + (f" (last error: {last_exc!r})" if last_exc else "")
            )
        time.sleep(interval)


# module-level shorthands using the default directory
def _default() -> DevCluster:
    return DevCluster.from_env_file(default_dir() / "gantry.env")


def run_as_cluster_user(cmd: Sequence[str] | str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return _default().run_as_cluster_user(cmd, **kw)


def slurm(cmd_args: Sequence[str] | str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return _default().slurm(cmd_args, **kw)


def sshd_stop(dir: str | os.PathLike[str] | None = None) -> None:
    run_script("stop-sshd", dir=dir)


def sshd_start(dir: str | os.PathLike[str] | None = None) -> None:
    run_script("start-sshd", dir=dir)


def restart_slurmctld(dir: str | os.PathLike[str] | None = None) -> None:
    run_script("restart-slurmctld", dir=dir)


def owner_and_private_mode(path: str | os.PathLike[str], readers: set[str]) -> tuple[str, int]:
    """``path``'s owner and mode as its ACL has it: the group bits of ``stat`` show the ACL
    mask when named entries exist, so the owning group's own entry (``group::``) stands for
    them here. Named users other than ``readers`` (the service account, the verifier) fail
    the check outright: nobody else may be let in."""
    import pwd
    import stat

    info = os.stat(path)
    mode = stat.S_IMODE(info.st_mode)
    out = subprocess.run(
        ["getfacl", "-p", "--omit-header", "--", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    bits = {"r": 4, "w": 2, "x": 1}
    for line in out.splitlines():
        kind, _, rest = line.partition(":")
        name, _, perms = rest.partition(":")
        perms = perms.split()[0] if perms else ""
        if kind == "user" and name:
            assert name in readers, f"{path}: {name} may read it ({line})"
        if kind == "group" and not name:
            group = sum(bits.get(c, 0) for c in perms)
            mode = (mode & ~0o070) | (group << 3)
    return pwd.getpwuid(info.st_uid).pw_name, mode


def slurm_jobs_named(cluster: DevCluster, names: set[str]) -> list[str]:
    """The ids of the jobs in the queue (any user's) whose name is one of ``names``."""
    out = cluster.slurm(["squeue", "-h", "-o", "%i %j"], check=False).stdout
    return [
        fields[0]
        for fields in (line.split() for line in out.splitlines())
        if len(fields) == 2 and fields[1] in names
    ]


def devcluster_env() -> dict[str, str]:
    """What ``DIR/gantry.env`` says (the dev cluster's accounts, paths)."""
    return parse_env_file(default_dir() / "gantry.env")
