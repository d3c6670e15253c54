"""``train --resume-digest``: a checkpoint whose manifest is no longer the one Gantry
registered (and proved) is refused, even when every hash in it is valid."""

from __future__ import annotations

import json
from pathlib import Path

from drill_damage import _scale_weights, rewrite_rank
from trainer_testlib import ckpt, losses, run_trainer, tiny_config, write_config

from trainer.schema import manifest_digest


def test_the_registered_manifest_resumes_and_a_rewritten_one_is_refused(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.json", tiny_config(steps=20, checkpoint_every=10))
    run = tmp_path / "run"
    done = run_trainer(["train", "--config", str(cfg), "--run-dir", str(run)])
    assert done.returncode == 0, done.stderr
    checkpoint = ckpt(run, 10)
    registered = manifest_digest(json.loads((checkpoint / "manifest.json").read_text()))

    again = tmp_path / "again"
    args = ["train", "--run-dir", str(again), "--resume", str(checkpoint)]
    done = run_trainer([*args, "--resume-digest", registered])
    assert done.returncode == 0, done.stderr
    assert losses(again) == {s: v for s, v in losses(run).items() if s > 10}

    # Rewritten after the proof, every hash made to match: refused, nothing trained.
    rewrite_rank(checkpoint, 0, _scale_weights)
    refused = tmp_path / "refused"
    done = run_trainer(
        [
            "train",
            "--run-dir",
            str(refused),
            "--resume",
            str(checkpoint),
            "--resume-digest",
            registered,
        ]
    )
    assert done.returncode == 2, done.stderr
    assert "not_as_registered" in done.stderr
    assert not (refused / "metrics.jsonl").exists() or not losses(refused)
