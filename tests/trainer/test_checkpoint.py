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


def drop_optimizer(d):
    """A well-formed checkpoint (hashes match) that lacks the optimizer state."""
    p = d / "rank-00000.pt"
    st = ck.deserialize(p.read_bytes())
    del st["optimizer"]
    data = ck.serialize(st)
    p.write_bytes(data)
    man = json.loads((d / "manifest.json").read_text())
    import hashlib

    f = man["files"][0]
    f.update(size=len(data), sha256=hashlib.sha256(data).hexdigest(), keys=sorted(st))
    man["state_keys"].remove("optimizer")
    (d / "manifest.json").write_text(json.dumps(man))


def drop_optimizer_keep_manifest(d):
    """The manifest still claims the optimizer; only loading the file reveals it is gone."""
    p = d / "rank-00000.pt"
    st = ck.deserialize(p.read_bytes())
    del st["optimizer"]
    data = ck.serialize(st)
    p.write_bytes(data)
    import hashlib

    man = json.loads((d / "manifest.json").read_text())
    man["files"][0].update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    (d / "manifest.json").write_text(json.dumps(man))


def delete_manifest(d):
    (d / "manifest.json").unlink()


CASES = [
    (flip_byte, "integrity_hash_mismatch", "rank-00000.pt: sha256"),
    (truncate, "integrity_size_mismatch", "truncated"),
    (delete_file, "missing_file", "rank-00000.pt: file is missing"),
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
    assert set(f) >= {"name", "rank", "size", "sha256"}
    assert {"model", "optimizer", "scheduler", "rng", "data", "meta"} <= set(f["keys"])
    assert man["async"] is True


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
    from trainer.train import Session

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
