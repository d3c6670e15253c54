"""A checkpoint directory is held to the checkpoint Gantry registered: its step and its
manifest's digest (``trainer.schema.manifest_digest``), carried in Gantry's reference and
passed to ``verify``.

The case from the issue: a run with checkpoints at steps 3, 6 and 9; step 3's directory
gets step 6's files (complete, every size, sha256, sidecar and the manifest valid). Every
other check passes on such a directory, so without the registration the drill could only
say it was asked about the wrong step (inconclusive) and resuming from it stayed allowed.
Held to what Gantry registered it fails (``not_as_registered``), before any file is read;
the untouched checkpoints still pass. Real torch on CPU, one process.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from drill_damage import damage_by_name, registered_digest
from trainer_testlib import ckpt, cli, tiny_config, write_config

from trainer import checkpoint as ck
from trainer.drill import reference_from_metrics
from trainer.schema import Reason, manifest_digest

SWAP = "checkpoint swapped for another step (complete, hashes valid)"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """9 steps, checkpoints at 3, 6 and 9 (read-only: tests copy it)."""
    d = tmp_path_factory.mktemp("registered")
    cfg = write_config(d / "config.json", tiny_config(steps=9))
    assert cli(["train", "--config", str(cfg), "--run-dir", str(d / "run")]) == 0
    return d / "run"


@pytest.fixture
def swapped(run: Path, tmp_path: Path) -> tuple[Path, dict[int, str]]:
    """A copy of the run whose step-3 directory holds step 6's checkpoint; and the digests
    Gantry registered before that (from the manifests as the trainer wrote them)."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    registered = {step: registered_digest(ckpt(copy, step)) for step in (3, 6, 9)}
    damage_by_name(SWAP).apply(ckpt(copy, 3), ckpt(copy, 6))
    return copy, registered


def _reference(run: Path, dest: Path, step: int, digest: str | None) -> Path:
    """What Gantry writes for a drill of ``step`` (``drills.reference``): the run's losses
    and fingerprints, the dataset, and the checkpoint as registered."""
    reference = reference_from_metrics(str(run / "metrics.jsonl"))
    acceptance = json.loads((run / "acceptance.json").read_text())
    reference.update(
        dataset_sha256=acceptance["dataset_sha256"], checkpoint_step=step, manifest_digest=digest
    )
    dest.write_text(json.dumps(reference))
    return dest


def _drill(run: Path, step: int, reference: Path, out: Path) -> tuple[int, dict[str, Any]]:
    args = ["drill", "--checkpoint", str(ckpt(run, step)), "--reference", str(reference)]
    code = cli([*args, "--steps", "3", "--out", str(out)])
    return code, json.loads(out.read_text())


def _verify(capsys: pytest.CaptureFixture[str], path: Path, *registered: str) -> tuple[int, Any]:
    capsys.readouterr()
    code = cli(["verify", "--checkpoint", str(path), "--json", *registered])
    return code, json.loads(capsys.readouterr().out)


def test_the_swapped_directory_is_a_complete_self_consistent_checkpoint(swapped):
    # What makes the swap hard: every check that reads only the directory passes.
    run, registered = swapped
    report = ck.verify(str(ckpt(run, 3)))
    assert report["ok"] is True and report["step"] == 6
    assert ck.rank_consistency(str(ckpt(run, 3)), ck.load_manifest(str(ckpt(run, 3)))) == []
    assert report["manifest_digest"] == registered[6] != registered[3]


def test_a_drill_of_a_swapped_checkpoint_fails_as_not_registered(swapped, tmp_path):
    run, registered = swapped
    reference = _reference(run, tmp_path / "ref3.json", 3, registered[3])
    code, doc = _drill(run, 3, reference, tmp_path / "drill.json")
    assert code == 1
    assert doc["verdict"] == "failed" and doc["reason_code"] == Reason.NOT_AS_REGISTERED
    assert "holds step 6, Gantry registered step 3" in doc["reason"]
    assert "manifest digest" in doc["reason"]
    # Before anything else: no file hashed, nothing loaded, no step replayed.
    assert doc["integrity"]["files"] == [] and doc["steps"] == []
    assert doc["state"] == {"at_load": None, "at_end": None}
    assert doc["checkpoint"]["step"] == 6
    assert doc["checkpoint"]["manifest_digest"] == registered[6]


def test_the_untouched_checkpoint_still_passes(swapped, tmp_path):
    run, registered = swapped
    reference = _reference(run, tmp_path / "ref6.json", 6, registered[6])
    code, doc = _drill(run, 6, reference, tmp_path / "drill.json")
    assert code == 0 and doc["verdict"] == "passed", doc["reason"]
    assert doc["checkpoint"]["step"] == 6
    assert doc["checkpoint"]["manifest_digest"] == registered[6]
    assert doc["state"]["at_load"]["compared"] and doc["state"]["at_end"]["step"] == 9


def test_a_checkpoint_registered_before_digests_is_held_to_its_step(swapped, tmp_path):
    # Gantry's reference without a digest (a row it could not backfill): the step alone
    # still tells the swap apart.
    run, _ = swapped
    reference = _reference(run, tmp_path / "ref3.json", 3, None)
    code, doc = _drill(run, 3, reference, tmp_path / "drill.json")
    assert code == 1 and doc["reason_code"] == Reason.NOT_AS_REGISTERED
    assert "holds step 6, Gantry registered step 3" in doc["reason"]


def test_a_manifest_rewritten_at_the_same_step_fails_by_its_digest(run, tmp_path):
    # The step is right and every hash is valid (the rank rewritten with its sidecar and
    # the manifest): only the registered digest tells it from what Gantry registered.
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    registered = registered_digest(ckpt(copy, 3))
    damage_by_name("weights altered 1% (hashes valid)").apply(ckpt(copy, 3), ckpt(copy, 6))
    assert ck.verify(str(ckpt(copy, 3)))["ok"] is True
    reference = _reference(copy, tmp_path / "ref3.json", 3, registered)
    code, doc = _drill(copy, 3, reference, tmp_path / "drill.json")
    assert code == 1 and doc["reason_code"] == Reason.NOT_AS_REGISTERED
    assert "manifest digest" in doc["reason"] and "holds step" not in doc["reason"]


@pytest.mark.parametrize(
    ("registered", "says"),
    [({"checkpoint_step": "3"}, "checkpoint_step"), ({"manifest_digest": 7}, "manifest_digest")],
)
def test_a_reference_with_a_malformed_registration_cannot_judge(run, tmp_path, registered, says):
    reference = _reference(run, tmp_path / "ref.json", 3, registered_digest(ckpt(run, 3)))
    reference.write_text(json.dumps({**json.loads(reference.read_text()), **registered}))
    code, doc = _drill(run, 3, reference, tmp_path / "drill.json")
    assert code == 5 and doc["reason_code"] == Reason.REFERENCE_INCOMPLETE
    assert says in doc["reason"]


def test_verify_holds_the_checkpoint_to_the_registered_step_and_digest(swapped, capsys):
    run, registered = swapped
    swap = ckpt(run, 3)
    # Unheld, the swapped directory verifies: nothing in it is wrong.
    code, report = _verify(capsys, swap)
    assert code == 0 and report["ok"] is True
    code, report = _verify(
        capsys, swap, "--registered-step", "3", "--registered-manifest-digest", registered[3]
    )
    assert code == 1 and report["ok"] is False
    assert report["reason_code"] == Reason.NOT_AS_REGISTERED
    assert report["problems"] == [{"code": Reason.NOT_AS_REGISTERED, "reason": report["reason"]}]
    assert report["step"] == 6 and report["files"] == []
    # The step alone, or the digest alone, is enough.
    assert _verify(capsys, swap, "--registered-step", "3")[0] == 1
    assert _verify(capsys, swap, "--registered-manifest-digest", registered[3])[0] == 1
    # The untouched checkpoints verify as registered.
    for step in (6, 9):
        code, report = _verify(
            capsys,
            ckpt(run, step),
            "--registered-step",
            str(step),
            "--registered-manifest-digest",
            registered[step],
        )
        assert code == 0 and report["ok"] is True, report["reason"]
        assert report["manifest_digest"] == registered[step]


def test_the_digest_leaves_out_only_the_fingerprint(run):
    # Gantry drops the manifest's fingerprint when it registers (it keeps it in its own
    # table): the digest of what it stores is the digest of what it read.
    manifest = ck.load_manifest(str(ckpt(run, 3)))
    assert "fingerprint" in manifest
    stored = {k: v for k, v in manifest.items() if k != "fingerprint"}
    assert manifest_digest(stored) == manifest_digest(manifest)
    assert manifest_digest({**manifest, "created": manifest["created"] + 1}) != manifest_digest(
        manifest
    )
