"""CUDA paths (NCCL, CUDA bf16, CUDA RNG state). Skipped visibly without a GPU."""

import json

import pytest
import torch
from trainer_testlib import ckpt, cli, launch_ranks, losses, tiny_config, write_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)"),
]


def test_cuda_bf16_train_checkpoint_resume(tmp_path):
    cfg = write_config(tmp_path / "c.json", tiny_config(device="cuda", precision="bf16"))
    assert cli(["train", "--config", str(cfg), "--run-dir", str(tmp_path / "a")]) == 0
    acc = json.loads((tmp_path / "a" / "acceptance.json").read_text())
    assert acc["devices"][0]["type"] == "cuda" and acc["versions"]["cuda"]
    man = json.loads((ckpt(tmp_path / "a", 3) / "manifest.json").read_text())
    assert man["device_type"] == "cuda"
    assert (
        cli(["train", "--run-dir", str(tmp_path / "b"), "--resume", str(ckpt(tmp_path / "a", 3))])
        == 0
    )
    ref, got = losses(tmp_path / "a"), losses(tmp_path / "b")
    for s in (4, 5, 6):
        assert abs(got[s] - ref[s]) <= 1e-2 * abs(ref[s])


def test_cuda_rng_state_roundtrip(tmp_path):
    from trainer import checkpoint as ck
    from trainer import dist
    from trainer.config import validate
    from trainer.session import Session

    dev = torch.device("cuda", 0)
    s = Session(validate(tiny_config(device="cuda")), dist.DistEnv(), dev)
    s.train_step()
    snap = s.snapshot()
    assert snap["rng"]["cuda"] is not None
    w = ck.CheckpointWriter(str(tmp_path), 0, 1, "x", True, 1)
    w.save(1, lambda _copy: snap, {"config": s.cfg.to_dict()})
    w.wait()
    expect = torch.rand(4, device=dev)
    torch.cuda.manual_seed(12345)
    s2 = Session(validate(tiny_config(device="cuda")), dist.DistEnv(), dev)
    s2.load(str(tmp_path / "step-000001"), ck.load_manifest(str(tmp_path / "step-000001")))
    assert torch.equal(torch.rand(4, device=dev), expect)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for 2-rank NCCL")
def test_two_rank_nccl(tmp_path):
    cfg = write_config(tmp_path / "c.json", tiny_config(device="cuda"))
    procs = launch_ranks(2, ["train", "--config", str(cfg), "--run-dir", str(tmp_path / "r")])
    assert all(p.returncode == 0 for p in procs), procs[0].stderr[-2000:]
    acc = json.loads((tmp_path / "r" / "acceptance.json").read_text())
    assert acc["backend"] == "nccl"


def test_one_rank_nccl_process_group(tmp_path):
    """NCCL init/teardown path with world size 1 launched torchrun-style."""
    cfg = write_config(tmp_path / "c.json", tiny_config(device="cuda", steps=2))
    procs = launch_ranks(1, ["train", "--config", str(cfg), "--run-dir", str(tmp_path / "r")])
    assert procs[0].returncode == 0, procs[0].stderr[-2000:]


def test_cuda_fsdp_bf16_one_rank_checkpoint_and_resume(tmp_path):
    """FSDP on one GPU (a one-rank NCCL group on an in-process store), bf16 mixed precision."""
    cfg = write_config(
        tmp_path / "c.json",
        tiny_config(device="cuda", precision="bf16", strategy="fsdp", deterministic=True),
    )
    assert cli(["train", "--config", str(cfg), "--run-dir", str(tmp_path / "a")]) == 0
    man = json.loads((ckpt(tmp_path / "a", 3) / "manifest.json").read_text())
    assert man["strategy"] == "fsdp" and man["device_type"] == "cuda"
    assert {v["dtype"] for k, v in man["sharding"].items() if k.startswith("model/")} == {"float32"}
    resumed = tmp_path / "b"
    assert cli(["train", "--run-dir", str(resumed), "--resume", str(ckpt(tmp_path / "a", 3))]) == 0
    ref, got = losses(tmp_path / "a"), losses(resumed)
    for s in (4, 5, 6):
        assert abs(got[s] - ref[s]) <= 1e-2 * abs(ref[s])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for 2-rank NCCL FSDP")
def test_two_rank_nccl_fsdp_and_reshard_onto_one_gpu(tmp_path):
    cfg = write_config(tmp_path / "c.json", tiny_config(device="cuda", strategy="fsdp"))
    procs = launch_ranks(2, ["train", "--config", str(cfg), "--run-dir", str(tmp_path / "r")])
    assert all(p.returncode == 0 for p in procs), procs[0].stderr[-2000:]
    man = json.loads((ckpt(tmp_path / "r", 3) / "manifest.json").read_text())
    assert man["strategy"] == "fsdp" and man["world_size"] == 2
    one = tmp_path / "one"
    assert cli(["train", "--run-dir", str(one), "--resume", str(ckpt(tmp_path / "r", 3))]) == 0
    ref, got = losses(tmp_path / "r"), losses(one)
    for s in (4, 5, 6):
        assert abs(got[s] - ref[s]) <= 1e-3 * abs(ref[s])
