"""A quiet quickstart: the env file ``make run`` writes and ``manage.py`` reads in
development only, and the log filter that keeps periodic tasks off the console."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from controlplane.env import development_env, read_env_file
from controlplane.logfilters import QuietPeriodic

REPO = Path(__file__).resolve().parents[2]


def env_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "dev.env"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_read_env_file(tmp_path: Path) -> None:
    path = env_file(
        tmp_path,
        "# comment\n\nDEBUG=true\nexport GANTRY_DATA_DIR='/tmp/a b'\nREDIS_URL=\"redis://x:1/0\"\n"
        "ODD=$(touch /tmp/never)\n",
    )
    assert read_env_file(path) == {
        "DEBUG": "true",
        "GANTRY_DATA_DIR": "/tmp/a b",
        "REDIS_URL": "redis://x:1/0",
        # Never expanded or run: a literal value.
        "ODD": "$(touch /tmp/never)",
    }
    with pytest.raises(ImproperlyConfigured, match=r"dev.env:1 is not a NAME=value line"):
        read_env_file(env_file(tmp_path, "just words\n"))


def test_read_only_in_development(tmp_path: Path) -> None:
    path = env_file(tmp_path, "DEBUG=true\nGANTRY_DATA_DIR=/tmp/dev\nREDIS_URL=redis://r:1/0\n")
    assert development_env(path, environ={}) == {
        "DEBUG": "true",
        "GANTRY_DATA_DIR": "/tmp/dev",
        "REDIS_URL": "redis://r:1/0",
    }
    # The environment wins over the file.
    assert development_env(path, environ={"REDIS_URL": "redis://mine:2/0"}) == {
        "DEBUG": "true",
        "GANTRY_DATA_DIR": "/tmp/dev",
    }
    # DEBUG off in the environment (production): not read at all.
    assert development_env(path, environ={"DEBUG": "false"}) == {}
    assert development_env(tmp_path / "missing.env", environ={}) == {}
    # A file that does not say it is development is not used.
    other = env_file(tmp_path, "DEBUG=false\nGANTRY_DATA_DIR=/tmp/x\n")
    assert development_env(other, environ={}) == {}
    assert development_env(env_file(tmp_path, "GANTRY_DATA_DIR=/tmp/x\n"), environ={}) == {}


def test_a_file_others_may_read_is_refused(tmp_path: Path) -> None:
    path = env_file(tmp_path, "DEBUG=true\n", mode=0o644)
    with pytest.raises(ImproperlyConfigured, match="mode 0600"):
        development_env(path, environ={})


def _manage(
    *args: str, env_path: Path | None, extra: dict[str, str]
) -> subprocess.CompletedProcess:
    environ = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DEBUG", "SECRET_KEY", "SECRET_KEY_FILE", "DJANGO_SETTINGS_MODULE"}
        and not key.startswith("GANTRY_")
    }
    environ["GANTRY_DEV_ENV_FILE"] = str(env_path) if env_path else "/nonexistent/dev.env"
    environ.update(extra)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_manage_py_reads_it_outside_make_run(tmp_path: Path) -> None:
    data = tmp_path / "data"
    path = env_file(
        tmp_path, f"DEBUG=true\nGANTRY_DATA_DIR={data}\nDATABASE_URL=sqlite:///{tmp_path}/g.db\n"
    )
    # Without the file a management command stops at the missing production secret...
    bare = _manage("check", env_path=None, extra={})
    assert bare.returncode == 2 and "SECRET_KEY" in bare.stderr
    # ...with it, the README's commands work in a shell of their own.
    done = _manage("check", env_path=path, extra={})
    assert done.returncode == 0, done.stderr
    assert data.is_dir()
    # Production (DEBUG off) never takes development settings from the file.
    production = _manage("check", env_path=path, extra={"DEBUG": "false"})
    assert production.returncode == 2 and "SECRET_KEY" in production.stderr


def _record(name: str, level: int, message: str = "m") -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, None, None)


@pytest.mark.parametrize(
    ("name", "level", "shown"),
    [
        ("celery.beat", logging.INFO, False),
        ("celery.app.trace", logging.INFO, False),
        ("celery.worker.strategy", logging.INFO, False),
        ("django.server", logging.INFO, False),
        ("slurm.transport", logging.INFO, False),
        ("celery.app.trace", logging.ERROR, True),
        ("django.server", logging.WARNING, True),
        ("runs.lifecycle.kind", logging.INFO, True),
        ("watcher.cycle", logging.WARNING, True),
        ("celery.apps.worker", logging.INFO, True),
    ],
)
def test_the_quiet_filter(name: str, level: int, shown: bool) -> None:
    assert QuietPeriodic().filter(_record(name, level)) is shown


def test_a_state_change_is_one_log_line(caplog: pytest.LogCaptureFixture, db: object) -> None:
    from factories import JobFactory
    from jobs.lifecycle import JOBS
    from jobs.models import Job

    job = JobFactory(state=Job.State.PENDING)
    caplog.set_level(logging.INFO, logger="runs.lifecycle.kind")
    assert JOBS.transition(job, Job.State.RUNNING, message="on n1")
    lines = [r.getMessage() for r in caplog.records if r.name == "runs.lifecycle.kind"]
    assert lines == [f"job {job.id}: pending -> running (on n1)"]
    assert QuietPeriodic().filter(caplog.records[-1])
