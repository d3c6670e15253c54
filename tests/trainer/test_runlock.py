"""One trainer per run directory: a second trainer (a duplicate Slurm job) on the same run
directory refuses to start, names the holder and writes nothing."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from trainer_testlib import PY, REPO, run_trainer, sub_env, tiny_config, write_config

from trainer import dist
from trainer.runlock import LOCK_NAME, lock_run_directory


def test_a_second_lock_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    env = dist.DistEnv(job_id="101", node="n1")
    assert lock_run_directory(str(tmp_path), env) is None
    holder = json.loads((tmp_path / LOCK_NAME).read_text())
    assert holder["slurm_job_id"] == "101" and holder["node"] == "n1"
    refusal = lock_run_directory(str(tmp_path), dist.DistEnv(job_id="102", node="n2"))
    assert refusal is not None and "Slurm job 101" in refusal and "n1" in refusal


@pytest.mark.slow
def test_a_duplicate_trainer_exits_4_and_writes_nothing(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.json", tiny_config(steps=100000, checkpoint_every=0))
    run = tmp_path / "run"
    first = subprocess.Popen(
        [PY, "-m", "trainer", "train", "--config", str(config), "--run-dir", str(run)],
        cwd=REPO,
        env=sub_env(SLURM_JOB_ID="201"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (run / "metrics.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (run / "metrics.jsonl").exists()
        before = (run / "metrics.jsonl").stat().st_size
        second = run_trainer(
            ["train", "--config", str(config), "--run-dir", str(run)], SLURM_JOB_ID="202"
        )
        assert second.returncode == 4, second.stderr
        assert "in use by Slurm job 201" in second.stderr
        lines = (run / "metrics.jsonl").read_text().splitlines()
        # Only the first trainer writes: every line has its steps in order, no second start.
        assert sum('"event":"start"' in line for line in lines) == 1
        assert (run / "metrics.jsonl").stat().st_size >= before
    finally:
        first.kill()
        first.wait(timeout=30)
    # The holder is gone (killed): the directory is free again.
    assert lock_run_directory(str(run), dist.DistEnv(job_id="203")) is None
