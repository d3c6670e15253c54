"""FSDP (``strategy: fsdp``): sharded training on 2 and 4 gloo ranks, truly sharded
checkpoints, bit-exact resume on the same shape, and resharding N → M (4 → 2, 2 → 4,
2 → 1, FSDP → DDP, DDP → FSDP) where each rank reads only the rows it will hold."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from trainer_testlib import (
    ckpt,
    cli,
    launch_ranks,
    losses,
    ok,
    read_lines,
    tiny_config,
    write_config,
)

from trainer import checkpoint as ck
from trainer.checkpoint.reshard import RangeReader, ShardLayout
from trainer.config import ConfigError, validate
from trainer.model import TinyGPT

# Each test starts torch.distributed ranks or trainer runs: seconds each, so out of make unit.
pytestmark = pytest.mark.slow


def _train(world: int, run: Path, *args: str) -> Path:
    argv = ["train", "--run-dir", str(run), *args]
    if world == 1:
        assert cli(argv) == 0
    else:
        ok(launch_ranks(world, argv))
    return run


@pytest.fixture(scope="module")
def fsdp2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fsdp2")
    cfg = write_config(d / "c.json", tiny_config(strategy="fsdp"))  # global batch 8
    return _train(2, d / "run", "--config", str(cfg))


@pytest.fixture(scope="module")
def ddp2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("ddp2")
    cfg = write_config(d / "c.json", tiny_config())
    return _train(2, d / "run", "--config", str(cfg))


def _manifest(run: Path, step: int = 3) -> dict:
    return json.loads((ckpt(run, step) / "manifest.json").read_text())


def close(got: dict[int, float], want: dict[int, float], rel: float = 1e-4) -> None:
    assert sorted(got) == sorted(want)
    for s in got:
        assert abs(got[s] - want[s]) <= rel * abs(want[s]), (s, got[s], want[s])


def test_strategy_is_validated():
    assert validate({}).strategy == "ddp"
    assert validate({"strategy": "fsdp"}).strategy == "fsdp"
    with pytest.raises(ConfigError) as exc:
        validate({"strategy": "zero3"})
    assert exc.value.key == "strategy" and "'ddp' or 'fsdp'" in exc.value.why
    with pytest.raises(ConfigError):
        validate({"strategy": 1})


def test_fsdp_checkpoint_is_truly_sharded(fsdp2, ddp2):
    manifest = _manifest(fsdp2)
    assert manifest["format"] == "gantry-trainer-checkpoint/3"
    assert manifest["strategy"] == "fsdp" and manifest["config"]["strategy"] == "fsdp"
    table = manifest["sharding"]
    n_params = sum(p.numel() for p in TinyGPT(validate(manifest["config"])).parameters())
    # Every parameter and both AdamW moments are dim-0 slices, one per rank, tiling rows.
    sharded = {k: v for k, v in table.items() if v["placement"] == "shard0"}
    assert len(sharded) == 3 * len([k for k in table if k.startswith("model/")])
    for key, item in sharded.items():
        rows = item["global_shape"][0]
        shards = sorted(item["shards"], key=lambda s: s["rank"])
        assert [s["rank"] for s in shards] == [0, 1], key
        assert shards[0]["start"] == 0 and shards[1]["start"] == shards[0]["rows"], key
        assert shards[0]["rows"] + shards[1]["rows"] == rows, key
    # The step counts are replicated: rank 0 holds them whole.
    whole = {k: v for k, v in table.items() if v["placement"] == "whole"}
    assert whole and all(k.endswith("/step") for k in whole)
    assert all([s["rank"] for s in v["shards"]] == [0] for v in whole.values())
    # Each rank's data is about half the model + optimizer state (3 x fp32 per parameter).
    state_bytes = 3 * 4 * n_params
    for rank in (0, 1):
        data = sum(
            f["size"] for f in manifest["files"] if f["rank"] == rank and f["role"] == "data"
        )
        assert 0.45 * state_bytes < data < 0.55 * state_bytes + 4096, (rank, data, state_bytes)
    # Rank 1's index holds only its own slices.
    state = ck.read_rank(str(ckpt(fsdp2, 3)), 1)
    assert state["model"]["tok.weight"].shape[0] == table["model/tok.weight"]["shards"][1]["rows"]
    assert "scheduler" not in state and set(state["shards"]) == set(sharded)
    assert ck.verify(str(ckpt(fsdp2, 3)))["ok"]
    assert ck.rank_consistency(str(ckpt(fsdp2, 3)), manifest) == []
    # The same run with DDP (same init, same data) reaches the same global state: keyed the
    # same way, sharded or replicated, within float reduction order: within what a drill
    # accepts after replay (Adam's normalised step turns reduction-order noise in a small
    # gradient, such as a bias's, into ~1e-4 relative differences on some CPUs).
    from trainer import fingerprint
    from trainer.drill import DEFAULT_STATE_TOLERANCE

    assert (
        fingerprint.compare(
            manifest["fingerprint"],
            _manifest(ddp2)["fingerprint"],
            exact=False,
            tolerance=DEFAULT_STATE_TOLERANCE,
            compare_rng=False,
        )
        == []
    )
    steps = [r for r in read_lines(fsdp2) if "event" not in r]
    assert all(r["world_size"] == 2 and r["global_batch"] == 8 for r in steps)
    close(losses(fsdp2), losses(ddp2))
    acceptance = json.loads((fsdp2 / "acceptance.json").read_text())
    assert acceptance["strategy"] == "fsdp" and acceptance["backend"] == "gloo"


def test_same_shape_resume_is_bit_exact(fsdp2, tmp_path):
    run = _train(2, tmp_path / "r", "--resume", str(ckpt(fsdp2, 3)))
    ref = losses(fsdp2)
    assert losses(run) == {s: ref[s] for s in (4, 5, 6)}  # bit for bit
    # and the checkpoint the resumed run wrote at step 6 is the original's, bit for bit
    assert (
        _manifest(run, 6)["fingerprint"]["tensors"] == _manifest(fsdp2, 6)["fingerprint"]["tensors"]
    )


def test_one_rank_fsdp_matches_ddp_and_resumes_bit_exact(base_run, tmp_path):
    cfg = write_config(tmp_path / "c.json", tiny_config(strategy="fsdp"))
    run = _train(1, tmp_path / "f1", "--config", str(cfg))
    # FSDP on one rank computes what the plain model does, bit for bit
    assert losses(run) == losses(base_run)
    resumed = _train(1, tmp_path / "f1r", "--resume", str(ckpt(run, 3)))
    assert losses(resumed) == {s: losses(run)[s] for s in (4, 5, 6)}


@pytest.mark.parametrize(
    ("world", "extra"),
    [(1, ()), (2, ("--strategy", "ddp"))],
    ids=["fsdp2->fsdp1", "fsdp2->ddp2"],
)
def test_reshard_fsdp_checkpoint(fsdp2, tmp_path, world, extra):
    run = _train(world, tmp_path / "r", "--resume", str(ckpt(fsdp2, 3)), *extra)
    ref = losses(fsdp2)
    close(losses(run), {s: ref[s] for s in (4, 5, 6)})
    resumed = next(r for r in read_lines(run) if r.get("event") == "resumed")
    assert resumed["world_size_at_save"] == 2 and resumed["samples_consumed"] == 24
    steps = [r for r in read_lines(run) if "event" not in r]
    assert all(r["world_size"] == world and r["global_batch"] == 8 for r in steps)
    assert _manifest(run, 6)["strategy"] == ("ddp" if extra else "fsdp")


def test_ddp_checkpoint_into_fsdp(ddp2, tmp_path):
    run = _train(2, tmp_path / "r", "--resume", str(ckpt(ddp2, 3)), "--strategy", "fsdp")
    ref = losses(ddp2)
    close(losses(run), {s: ref[s] for s in (4, 5, 6)})
    manifest = _manifest(run, 6)
    assert manifest["strategy"] == "fsdp" and manifest["config"]["strategy"] == "fsdp"
    assert {len(v["shards"]) for v in manifest["sharding"].values()} == {1, 2}


def test_reader_reads_only_the_rows_asked_for(fsdp2, monkeypatch):
    """Rows straddling both ranks' slices: exactly their bytes are read, from both files,
    and they equal the saved slices."""
    path = str(ckpt(fsdp2, 3))
    manifest = ck.load_manifest(path)
    names = [n for n, _ in TinyGPT(validate(manifest["config"])).named_parameters()]
    layout = ShardLayout(path, manifest, names)
    key = "optimizer/blocks.0.fc.weight/exp_avg"
    rows, cols = layout.slices[key][0].global_shape
    start, stop = rows // 2 - 3, rows // 2 + 5
    out = torch.empty(stop - start, cols)
    reads: list[int] = []
    real = os.preadv

    def spy(fd, buffers, offset):
        reads.append(sum(len(b) for b in buffers))
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", spy)
    reader = RangeReader(layout)
    reader.want(key, out, start)
    report = reader.run()
    assert sum(reads) == out.numel() * 4 == report["bytes"]
    assert report["files_verified"] == []  # read in part: digest-checked instead
    assert sorted(r["name"] for r in report["ranges"]) == [
        "rank-00000-0000.bin",
        "rank-00001-0000.bin",
    ]
    full = torch.cat(
        [
            ck.read_rank(path, r)["optimizer"]["state"]["blocks.0.fc.weight"]["exp_avg"]
            for r in (0, 1)
        ]
    )
    assert torch.equal(out, full[start:stop])
    assert [(p.source.rank, p.lo, p.hi, p.complete) for p in reader.pieces] == [
        (0, start, rows // 2, False),
        (1, rows // 2, stop, False),
    ]


@pytest.mark.slow
def test_fsdp_four_ranks_and_reshard_4_to_2_and_2_to_4(fsdp2, tmp_path):
    cfg = write_config(tmp_path / "c4.json", tiny_config(strategy="fsdp", batch_size=2))
    four = _train(4, tmp_path / "f4", "--config", str(cfg))
    manifest = _manifest(four)
    assert manifest["world_size"] == 4
    assert {
        len(v["shards"]) for v in manifest["sharding"].values() if v["placement"] == "shard0"
    } == {4}
    close(losses(four), losses(fsdp2))  # the same global batch of 8: the same trajectory
    # 4 -> 2 and 2 -> 4 continue the run
    two = _train(2, tmp_path / "f42", "--resume", str(ckpt(four, 3)))
    close(losses(two), {s: losses(four)[s] for s in (4, 5, 6)})
    back = _train(4, tmp_path / "f24", "--resume", str(ckpt(fsdp2, 3)))
    close(losses(back), {s: losses(fsdp2)[s] for s in (4, 5, 6)})
    # ... and 4 -> 4 is bit-exact
    again = _train(4, tmp_path / "f44", "--resume", str(ckpt(four, 3)))
    assert losses(again) == {s: losses(four)[s] for s in (4, 5, 6)}


def test_bf16_fsdp_keeps_fp32_master_weights_and_resumes_bit_exact(tmp_path):
    cfg = write_config(tmp_path / "c.json", tiny_config(strategy="fsdp", precision="bf16"))
    run = _train(2, tmp_path / "b", "--config", str(cfg))
    manifest = _manifest(run)
    assert manifest["precision"] == "bf16"
    assert {v["dtype"] for k, v in manifest["sharding"].items() if k.startswith("model/")} == {
        "float32"
    }
    again = _train(2, tmp_path / "b2", "--resume", str(ckpt(run, 3)))
    assert losses(again) == {s: losses(run)[s] for s in (4, 5, 6)}


def test_format_2_ddp_checkpoint_still_loads(ddp2, tmp_path):
    """A checkpoint as the format-2 trainer wrote it (no strategy, no sharding table, no
    shard table in rank 0's state) loads with DDP bit for bit, and into FSDP."""
    import shutil

    from drill_damage import rewrite_rank

    run = tmp_path / "old"
    shutil.copytree(ddp2, run)
    d = ckpt(run, 3)
    rewrite_rank(d, 0, lambda state: state.pop("shards"))
    manifest = json.loads((d / "manifest.json").read_text())
    for key in ("strategy", "sharding"):
        manifest.pop(key)
    manifest["format"] = "gantry-trainer-checkpoint/2"
    manifest["config"].pop("strategy")
    ck.atomic_write_json(str(d / "manifest.json"), manifest)
    assert ck.verify(str(d))["ok"] and ck.rank_consistency(str(d), manifest) == []
    same = _train(2, tmp_path / "same", "--resume", str(d))
    assert losses(same) == {s: losses(ddp2)[s] for s in (4, 5, 6)}
    fsdp = _train(2, tmp_path / "fsdp", "--resume", str(d), "--strategy", "fsdp")
    close(losses(fsdp), {s: losses(ddp2)[s] for s in (4, 5, 6)})
