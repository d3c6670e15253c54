"""Fixtures for the trainer tests (helpers live in trainer_testlib)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for trainer_testlib

from trainer_testlib import cli, tiny_config, write_config


@pytest.fixture(scope="session")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A single-process 6-step run with checkpoints at 3 and 6 (read-only for tests)."""
    d = tmp_path_factory.mktemp("base")
    cfg = write_config(d / "config.json", tiny_config())
    assert cli(["train", "--config", str(cfg), "--run-dir", str(d / "run")]) == 0
    return d / "run"


@pytest.fixture
def copy_run(base_run: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "run"
    shutil.copytree(base_run, dest)
    return dest
