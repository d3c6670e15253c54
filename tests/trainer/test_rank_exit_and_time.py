"""The test-only fault that kills one rank mid-run (``TRAINER_FAULT=exit_rank[=R]@STEP``),
which a resumed run never fires again, and ``train --max-seconds`` (stop on time, every
rank after the same step)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trainer_testlib import ckpt, losses, read_lines, run_trainer, tiny_config, write_config

from trainer import faults


@pytest.mark.parametrize(
    ("spec", "rank", "world", "step", "fires"),
    [
        ("exit_rank@5", 3, 4, 5, True),  # the last rank by default
        ("exit_rank@5", 2, 4, 5, False),
        ("exit_rank@5", 3, 4, 4, False),  # another step
        ("exit_rank=1@7", 1, 4, 7, True),
        ("exit_rank=1@7", 0, 4, 7, False),
        ("exit_rank=x@7", 1, 4, 7, False),  # not a rank: ignored, never a guess
        ("exit_rank@", 0, 1, 0, False),
        ("nan_weights@5", 0, 1, 5, False),
        ("", 0, 1, 5, False),
    ],
)
def test_exit_rank_fires_only_on_its_rank_and_step(
    monkeypatch: pytest.MonkeyPatch, spec: str, rank: int, world: int, step: int, fires: bool
) -> None:
    exits: list[int] = []

    def fake_exit(code: int) -> Any:
        exits.append(code)

    monkeypatch.setenv("TRAINER_FAULT", spec)
    monkeypatch.setattr(faults.os, "_exit", fake_exit)
    faults.exit_rank_fault(rank=rank, world_size=world, step=step)
    assert exits == ([faults.EXIT_RANK_FAULT] if fires else [])


def test_a_killed_rank_exits_hard_and_the_resumed_run_goes_on_past_the_fault(
    base_run: Path, tmp_path: Path
) -> None:
    # A synchronous save: the async one of step 3 could still be in flight when it dies.
    config = write_config(tmp_path / "c.json", tiny_config(checkpoint_async=False))
    run = tmp_path / "run"
    killed = run_trainer(
        ["train", "--config", str(config), "--run-dir", str(run)], TRAINER_FAULT="exit_rank@5"
    )
    assert killed.returncode == faults.EXIT_RANK_FAULT, killed.stderr
    assert "rank 0 exits with 42 at step 5" in killed.stderr
    lines = read_lines(run)
    # Step 5 was neither logged nor finished: no done event, the checkpoint of step 3 stands.
    assert sorted(losses(run)) == [1, 2, 3, 4]
    assert not any(line.get("event") == "done" for line in lines)
    assert (ckpt(run, 3) / "manifest.json").exists()
    # The same environment (a resume keeps its job's), resumed: the fault does not fire again.
    resumed = tmp_path / "resumed"
    again = run_trainer(
        ["train", "--run-dir", str(resumed), "--resume", str(ckpt(run, 3))],
        TRAINER_FAULT="exit_rank@5",
    )
    assert again.returncode == 0, again.stderr
    reference, got = losses(base_run), losses(resumed)
    assert sorted(got) == [4, 5, 6] and all(got[s] == reference[s] for s in got)


def test_max_seconds_stops_at_a_logged_step_and_says_so(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "c.json", tiny_config(steps=1_000_000, checkpoint_every=0, log_every=5)
    )
    run = tmp_path / "run"
    finished = run_trainer(
        ["train", "--config", str(config), "--run-dir", str(run), "--max-seconds", "2"]
    )
    assert finished.returncode == 0, finished.stderr
    lines = read_lines(run)
    [done] = [line for line in lines if line.get("event") == "done"]
    steps = [line for line in lines if "event" not in line]
    assert done["stopped_on_time"] is True
    assert done["step"] == steps[-1]["step"] < 1_000_000
    assert all(line["step"] % 5 == 0 for line in steps)
    # It stopped at the first logged step past the limit, not before it.
    assert steps[-1]["elapsed"] >= 2.0
    assert len(steps) < 2 or steps[-2]["elapsed"] < 2.0


def test_without_max_seconds_the_run_ends_at_its_step_count(base_run: Path) -> None:
    [done] = [line for line in read_lines(base_run) if line.get("event") == "done"]
    assert done["stopped_on_time"] is False and done["step"] == 6


def test_max_seconds_must_be_positive(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.json", tiny_config())
    for bad in ("0", "-1", "nan", "inf"):
        refused = run_trainer(
            [
                "train",
                "--config",
                str(config),
                "--run-dir",
                str(tmp_path / "r"),
                "--max-seconds",
                bad,
            ]
        )
        assert refused.returncode == 2 and "--max-seconds" in refused.stderr, bad
