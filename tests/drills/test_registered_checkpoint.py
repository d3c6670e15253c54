"""Gantry holds a checkpoint to what it registered: the step and the manifest's digest
stored at registration (``jobs.ingest.checkpoint_register``), written into each drill's
reference (``drills.reference``) and passed to the integrity check (``drills.services.
checkpoint_verify``), whose ``not_as_registered`` marks the checkpoint failed and blocks
resuming from it.

The integrity check runs the real trainer (``python -m trainer verify``) on a real tiny
run, through a transport that runs the command here instead of over SSH: the digest Gantry
computes from the manifest bytes it read is the one the trainer computes from the file.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps as django_apps
from django.utils import timezone

from core.errors import FieldError
from drills import services
from drills.reference import drill_reference
from factories import CheckpointFactory, JobFactory
from jobs.ingest import checkpoint_register
from jobs.models import Checkpoint, Job, MetricPoint, StateFingerprint
from jobs.services import job_resume
from slurm.transport import ExecResult
from trainer.schema import DRILL_REFERENCE_SCHEMA, Reason, manifest_digest

pytestmark = pytest.mark.django_db

REPO = Path(__file__).resolve().parents[2]


def _step_dir(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step-{step:06d}"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny run of 9 steps with checkpoints at 3, 6 and 9 (read-only: tests copy it)."""
    d = tmp_path_factory.mktemp("registered")
    config = {
        "preset": "tiny",
        "d_model": 32,
        "n_layers": 1,
        "n_heads": 2,
        "seq_len": 16,
        "batch_size": 4,
        "steps": 9,
        "checkpoint_every": 3,
        "warmup_steps": 2,
        "data": {"order": 2, "branching": 3},
    }
    (d / "config.json").write_text(json.dumps(config))
    argv = ["train", "--config", str(d / "config.json"), "--run-dir", str(d / "run")]
    subprocess.run(
        [sys.executable, "-m", "trainer", *argv],
        cwd=REPO,
        env=_trainer_env(),
        check=True,
        capture_output=True,
        timeout=300,
    )
    return d / "run"


def _trainer_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))
    }
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def _register(job: Job, run: Path, step: int) -> Checkpoint:
    """What the watcher does (``jobs.rundir``): parse the manifest bytes it read, register."""
    path = _step_dir(run, step) / "manifest.json"
    checkpoint = checkpoint_register(
        job=job, manifest_path=str(path), manifest=json.loads(path.read_bytes())
    )
    assert checkpoint is not None
    return checkpoint


class LocalTransport:
    """Runs the command ``checkpoint_verify`` would run over SSH, here."""

    def __init__(self) -> None:
        self.argv: list[str] = []

    def exec(self, argv: list[str], *, check: bool = False, timeout: float = 600) -> ExecResult:
        self.argv = argv
        done = subprocess.run(
            argv, cwd=REPO, env=_trainer_env(), capture_output=True, text=True, timeout=timeout
        )
        return ExecResult(argv, done.returncode, done.stdout, done.stderr)


class ScriptedTransport:
    """Answers ``verify --json`` with a report of our making."""

    def __init__(self, report: dict[str, Any], rc: int) -> None:
        self.report, self.rc = report, rc

    def exec(self, argv: list[str], *, check: bool = False, timeout: float = 600) -> ExecResult:
        return ExecResult(argv, self.rc, json.dumps(self.report), "")


@pytest.fixture
def cluster_here(monkeypatch: pytest.MonkeyPatch) -> LocalTransport:
    transport = LocalTransport()
    monkeypatch.setattr(services, "trainer_ensure_uploaded", lambda *a, **k: str(REPO))
    monkeypatch.setattr(services, "transport_for", lambda cluster: None)
    # As the cluster's verifier would (``drills.attestation``): its result counts.
    monkeypatch.setattr(services, "integrity_checker", lambda checkpoint: (transport, True))
    return transport


@pytest.fixture
def swapped(trained: Path, tmp_path: Path) -> tuple[Path, Job, dict[int, Checkpoint]]:
    """A copy of the run, registered by Gantry, then step 3's directory given step 6's
    files (complete, every hash valid)."""
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    job = JobFactory(cluster__python=sys.executable)
    checkpoints = {step: _register(job, run, step) for step in (3, 6, 9)}
    for path in _step_dir(run, 3).iterdir():
        path.unlink()
    for path in sorted(_step_dir(run, 6).iterdir(), key=lambda p: p.name == "manifest.json"):
        shutil.copyfile(path, _step_dir(run, 3) / path.name)
    return run, job, checkpoints


# Registration -----------------------------------------------------------------------


def test_registration_stores_the_digest_of_the_manifest_it_read(trained: Path) -> None:
    job = JobFactory()
    checkpoint = _register(job, trained, 3)
    read = json.loads((_step_dir(trained, 3) / "manifest.json").read_bytes())
    assert checkpoint.manifest_digest == manifest_digest(read)
    stored = Checkpoint.objects.get(pk=checkpoint.pk)
    assert stored.manifest_digest == checkpoint.manifest_digest and stored.step == 3
    # The stored manifest lost its fingerprint (kept in its own table) and has the same
    # digest: what the backfill computes from it is what registration stored.
    assert "fingerprint" in read and "fingerprint" not in stored.manifest
    assert manifest_digest(stored.manifest) == stored.manifest_digest
    # Each checkpoint of the run has its own.
    assert _register(job, trained, 6).manifest_digest != stored.manifest_digest


def test_backfill_digests_the_stored_manifests() -> None:
    migration = importlib.import_module("jobs.migrations.0012_checkpoint_manifest_digest")
    manifest = {"format": "gantry-trainer-checkpoint/3", "step": 100, "files": [], "created": 1.5}
    old = CheckpointFactory(step=100, manifest=manifest)
    mislabelled = CheckpointFactory(step=200, manifest={**manifest, "step": 300})
    empty = CheckpointFactory(step=400, manifest={})
    kept = CheckpointFactory(step=500, manifest={**manifest, "step": 500}, manifest_digest="c" * 64)
    migration.backfill_manifest_digests(django_apps, None)
    old.refresh_from_db()
    assert old.manifest_digest == manifest_digest(manifest)
    for row in (mislabelled, empty):
        row.refresh_from_db()
        assert row.manifest_digest == ""
    kept.refresh_from_db()
    assert kept.manifest_digest == "c" * 64


def test_the_reference_holds_the_checkpoint_as_registered() -> None:
    checkpoint = CheckpointFactory(step=100, manifest_digest="d" * 64)
    StateFingerprint.objects.create(
        job=checkpoint.job, step=100, data={"step": 100}, source=StateFingerprint.Source.EVENT
    )
    MetricPoint.objects.create(job=checkpoint.job, step=101, loss=2.5, wall_time=timezone.now())
    reference = drill_reference(checkpoint, 1)
    assert reference["schema"] == DRILL_REFERENCE_SCHEMA
    assert reference["checkpoint_step"] == 100 and reference["manifest_digest"] == "d" * 64
    unknown = CheckpointFactory(job=checkpoint.job, step=200)
    assert drill_reference(unknown, 1)["manifest_digest"] is None


# The integrity check ----------------------------------------------------------------


def test_verify_of_a_swapped_checkpoint_fails_and_blocks_resume(
    swapped: tuple[Path, Job, dict[int, Checkpoint]], cluster_here: LocalTransport
) -> None:
    _, job, checkpoints = swapped
    checked = services.checkpoint_verify(checkpoint_id=checkpoints[3].pk)
    registered = ["--registered-step", "3", "--registered-manifest-digest"]
    assert cluster_here.argv[-4:] == [*registered, checkpoints[3].manifest_digest]
    assert checked.integrity == Checkpoint.Integrity.FAILED
    assert checked.integrity_report["reason_code"] == Reason.NOT_AS_REGISTERED
    assert checked.integrity_report["step"] == 6
    assert checked.integrity_detail.startswith(f"[{Reason.NOT_AS_REGISTERED}] ")
    assert "holds step 6, Gantry registered step 3" in checked.integrity_detail
    with pytest.raises(FieldError, match="integrity check"):
        job_resume(actor=job.owner, checkpoint=checked)


def test_verify_of_an_untouched_checkpoint_passes_as_registered(
    swapped: tuple[Path, Job, dict[int, Checkpoint]], cluster_here: LocalTransport
) -> None:
    # The digest Gantry stored from the bytes it read is the trainer's of the same file.
    _, _, checkpoints = swapped
    for step in (6, 9):
        checked = services.checkpoint_verify(checkpoint_id=checkpoints[step].pk)
        assert checked.integrity == Checkpoint.Integrity.OK, checked.integrity_detail
        assert checked.integrity_report["manifest_digest"] == checkpoints[step].manifest_digest


@pytest.mark.parametrize(
    "shown",
    [{"step": 6}, {"step": 3, "manifest_digest": "e" * 64}],
    ids=["another step", "another manifest"],
)
def test_a_verify_report_of_another_checkpoint_is_failed_whatever_it_says(
    monkeypatch: pytest.MonkeyPatch, shown: dict[str, Any]
) -> None:
    # A trainer on the cluster that did not hold the directory to the registration, and
    # says it is fine: Gantry holds it to what it registered itself.
    checkpoint = CheckpointFactory(step=3, manifest_digest="a" * 64)
    report = {"ok": True, "reason": None, "reason_code": None, **shown}
    monkeypatch.setattr(services, "trainer_ensure_uploaded", lambda *a, **k: "/t")
    monkeypatch.setattr(services, "transport_for", lambda cluster: None)
    monkeypatch.setattr(
        services, "integrity_checker", lambda checkpoint: (ScriptedTransport(report, 0), True)
    )
    checked = services.checkpoint_verify(checkpoint_id=checkpoint.pk)
    assert checked.integrity == Checkpoint.Integrity.FAILED
    assert checked.integrity_detail.startswith(f"[{Reason.NOT_AS_REGISTERED}] the checkpoint")


def test_a_verify_report_that_is_not_an_object_fails_the_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checkpoint = CheckpointFactory(step=3)
    monkeypatch.setattr(services, "trainer_ensure_uploaded", lambda *a, **k: "/t")
    monkeypatch.setattr(services, "transport_for", lambda cluster: None)
    not_an_object: Any = [1]
    monkeypatch.setattr(
        services,
        "integrity_checker",
        lambda checkpoint: (ScriptedTransport(not_an_object, 0), True),
    )
    checked = services.checkpoint_verify(checkpoint_id=checkpoint.pk)
    assert checked.integrity == Checkpoint.Integrity.FAILED
