import json
import math

import pytest
import torch
from trainer_testlib import ckpt, cli, losses, read_lines, run_trainer, tiny_config, write_config

from trainer import checkpoint as ck
from trainer import dist
from trainer.config import validate
from trainer.session import Session

STEP_KEYS = {
    "step",
    "time",
    "elapsed",
    "loss",
    "samples_per_s",
    "tokens_per_s",
    "step_time",
    "data_time",
    "checkpoint_blocking_time",
    "world_size",
    "lr",
}


def test_metrics_and_acceptance(base_run):
    lines = read_lines(base_run)
    raw = (base_run / "metrics.jsonl").read_text().splitlines()
    assert len(raw) == len(lines) and all(json.loads(r) for r in raw)
    steps = [r for r in lines if "event" not in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    for r in steps:
        assert set(r) >= STEP_KEYS, STEP_KEYS - set(r)
        assert r["world_size"] == 1 and math.isfinite(r["loss"])
    assert steps[2]["checkpoint_blocking_time"] > 0 and steps[0]["checkpoint_blocking_time"] == 0
    events = [r["event"] for r in lines if "event" in r]
    assert events[0] == "start" and events[-1] == "done"
    assert [r["step"] for r in lines if r.get("event") == "checkpoint"] == [3, 6]
    acc = json.loads((base_run / "acceptance.json").read_text())
    for key in (
        "nodes",
        "world_size",
        "devices",
        "versions",
        "backend",
        "config",
        "config_sha256",
        "dataset",
        "dataset_sha256",
        "optimal_loss",
        "precision",
        "seed",
    ):
        assert key in acc, key
    assert acc["config_sha256"] == validate(acc["config"]).sha256()
    assert acc["nodes"] == [dist.node_name()] and acc["world_size"] == 1
    for k in ("torch", "cuda", "nccl", "python", "trainer", "trainer_digest"):
        assert k in acc["versions"]


def test_bit_exact_resume(base_run, tmp_path):
    ref = losses(base_run)
    run = tmp_path / "resumed"
    assert cli(["train", "--run-dir", str(run), "--resume", str(ckpt(base_run, 3))]) == 0
    got = losses(run)
    assert sorted(got) == [4, 5, 6]
    for s in got:
        assert got[s] == ref[s], (s, got[s], ref[s])  # bit for bit
    ev = [r for r in read_lines(run) if r.get("event") == "resumed"]
    assert ev and ev[0]["step"] == 3


def test_log_every_does_not_change_losses(base_run, tmp_path):
    cfg = write_config(tmp_path / "c.json", tiny_config(log_every=2, checkpoint_every=0))
    assert cli(["train", "--config", str(cfg), "--run-dir", str(tmp_path / "r")]) == 0
    got = losses(tmp_path / "r")
    ref = losses(base_run)
    assert sorted(got) == [2, 4, 6] and all(got[s] == ref[s] for s in got)
    assert not (tmp_path / "r" / "checkpoints").exists() or not list(
        (tmp_path / "r" / "checkpoints").iterdir()
    )


def test_bf16_cpu_and_sync_mode(tmp_path):
    cfg = write_config(
        tmp_path / "c.json",
        tiny_config(precision="bf16", checkpoint_async=False, steps=4, checkpoint_every=2),
    )
    assert cli(["train", "--config", str(cfg), "--run-dir", str(tmp_path / "r")]) == 0
    assert all(math.isfinite(v) for v in losses(tmp_path / "r").values())
    man = json.loads((ckpt(tmp_path / "r", 4) / "manifest.json").read_text())
    assert man["async"] is False and man["precision"] == "bf16"


def _session(cfg_over=None):
    cfg = validate(tiny_config(**(cfg_over or {})))
    return Session(cfg, dist.DistEnv(), torch.device("cpu"))


def test_async_and_sync_checkpoints_equal_weights_at_their_step(tmp_path):
    s = _session()
    for _ in range(3):
        s.train_step()
    live = {k: v.clone() for k, v in s.model.state_dict().items()}
    live_opt = ck.clone_to_cpu(s.opt.state_dict())
    results = {}
    for mode in (False, True):  # sync first: after the async save, training moves on
        w = ck.CheckpointWriter(str(tmp_path / f"async-{mode}"), 0, 1, "sid", mode, 3)
        blocked = w.save(3, s.snapshot, {"config": s.cfg.to_dict()})
        if mode:
            s.train_step()  # training moves on while the write is in flight
        w.wait()
        assert not w.errors
        results[mode] = blocked
        path = tmp_path / f"async-{mode}" / "step-000003"
        assert ck.verify(str(path))["ok"]
        st = ck.read_rank(str(path), 0)
        for k, v in live.items():
            assert torch.equal(st["model"][k], v), k
        state = st["optimizer"]["state"]
        for idx, ent in live_opt["state"].items():
            assert torch.equal(state[idx]["exp_avg"], ent["exp_avg"])
        assert st["meta"]["step"] == 3 and st["data"]["samples_consumed"] == 12
        assert json.loads((path / "manifest.json").read_text())["async"] is mode


@pytest.mark.slow
def test_killed_mid_write_never_complete_and_latest_falls_back(base_run, tmp_path):
    cfg = write_config(tmp_path / "c.json", tiny_config())
    run = tmp_path / "run"
    p = run_trainer(
        ["train", "--config", str(cfg), "--run-dir", str(run)],
        TRAINER_FAULT="crash_before_manifest@6",
    )
    assert p.returncode == 137, p.stderr
    entries = ck.list_checkpoints(str(run / "checkpoints"))
    assert [(e.step, e.complete) for e in entries] == [(3, True), (6, False)]
    assert (ckpt(run, 6) / "rank-00000.pt").exists()  # files written, manifest not
    assert [e.step for e in ck.complete_checkpoints(str(run / "checkpoints"))] == [3]
    rep = ck.verify(str(ckpt(run, 6)))
    assert not rep["ok"] and rep["reason_code"] == "missing_manifest"
    # explicit resume from it is refused; "latest" falls back and says so
    p = run_trainer(["train", "--run-dir", str(run), "--resume", str(ckpt(run, 6))])
    assert p.returncode == 2 and "missing_manifest" in p.stderr
    p = run_trainer(["train", "--run-dir", str(run), "--resume", "latest"])
    assert p.returncode == 0, p.stderr
    assert "falling back to step-000003" in p.stderr and "step-000006" in p.stderr
    ref, got = losses(base_run), losses(run)
    assert all(got[s] == ref[s] for s in (4, 5, 6))
    assert ck.verify(str(ckpt(run, 6)))["ok"]


def test_retention_keeps_last_k(tmp_path):
    cfg = write_config(
        tmp_path / "c.json", tiny_config(steps=8, checkpoint_every=2, checkpoint_keep=2)
    )
    assert cli(["train", "--config", str(cfg), "--run-dir", str(tmp_path / "r")]) == 0
    root = tmp_path / "r" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step-000006", "step-000008"]
    # an incomplete leftover older than the newest complete one is cleaned, newer kept
    (root / "step-000004").mkdir()
    (root / "step-000010").mkdir()
    ck.apply_retention(str(root), 1)
    assert sorted(p.name for p in root.iterdir()) == ["step-000008", "step-000010"]


def test_each_logged_step_carries_every_ranks_timings(base_run):
    steps = [r for r in read_lines(base_run) if "event" not in r]
    for r in steps:
        [[rank, node, forward_s, step_s]] = r["ranks"]
        assert rank == 0 and isinstance(node, str) and node
        # The forward pass is part of the step.
        assert 0 < forward_s <= step_s
