"""Start a real Celery worker (and beat, where a test needs it) against the test database."""

from __future__ import annotations

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


class CeleryProcess:
    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

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
        return self.log_path.read_text(errors="replace")


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


def start_beat(
    *, database_url: str, log_path: Path, extra_env: dict[str, str] | None = None
) -> CeleryProcess:
    command = ["beat", f"--schedule={log_path.parent / 'celerybeat-schedule'}"]
    return _celery(command, database_url=database_url, log_path=log_path, extra_env=extra_env)


def flush_test_broker() -> None:
    """Drop tasks a previous test run left in the test Redis database."""
    import redis
    from django.conf import settings

    prefix = settings.CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"]
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    try:
        # Only this run's keys: another run on the same machine keeps its queues.
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(key)
    finally:
        client.close()


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
