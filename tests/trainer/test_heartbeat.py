"""Each rank's heartbeat file: written while the rank trains, with its rank, node and step
(what the watcher's hang evidence reads)."""

from __future__ import annotations

import json
from pathlib import Path

from trainer_testlib import run_trainer, tiny_config, write_config

from trainer.heartbeat import beat_path, write_beat


def test_a_training_run_leaves_its_heartbeat_with_rank_node_and_step(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.json", tiny_config(steps=20, checkpoint_every=10))
    run = tmp_path / "run"
    done = run_trainer(["train", "--config", str(cfg), "--run-dir", str(run)])
    assert done.returncode == 0, done.stderr
    beat = json.loads(Path(beat_path(str(run), 0)).read_text())
    assert beat["rank"] == 0 and isinstance(beat["node"], str) and beat["node"]
    assert 0 <= beat["step"] <= 20 and beat["time"] > 0


def test_a_beat_replaces_the_last_whole(tmp_path: Path) -> None:
    write_beat(str(tmp_path), 3, "gpu-b-07", 10)
    write_beat(str(tmp_path), 3, "gpu-b-07", 11)
    path = Path(beat_path(str(tmp_path), 3))
    assert json.loads(path.read_text())["step"] == 11
    assert sorted(p.name for p in path.parent.iterdir()) == ["rank-3.beat"]
