"""Every corruption kind is detected by verify, refused by train --resume, failed by drill."""

import json
import shutil

import pytest
import torch
from trainer_testlib import ckpt, cli

from trainer import checkpoint as ck


def flip_byte(d):
    p = d / "rank-00000.pt"
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0x01
    p.write_bytes(bytes(b))


def truncate(d):
    p = d / "rank-00000.pt"
    p.write_bytes(p.read_bytes()[:-100])


def delete_file(d):
    (d / "rank-00000.pt").unlink()


def flip_data_byte(d):
    p = d / "rank-00000-0000.bin"
    b = bytearray(p.read_bytes())
    b[len(b) // 3] ^= 0x10
    p.write_bytes(bytes(b))


def delete_data_file(d):
    (d / "rank-00000-0000.bin").unlink()


def drop_optimizer(d):
    """A well-formed checkpoint (hashes match) that lacks the optimizer state."""
    p = d / "rank-00000.pt"
    idx = ck.deserialize(p.read_bytes())
    del idx["state"]["optimizer"]
    data = ck.serialize(idx)
    p.write_bytes(data)
    man = json.loads((d / "manifest.json").read_text())
    import hashlib

    f = man["files"][0]
    assert f["name"] == "rank-00000.pt" and f["role"] == "index"
    f.update(size=len(data), sha256=hashlib.sha256(data).hexdigest(), keys=sorted(idx["state"]))
    man["state_keys"].remove("optimizer")
    (d / "manifest.json").write_text(json.dumps(man))


def drop_optimizer_keep_manifest(d):
    """The manifest still claims the optimizer; only loading the index reveals it is gone."""
    p = d / "rank-00000.pt"
    idx = ck.deserialize(p.read_bytes())
    del idx["state"]["optimizer"]
    data = ck.serialize(idx)
    p.write_bytes(data)
    import hashlib

    man = json.loads((d / "manifest.json").read_text())
    man["files"][0].update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    (d / "manifest.json").write_text(json.dumps(man))


def delete_manifest(d):
    (d / "manifest.json").unlink()


CASES = [
    (flip_byte, "integrity_hash_mismatch", "rank-00000.pt: sha256"),
    (flip_data_byte, "integrity_hash_mismatch", "rank-00000-0000.bin: sha256"),
    (truncate, "integrity_size_mismatch", "truncated"),
    (delete_file, "missing_file", "rank-00000.pt: file is missing"),
    (delete_data_file, "missing_file", "rank-00000-0000.bin: file is missing"),
    (drop_optimizer, "missing_state", "optimizer"),
    (drop_optimizer_keep_manifest, "missing_state", "optimizer"),
    (delete_manifest, "missing_manifest", "no manifest.json"),
]


def test_good_checkpoint_verifies(base_run, capsys):
    assert cli(["verify", "--checkpoint", str(ckpt(base_run, 3)), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["ok"] and rep["step"] == 3 and rep["world_size_at_save"] == 1
    assert {"model", "optimizer", "scheduler", "meta"} <= set(rep["state_keys"])
    man = json.loads((ckpt(base_run, 3) / "manifest.json").read_text())
    for key in (
        "files",
        "state_keys",
        "step",
        "world_size",
        "config",
        "versions",
        "created",
        "async",
    ):
        assert key in man
    f = man["files"][0]
    assert set(f) >= {"name", "rank", "role", "size", "sha256"}
    assert f["name"] == "rank-00000.pt" and f["role"] == "index"
    assert {"model", "optimizer", "scheduler", "rng", "data", "meta"} <= set(f["keys"])
    assert [x["name"] for x in man["files"][1:]] == ["rank-00000-0000.bin"]
    assert man["async"] is True
    assert man["total_bytes"] == sum(x["size"] for x in man["files"])


@pytest.mark.parametrize(("corrupt", "code", "needle"), CASES, ids=[c[0].__name__ for c in CASES])
def test_corruption_detected_everywhere(base_run, tmp_path, capsys, corrupt, code, needle):
    run = tmp_path / "run"
    shutil.copytree(base_run, run)
    d = ckpt(run, 3)
    corrupt(d)
    # verify
    assert cli(["verify", "--checkpoint", str(d), "--json"]) == 1
    rep = json.loads(capsys.readouterr().out)
    assert not rep["ok"] and rep["reason_code"] == code and needle in rep["reason"], rep
    assert cli(["verify", "--checkpoint", str(d)]) == 1
    assert f"[{code}]" in capsys.readouterr().out
    # train --resume refuses with the reason
    assert cli(["train", "--run-dir", str(tmp_path / "new"), "--resume", str(d)]) == 2
    err = capsys.readouterr().err
    assert code in err and needle in err
    # drill fails with the same reason code
    out = tmp_path / "drill.json"
    assert (
        cli(
            [
                "drill",
                "--checkpoint",
                str(d),
                "--reference",
                str(run / "metrics.jsonl"),
                "--steps",
                "2",
                "--out",
                str(out),
            ]
        )
        == 1
    )
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "failed" and doc["reason_code"] == code and needle in doc["reason"]
    # the original checkpoint directory was not written to by the drill
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000003", "step-000006"]


def test_resume_latest_skips_corrupt_newest(base_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(base_run, run)
    flip_byte(ckpt(run, 6))
    assert cli(["train", "--run-dir", str(run), "--resume", "latest"]) == 0
    err = capsys.readouterr().err
    assert "skipping step-000006" in err and "falling back to step-000003" in err
    # the corrupt newer checkpoint was moved aside, then rewritten by the resumed run
    assert ck.verify(str(ckpt(run, 6)))["ok"]
    assert list((run / "checkpoints" / ".superseded").iterdir())


def test_state_roundtrip_restores_rng(tmp_path):
    from conftest import tiny_config

    from trainer import dist
    from trainer.config import validate
    from trainer.session import Session

    s = Session(validate(tiny_config()), dist.DistEnv(), torch.device("cpu"))
    s.train_step()
    w = ck.CheckpointWriter(str(tmp_path), 0, 1, "x", False, 2)
    w.save(1, s.snapshot, {"config": s.cfg.to_dict()})
    expect = torch.rand(3)
    torch.manual_seed(999)
    s2 = Session(validate(tiny_config()), dist.DistEnv(), torch.device("cpu"))
    rep = s2.load(str(tmp_path / "step-000001"), ck.load_manifest(str(tmp_path / "step-000001")))
    assert torch.equal(torch.rand(3), expect)
    assert rep["step"] == 1 and s2.samples_consumed == 4


# -- the chunked layout: several data files per rank -----------------------------------------
@pytest.fixture(scope="module")
def chunked_run(tmp_path_factory):
    """A run whose rank file is cut into many small data files (DATA_CHUNK shrunk)."""
    from trainer_testlib import tiny_config, write_config

    d = tmp_path_factory.mktemp("chunked")
    cfg = write_config(d / "config.json", tiny_config())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("trainer.checkpoint.rankfile.DATA_CHUNK", 40 << 10)
        # Blocks straddle files and tensors.
        mp.setattr("trainer.checkpoint.durable.BLOCK", 24 << 10)
        assert cli(["train", "--config", str(cfg), "--run-dir", str(d / "run")]) == 0
    return d / "run"


def _data_files(d):
    return sorted(p.name for p in d.glob("rank-00000-*.bin"))


def test_every_file_is_listed_with_its_hash(chunked_run):
    import hashlib

    d = ckpt(chunked_run, 3)
    man = json.loads((d / "manifest.json").read_text())
    names = _data_files(d)
    assert len(names) >= 3
    on_disk = {p.name for p in d.iterdir()} - {"manifest.json", "rank-00000.json"}
    assert {f["name"] for f in man["files"]} == on_disk == {"rank-00000.pt", *names}
    for f in man["files"]:
        data = (d / f["name"]).read_bytes()
        assert f["size"] == len(data) and f["sha256"] == hashlib.sha256(data).hexdigest()
    assert sum(f["size"] for f in man["files"]) == man["total_bytes"]
    assert ck.verify(str(d))["ok"]


def test_flipped_byte_in_any_chunk_is_detected_and_named(chunked_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(chunked_run, run)
    d = ckpt(run, 3)
    names = _data_files(d)
    for name in names:
        p = d / name
        orig = p.read_bytes()
        b = bytearray(orig)
        b[-1] ^= 0x80
        p.write_bytes(bytes(b))
        rep = ck.verify(str(d))
        assert not rep["ok"] and rep["reason_code"] == "integrity_hash_mismatch", rep
        assert rep["reason"].startswith(f"{name}: sha256"), rep["reason"]
        bad = [f["name"] for f in rep["files"] if not f["sha256_ok"]]
        assert bad == [name]
        with pytest.raises(ck.CheckpointError) as ei:
            ck.load_rank(str(d), ck.load_manifest(str(d)), 0)
        assert ei.value.code == "integrity_hash_mismatch" and name in ei.value.reason
        p.write_bytes(orig)
    assert ck.verify(str(d))["ok"]
    # and the trainer refuses to resume from a corrupt middle chunk, naming it
    mid = d / names[len(names) // 2]
    b = bytearray(mid.read_bytes())
    b[0] ^= 0x01
    mid.write_bytes(bytes(b))
    assert cli(["train", "--run-dir", str(tmp_path / "new"), "--resume", str(d)]) == 2
    err = capsys.readouterr().err
    assert "integrity_hash_mismatch" in err and mid.name in err


def test_missing_or_truncated_chunk_is_named(chunked_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(chunked_run, run)
    d = ckpt(run, 3)
    names = _data_files(d)
    last = d / names[-1]
    last.write_bytes(last.read_bytes()[:-1])
    rep = ck.verify(str(d))
    assert rep["reason_code"] == "integrity_size_mismatch" and names[-1] in rep["reason"]
    assert "truncated" in rep["reason"]
    (d / names[1]).unlink()
    rep = ck.verify(str(d))
    assert rep["reason_code"] == "missing_file"
    assert rep["reason"] == f"{names[1]}: file is missing"
    assert [p["code"] for p in rep["problems"]] == ["missing_file", "integrity_size_mismatch"]


def test_chunk_left_out_of_the_manifest_is_refused(chunked_run, tmp_path):
    """A manifest that omits a data file (or the index describing other files) is bad."""
    run = tmp_path / "run"
    shutil.copytree(chunked_run, run)
    d = ckpt(run, 3)
    man = json.loads((d / "manifest.json").read_text())
    man["files"] = man["files"][:-1]
    (d / "manifest.json").write_text(json.dumps(man))
    rep = ck.verify(str(d))
    assert not rep["ok"] and rep["reason_code"] == "load_error" and "describes" in rep["reason"]
    with pytest.raises(ck.CheckpointError) as ei:
        ck.load_rank(str(d), ck.load_manifest(str(d)), 0)
    assert ei.value.code == "load_error"


def test_raw_format_roundtrip_bit_exact(tmp_path, monkeypatch):
    """dtypes (bf16, bool, int), 0-dim, empty, non-contiguous and shared tensors survive."""
    # Small files and blocks, so the tensors straddle both boundaries.
    monkeypatch.setattr("trainer.checkpoint.rankfile.DATA_CHUNK", 1000)
    monkeypatch.setattr("trainer.checkpoint.durable.BLOCK", 384)
    shared = torch.arange(300, dtype=torch.float32)
    state = {
        "model": {"w": shared, "tied": shared, "b": torch.randn(7, 5).to(torch.bfloat16)},
        "optimizer": {"state": {0: {"step": torch.tensor(3.0), "m": torch.randn(4, 6).t()}}},
        "scheduler": {"last_epoch": 3, "lrs": [0.1, 0.2]},
        "rng": {
            "python": (3, tuple(range(5)), None),
            "torch": torch.randint(0, 255, (33,), dtype=torch.uint8),
        },
        "data": {"mask": torch.tensor([True, False, True]), "idx": torch.arange(5)},
        "meta": {"empty": torch.empty(0, 3), "step": 3},
    }
    d = tmp_path / "x"
    d.mkdir()
    files = ck.save_rank(state, str(d), 0)
    assert files[0]["name"] == "rank-00000.pt" and len(files) > 2
    man = {"files": [{**f, "rank": 0} for f in files]}
    got, names, nbytes = ck.load_rank(str(d), man, 0)
    assert names == [f["name"] for f in files] and nbytes == sum(f["size"] for f in files)

    def same(a, b):
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        elif isinstance(a, dict):
            assert a.keys() == b.keys()
            for k in a:
                same(a[k], b[k])
        elif isinstance(a, (list, tuple)):
            assert type(a) is type(b) and len(a) == len(b)
            for x, y in zip(a, b, strict=True):
                same(x, y)
        else:
            assert a == b

    same(state, got)
    # shared tensors are stored once
    assert (
        sum(f["size"] for f in files[1:])
        == sum(
            t.numel() * t.element_size()
            for t in (shared, state["model"]["b"], state["optimizer"]["state"][0]["step"])
        )
        + 4 * 24
        + 33
        + 3
        + 8 * 5
    )
