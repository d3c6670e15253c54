"""Start a real Celery worker (and beat, where a test needs it) against the test database."""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# Fast cycles for tests that run the real worker and beat.
STACK_ENV = {
    "GANTRY_RECONCILE_INTERVAL": "1",
    "GANTRY_SYNC_INTERVAL": "30",
    "GANTRY_SUBMIT_REQUEUE_AFTER": "20",
    "GANTRY_DRILL_POLICY_INTERVAL": "2",
    "GANTRY_DRILL_SUBMIT_RETRIES": "2",
    "GANTRY_SUBMIT_UNKNOWN_GRACE": "20",
}


def database_url_for(settings_dict: dict[str, Any]) -> str:
    engine = settings_dict["ENGINE"]
    if engine.endswith("sqlite3"):
        return f"sqlite:///{settings_dict['NAME']}"
    user = settings_dict.get("USER") or ""
    password = settings_dict.get("PASSWORD") or ""
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    port = f":{settings_dict['PORT']}" if settings_dict.get("PORT") else ""
    return (
        f"postgres://{auth}{settings_dict.get('HOST') or '127.0.0.1'}{port}/{settings_dict['NAME']}"
    )


# Run a command so that it gets SIGTERM when the pytest process that started it dies,
# however it dies (Linux's PR_SET_PDEATHSIG, kept across exec): no worker outlives its run.
DIE_WITH_PARENT = [
    sys.executable,
    "-c",
    "import ctypes, os, signal, sys; "
    "ctypes.CDLL('libc.so.6').prctl(1, signal.SIGTERM); "
    "os.execv(sys.argv[1], sys.argv[1:])",
]


class CeleryProcess:
    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = log_path.open("wb")
        # Where this test's part of the log starts (a shared worker serves many tests).
        self._log_from = 0
        self.process = subprocess.Popen(
            [*DIE_WITH_PARENT, *argv],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def mark_log(self) -> None:
        """From now on ``log()`` reads only what is written after this point."""
        self._log.flush()
        self._log_from = self.log_path.stat().st_size if self.log_path.exists() else 0

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._log.close()

    def kill(self) -> None:
        """SIGKILL, as a crash would: no clean shutdown, no acks."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def log(self) -> str:
        with self.log_path.open("rb") as handle:
            handle.seek(self._log_from)
            return handle.read().decode(errors="replace")


def _celery(
    command: list[str], *, database_url: str, log_path: Path, extra_env: dict[str, str] | None
) -> CeleryProcess:
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "controlplane.settings_test",
            "DATABASE_URL": database_url,
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra_env or {})
    argv = [sys.executable, "-m", "celery", "-A", "controlplane", *command, "--loglevel=INFO"]
    return CeleryProcess(argv, env, log_path)


def start_worker(
    *,
    database_url: str,
    log_path: Path,
    extra_env: dict[str, str] | None = None,
    name: str = "w1",
    queues: list[str] | None = None,
) -> CeleryProcess:
    """A worker of the test's own: the shared stack (which would take its tasks) stops
    first, and starts again when a test next asks for it."""
    SHARED.stop()
    return _start_worker(
        database_url=database_url, log_path=log_path, extra_env=extra_env, name=name, queues=queues
    )


def start_beat(
    *, database_url: str, log_path: Path, extra_env: dict[str, str] | None = None
) -> CeleryProcess:
    """A beat of the test's own (the shared stack stops first, as for ``start_worker``)."""
    SHARED.stop()
    return _start_beat(database_url=database_url, log_path=log_path, extra_env=extra_env)


def _start_worker(
    *,
    database_url: str,
    log_path: Path,
    extra_env: dict[str, str] | None = None,
    name: str = "w1",
    queues: list[str] | None = None,
) -> CeleryProcess:
    """A worker consuming ``queues``; None: every queue in CELERY_TASK_QUEUES (the default
    one and the notifications queue), as ``make run``'s worker does."""
    command = [
        "worker",
        "--pool=solo",
        "--concurrency=1",
        "--without-gossip",
        "--without-mingle",
        f"--hostname={name}@%h",
    ]
    if queues is not None:
        command.append(f"--queues={','.join(queues)}")
    return _celery(command, database_url=database_url, log_path=log_path, extra_env=extra_env)


def _start_beat(
    *, database_url: str, log_path: Path, extra_env: dict[str, str] | None = None
) -> CeleryProcess:
    command = ["beat", f"--schedule={log_path.parent / 'celerybeat-schedule'}"]
    return _celery(command, database_url=database_url, log_path=log_path, extra_env=extra_env)


def flush_test_broker() -> None:
    """Drop tasks a previous test left in this run's queues of the test Redis database.
    The queues' bindings stay: a worker that declared them at start keeps receiving."""
    import redis
    from django.conf import settings

    prefix = settings.CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"]
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    try:
        # Only this run's keys: another run on the same machine keeps its queues.
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            if b"_kombu.binding." not in key:
                client.delete(key)
    finally:
        client.close()


class SharedStack:
    """One worker and one beat per pytest process (per xdist worker), started the first
    time a test asks for them and kept for the next tests: booting Django twice per test
    was most of a short cluster test's time. A test that starts workers of its own stops
    them first (``start_worker``); the next test that asks starts them again.

    Between tests ``drain`` waits until the worker has finished what it was doing (a ping
    answered by the one solo worker), so nothing of the last test is still being written
    when its rows are flushed."""

    def __init__(self) -> None:
        self.worker: CeleryProcess | None = None
        self.beat: CeleryProcess | None = None
        self.database_url = ""
        self.starts = 0

    def ensure(self, *, database_url: str, log_dir: Path) -> dict[str, CeleryProcess]:
        running = self.worker is not None and self.worker.alive and self.beat is not None
        if running and self.beat is not None and self.beat.alive:
            if self.database_url == database_url:
                return self.processes()
        self.stop()
        flush_test_broker()
        log_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        self.database_url = database_url
        self.worker = _start_worker(
            database_url=database_url,
            log_path=log_dir / f"worker-{self.starts}.log",
            extra_env=STACK_ENV,
        )
        self.beat = _start_beat(
            database_url=database_url,
            log_path=log_dir / f"beat-{self.starts}.log",
            extra_env=STACK_ENV,
        )
        return self.processes()

    def processes(self) -> dict[str, CeleryProcess]:
        assert self.worker is not None and self.beat is not None
        return {"worker": self.worker, "beat": self.beat}

    def mark_logs(self) -> None:
        for process in (self.worker, self.beat):
            if process is not None:
                process.mark_log()

    @property
    def running(self) -> bool:
        return self.worker is not None and self.worker.alive

    def drain(self, timeout: float = 120) -> None:
        """Wait for the worker to answer a ping (it runs one task at a time)."""
        if not self.running:
            return
        from core.tasks import ping

        try:
            ping.apply_async().get(timeout=timeout)
        except Exception:
            # A worker that cannot answer is started afresh for the next test.
            self.stop()

    def stop(self) -> None:
        for process in (self.beat, self.worker):
            if process is not None:
                process.stop()
        self.worker = self.beat = None


SHARED = SharedStack()
# A run that ends (or an xdist worker that stops) takes its shared pair with it.
atexit.register(SHARED.stop)


def wait_until(
    predicate: Any, *, timeout: float, interval: float = 0.2, what: Any = "condition"
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            description = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout}s waiting for {description}")
        time.sleep(interval)
