"""Configuration mistakes stop start-up with one clear line, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DJANGO_", "DATABASE_URL", "REDIS_URL", "CELERY_", "SECRET_KEY"))
        and key not in {"DEBUG", "ALLOWED_HOSTS", "GANTRY_TLS"}
    }
    base["DJANGO_SETTINGS_MODULE"] = "controlplane.settings"
    base.update(env)
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=base,
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_one_clear_line(result: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for text in expected:
        assert text in lines[0]


def test_missing_secret_key_in_production(tmp_path: Path) -> None:
    result = manage("check", env={"DEBUG": "false", "GANTRY_DATA_DIR": str(tmp_path)})
    assert_one_clear_line(result, "configuration error", "SECRET_KEY", "DEBUG is off")


def test_malformed_database_url(tmp_path: Path) -> None:
    result = manage(
        "check",
        env={"DEBUG": "true", "DATABASE_URL": "postgres//oops", "GANTRY_DATA_DIR": str(tmp_path)},
    )
    assert_one_clear_line(result, "configuration error", "DATABASE_URL")


def test_bad_boolean(tmp_path: Path) -> None:
    result = manage("check", env={"DEBUG": "perhaps", "GANTRY_DATA_DIR": str(tmp_path)})
    assert_one_clear_line(result, "DEBUG='perhaps' is not a boolean")


def test_unreachable_redis_stops_preflight(tmp_path: Path) -> None:
    result = manage(
        "preflight",
        env={
            "DEBUG": "true",
            "GANTRY_DATA_DIR": str(tmp_path),
            # Port 1 on loopback: nothing listens there.
            "REDIS_URL": "redis://127.0.0.1:1/0",
        },
    )
    assert_one_clear_line(result, "Redis at redis://127.0.0.1:1/0 does not answer")


def test_unreachable_database_stops_preflight(tmp_path: Path) -> None:
    result = manage(
        "preflight",
        env={
            "DEBUG": "true",
            "GANTRY_DATA_DIR": str(tmp_path),
            "DATABASE_URL": "postgres://nobody@127.0.0.1:1/nothing",
        },
    )
    assert_one_clear_line(result, "the database does not answer", "DATABASE_URL")


@pytest.mark.integration
def test_preflight_passes_with_real_redis(tmp_path: Path) -> None:
    result = manage("preflight", env={"DEBUG": "true", "GANTRY_DATA_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "preflight ok" in result.stdout


def test_production_settings_pass_check_deploy(tmp_path: Path) -> None:
    result = manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        env={
            "DEBUG": "false",
            "SECRET_KEY": "a" * 20 + "-long-random-production-secret-0123456789-xyz",
            "ALLOWED_HOSTS": "gantry.example.org",
            "GANTRY_DATA_DIR": str(tmp_path),
        },
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout
