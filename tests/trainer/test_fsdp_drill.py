"""Drills of FSDP checkpoints at any world size and strategy: the fingerprint of the loaded
global state equals the saved one bit for bit on every path (2 → 2, 2 → 1, 2 → 4,
FSDP → DDP, DDP → FSDP), each rank reads about 1/M of the state; sharded damage (a rank's
shard missing, two ranks' shards swapped, a shard of another step) fails with the right
code and a reason that names the shard or the rank. The reference is built from the run
before the damage, as Gantry keeps it in its database."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from drill_damage import KINDS, SHARDED_KINDS, Damage
from trainer_testlib import ckpt, cli, drill_ranks, launch_ranks, ok, tiny_config, write_config

from trainer.drill import reference_from_metrics
from trainer.schema import verdict_for

# Each test starts torch.distributed ranks or trainer runs: seconds each, so out of make unit.
pytestmark = pytest.mark.slow


def _reference(run: Path, dest: Path) -> Path:
    reference = reference_from_metrics(str(run / "metrics.jsonl"))
    acceptance = json.loads((run / "acceptance.json").read_text())
    reference["dataset_sha256"] = acceptance["dataset_sha256"]
    dest.write_text(json.dumps(reference))
    return dest


def _run(tmp_path_factory: pytest.TempPathFactory, name: str, **cfg: Any) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp(name)
    config = write_config(d / "c.json", tiny_config(**cfg))
    ok(launch_ranks(2, ["train", "--config", str(config), "--run-dir", str(d / "run")]))
    return d / "run", _reference(d / "run", d / "reference.json")


@pytest.fixture(scope="module")
def fsdp2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _run(tmp_path_factory, "fsdp2", strategy="fsdp")


@pytest.fixture(scope="module")
def ddp2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _run(tmp_path_factory, "ddp2")


def _drill(
    tmp_path: Path,
    run: Path,
    reference: Path,
    world: int,
    damage: Damage | None = None,
    *extra: str,
) -> dict[str, Any]:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    if damage is not None:
        damage.apply(ckpt(copy, 3), ckpt(copy, 6))
    codes, doc = drill_ranks(world, ckpt(copy, 3), reference, tmp_path / "drill.json", 3, *extra)
    want = {"passed": 0, "failed": 1, "inconclusive": 5}[doc["verdict"]]
    assert codes == [want] * world, (codes, doc["reason"])
    assert doc["verdict"] == verdict_for(doc["reason_code"])
    return doc


def _passed_exactly_at_load(doc: dict[str, Any], mode: str) -> None:
    assert doc["verdict"] == "passed" and doc["mode"] == mode, doc["reason"]
    # Loading moves bytes, never changes them: the loaded global state equals the saved
    # fingerprint bit for bit, whatever the world size or strategy.
    assert doc["state"]["at_load"]["compared"] and doc["state"]["at_load"]["exact"]
    assert doc["state"]["at_load"]["problems"] == []
    assert doc["state"]["at_end"]["compared"] and doc["state"]["at_end"]["step"] == 6


def _data_bytes(run: Path) -> int:
    manifest = json.loads((ckpt(run, 3) / "manifest.json").read_text())
    return sum(f["size"] for f in manifest["files"] if f["role"] == "data")


def test_same_shape_drill_is_exact_and_each_rank_reads_its_own_shard(fsdp2, tmp_path):
    doc = _drill(tmp_path, *fsdp2, 2)
    _passed_exactly_at_load(doc, "exact")
    assert doc["checkpoint"]["strategy"] == "fsdp" and doc["allocation"]["strategy"] == "fsdp"
    for rank in doc["ranks"]:
        mine = f"rank-{rank['rank']:05d}-0000.bin"
        # its own shard file read whole and re-hashed; of rank 0's, only the step counts
        assert mine in rank["files"] and rank["slices_checked"] > 0
        assert all(r["bytes"] < 1024 for r in rank["ranges"]), rank["ranges"]


def test_drill_onto_one_rank_reads_every_shard(fsdp2, tmp_path):
    doc = _drill(tmp_path, *fsdp2, 1)
    _passed_exactly_at_load(doc, "tolerance")
    # all of both shards (rank 1's RNG state is not needed)
    assert 0.95 * _data_bytes(fsdp2[0]) < doc["ranks"][0]["data_bytes"] <= _data_bytes(fsdp2[0])


def test_drill_as_ddp_restores_the_same_state(fsdp2, tmp_path):
    doc = _drill(tmp_path, *fsdp2, 2, None, "--strategy", "ddp")
    _passed_exactly_at_load(doc, "tolerance")
    assert doc["checkpoint"]["strategy"] == "fsdp" and doc["allocation"]["strategy"] == "ddp"


def test_ddp_checkpoint_drilled_as_fsdp(ddp2, tmp_path):
    doc = _drill(tmp_path, *ddp2, 2, None, "--strategy", "fsdp")
    _passed_exactly_at_load(doc, "tolerance")
    # each FSDP rank read about half of rank 0's full state, in ranges
    total = _data_bytes(ddp2[0])
    for rank in doc["ranks"]:
        assert 0.4 * total < rank["data_bytes"] < 0.6 * total, (rank["data_bytes"], total)


@pytest.mark.slow
def test_drill_onto_four_ranks_reads_a_quarter_each(fsdp2, tmp_path):
    doc = _drill(tmp_path, *fsdp2, 4)
    _passed_exactly_at_load(doc, "tolerance")
    total = _data_bytes(fsdp2[0])
    assert len(doc["ranks"]) == 4
    for rank in doc["ranks"]:
        assert rank["files"] == [f for f in rank["files"] if f.endswith(".pt")]  # parts only
        # a quarter of the model and optimizer state, its RNG state (ranks 0 and 1) and
        # the step counts
        assert 0.2 * total < rank["data_bytes"] < 0.3 * total, (rank["rank"], rank, total)


def _assert_detected(doc: dict[str, Any], damage: Damage) -> None:
    assert doc["verdict"] == damage.verdict, (damage.name, doc["reason_code"], doc["reason"])
    assert doc["reason_code"] in damage.codes, (damage.name, doc["reason_code"], doc["reason"])
    assert damage.named_in(doc["reason"]), (damage.name, doc["reason"])


@pytest.mark.parametrize("damage", SHARDED_KINDS, ids=[k.name for k in SHARDED_KINDS])
def test_sharded_damage_same_shape(fsdp2, tmp_path, damage):
    _assert_detected(_drill(tmp_path, *fsdp2, 2, damage), damage)


@pytest.mark.parametrize("damage", SHARDED_KINDS, ids=[k.name for k in SHARDED_KINDS])
def test_sharded_damage_onto_one_rank(fsdp2, tmp_path, damage):
    _assert_detected(_drill(tmp_path, *fsdp2, 1, damage), damage)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    ["weights altered 1% (hashes valid)", "truncated data file", "RNG altered (hashes valid)"],
)
def test_replicated_kinds_on_a_sharded_checkpoint(fsdp2, tmp_path, name):
    damage = next(k for k in KINDS if k.name == name)
    _assert_detected(_drill(tmp_path, *fsdp2, 1, damage), damage)


def test_resume_refuses_swapped_shards_naming_them(fsdp2, tmp_path, capsys):
    """Without Gantry's reference, --resume checks every slice read against the manifest's
    fingerprint (hashes alone are valid here)."""
    damage = next(k for k in SHARDED_KINDS if k.name.startswith("two ranks' shards"))
    copy = tmp_path / "run"
    shutil.copytree(fsdp2[0], copy)
    damage.apply(ckpt(copy, 3), ckpt(copy, 6))
    assert cli(["train", "--run-dir", str(tmp_path / "new"), "--resume", str(ckpt(copy, 3))]) == 2
    err = capsys.readouterr().err
    assert "[inconsistent_state]" in err and "rank 0's slice of" in err, err[-2000:]


@pytest.mark.parametrize(
    ("name", "code", "needle"),
    [
        ("a shard of another step (hashes valid)", "inconsistent_state", "rank 1's slice of"),
        ("rank files of another step (hashes valid)", "inconsistent_state", "holds step 6"),
    ],
)
def test_resume_refuses_a_shard_of_another_step(fsdp2, tmp_path, capsys, name, code, needle):
    """A data file of another step is caught by its slices' digests while loading; a whole
    rank's files of another step by the rank consistency check before anything loads."""
    damage = next(k for k in KINDS if k.name == name)
    copy = tmp_path / "run"
    shutil.copytree(fsdp2[0], copy)
    damage.apply(ckpt(copy, 3), ckpt(copy, 6))
    assert cli(["train", "--run-dir", str(tmp_path / "new"), "--resume", str(ckpt(copy, 3))]) == 2
    err = capsys.readouterr().err
    assert f"[{code}]" in err and needle in err, err[-2000:]


def test_resume_latest_falls_back_past_an_inconsistent_sharded_checkpoint(fsdp2, tmp_path, capsys):
    damage = next(k for k in KINDS if k.name == "rank files of another step (hashes valid)")
    copy = tmp_path / "run"
    shutil.copytree(fsdp2[0], copy)
    damage.apply(ckpt(copy, 6), ckpt(copy, 3))  # step 6's rank 0 now holds step 3
    assert cli(["train", "--run-dir", str(copy), "--resume", "latest"]) == 0
    err = capsys.readouterr().err
    assert "skipping step-000006: rank-00000.pt: holds step 3" in err, err[-2000:]
    assert "falling back to step-000003" in err
