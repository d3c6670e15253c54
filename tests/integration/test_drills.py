"""Restore drills on the dev cluster with a real worker, beat and Redis."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from drill_damage import KINDS, as_owner, damage_by_name, registered_digest
from drill_support import checkpoint_dir, run_job, start_drill, wait_finished, wait_verdict
from rest_framework.test import APIClient

from celery_support import wait_until
from devcluster_support import DevCluster, LoginNode, devcluster_env, owner_and_private_mode
from drills.models import RestoreDrill
from jobs.models import Checkpoint, Job
from nodes.models import Cluster

pytestmark = pytest.mark.django_db(transaction=True)


def flip_byte(d: Path) -> None:
    target = d / "rank-00000-0000.bin"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))


def truncate(d: Path) -> None:
    target = d / "rank-00000-0000.bin"
    target.write_bytes(target.read_bytes()[:-100])


def delete_rank_file(d: Path) -> None:
    (d / "rank-00001.pt").unlink()


def remove_optimizer_state(d: Path) -> None:
    """Rewrite rank 0's index without the optimizer and make the manifest agree, so only
    the state check can catch it (hashes and sizes all match; the test registers this
    manifest, as if the trainer had written it so)."""
    from trainer import checkpoint as trainer_checkpoint

    index_file = d / "rank-00000.pt"
    index = trainer_checkpoint.deserialize(index_file.read_bytes())
    del index["state"]["optimizer"]
    data = trainer_checkpoint.serialize(index)
    index_file.write_bytes(data)
    manifest = json.loads((d / "manifest.json").read_text())
    entry = next(f for f in manifest["files"] if f["name"] == "rank-00000.pt")
    entry.update(
        size=len(data), sha256=hashlib.sha256(data).hexdigest(), keys=sorted(index["state"])
    )
    manifest["state_keys"] = [k for k in manifest["state_keys"] if k != "optimizer"]
    (d / "manifest.json").write_text(json.dumps(manifest))


def delete_manifest(d: Path) -> None:
    (d / "manifest.json").unlink()


CORRUPTIONS = [
    (flip_byte, "integrity_hash_mismatch", "rank-00000-0000.bin"),
    (truncate, "integrity_size_mismatch", "rank-00000-0000.bin"),
    (delete_rank_file, "missing_file", "rank-00001.pt"),
    (remove_optimizer_state, "missing_state", "optimizer"),
    (delete_manifest, "missing_manifest", "manifest"),
]
# Damage from before registration: Gantry registered the manifest the trainer wrote so.
WRITTEN_SO = {remove_optimizer_state}


def register_as_written(checkpoint: Checkpoint, d: Path) -> None:
    Checkpoint.objects.filter(pk=checkpoint.pk).update(manifest_digest=registered_digest(d))


SWAP = "checkpoint swapped for another step (complete, hashes valid)"


def _assert_swap_failed(
    swapped: Checkpoint, untouched: Checkpoint, drill_id: str, worker: Any
) -> None:
    """The swapped checkpoint fails the integrity check and the drill as
    ``not_as_registered`` (resume blocked); the one whose files it got still verifies."""

    def verified(checkpoint: Checkpoint) -> Checkpoint:
        wait_until(
            lambda: Checkpoint.objects.get(pk=checkpoint.pk).integrity_report is not None,
            timeout=120,
            what=lambda: (
                f"the integrity check of step {checkpoint.step}; worker log:\n"
                f"{worker.log()[-3000:]}"
            ),
        )
        return Checkpoint.objects.get(pk=checkpoint.pk)

    report = verified(swapped).integrity_report
    assert report["reason_code"] == "not_as_registered" and report["step"] == 50, report
    good = verified(untouched)
    assert good.integrity == "ok", good.integrity_detail
    assert good.integrity_report["manifest_digest"] == good.manifest_digest
    drill = wait_verdict(drill_id, worker)
    assert drill.verdict == "failed" and drill.reason_code == "not_as_registered", drill.reason
    assert "holds step 50, Gantry registered step 45" in drill.reason
    assert Checkpoint.objects.get(pk=swapped.pk).integrity == "failed"


@pytest.fixture
def verified_cluster(dev_cluster_registered: Cluster, devcluster: DevCluster) -> Cluster:
    """The dev cluster with its drill verifier (``gantry-verify``): drills run as it and
    count as proof (``drills.attestation``)."""
    verifier = devcluster.env.get("GANTRY_CLUSTER_VERIFIER")
    if not verifier:
        pytest.skip("this dev cluster has no verifier account: run scripts/devcluster up")
    Cluster.objects.filter(pk=dev_cluster_registered.pk).update(verifier_account=verifier)
    dev_cluster_registered.refresh_from_db()
    return dev_cluster_registered


@pytest.mark.slow
@pytest.mark.nodes(2)
def test_drills_pass_and_every_corruption_fails_with_its_reason(
    verified_cluster: Cluster,
    dev_cluster_registered: Any,
    celery_stack: Any,
    researcher_api: APIClient,
    devcluster: DevCluster,
) -> None:
    worker = celery_stack["worker"]
    job = wait_finished(run_job(researcher_api, steps=50, every=5, name="drilled"), worker)
    checkpoints = {c.step: c for c in job.checkpoints.all()}
    assert sorted(checkpoints)[:9] == [5, 10, 15, 20, 25, 30, 35, 40, 45]
    # Gantry holds the state of every checkpoint, from the trainer's checkpoint events.
    assert set(job.fingerprints.values_list("step", flat=True)) >= set(checkpoints)

    # By default a drill replays to the run's next checkpoint and compares its state.
    same = start_drill(researcher_api, checkpoints[10])
    other = start_drill(researcher_api, checkpoints[15], nodes=1)
    assert RestoreDrill.objects.get(id=same).replay_to_step == 15
    assert RestoreDrill.objects.get(id=same).steps == 5
    # The same checkpoint and allocation cannot be drilled twice at once.
    duplicate = researcher_api.post(
        f"/api/v1/checkpoints/{checkpoints[10].pk}/drills/", {"steps": 3}, format="json"
    )
    assert duplicate.status_code == 409
    assert "already running" in duplicate.json()["message"]
    # The final checkpoint has no steps after it to compare with.
    final = researcher_api.post(
        f"/api/v1/checkpoints/{checkpoints[50].pk}/drills/", {"steps": 3}, format="json"
    )
    assert final.status_code == 400 and "steps" in final.json()["extra"]["fields"]

    corrupted: dict[str, tuple[str, str]] = {}
    for step, (corrupt, reason_code, mention) in zip([20, 25, 30, 35, 5], CORRUPTIONS, strict=True):
        with as_owner(checkpoint_dir(devcluster, checkpoints[step])):
            corrupt(checkpoint_dir(devcluster, checkpoints[step]))
        if corrupt in WRITTEN_SO:
            register_as_written(checkpoints[step], checkpoint_dir(devcluster, checkpoints[step]))
        corrupted[start_drill(researcher_api, checkpoints[step], steps=3)] = (reason_code, mention)
    # 1% on the weights with every hash, sidecar and manifest recomputed (as the trainer
    # wrote it, Gantry registered it so), and the run's own metrics.jsonl "fixed" to match:
    # only Gantry's fingerprint can tell, on another shape.
    weights = next(k for k in KINDS if k.name.startswith("weights altered"))
    assert weights.registered_as_written
    weights.apply(
        checkpoint_dir(devcluster, checkpoints[40]), checkpoint_dir(devcluster, checkpoints[45])
    )
    register_as_written(checkpoints[40], checkpoint_dir(devcluster, checkpoints[40]))
    tampered = start_drill(researcher_api, checkpoints[40], nodes=1)
    # Step 45's directory given step 50's checkpoint: complete, every hash valid, only not
    # what Gantry registered at 45. The integrity check and the drill hold it to that.
    damage_by_name(SWAP).apply(
        checkpoint_dir(devcluster, checkpoints[45]), checkpoint_dir(devcluster, checkpoints[50])
    )
    for step in (45, 50):
        response = researcher_api.post(f"/api/v1/checkpoints/{checkpoints[step].pk}/verify/")
        assert response.status_code == 202, response.json()
    swapped = start_drill(researcher_api, checkpoints[45], steps=3)
    _assert_swap_failed(checkpoints[45], checkpoints[50], swapped, worker)

    passed_same = wait_verdict(same, worker)
    assert passed_same.verdict == "passed", passed_same.reason
    assert passed_same.evidence["mode"] == "exact"
    assert all(step["ok"] and step["abs_diff"] == 0 for step in passed_same.evidence["steps"])
    assert passed_same.evidence["state"]["at_load"]["compared"]
    assert passed_same.evidence["state"]["at_end"]["step"] == 15
    assert passed_same.evidence["reference_digest"] == passed_same.reference_digest
    assert passed_same.load_s is not None and passed_same.integrity_s is not None
    assert passed_same.trainer_digest == job.__class__.objects.get(id=job.id).trainer_digest
    checkpoints[10].refresh_from_db()
    assert checkpoints[10].last_proven_at is not None and checkpoints[10].integrity == "ok"

    passed_other = wait_verdict(other, worker)
    assert passed_other.verdict == "passed", passed_other.reason
    assert passed_other.evidence["mode"] == "tolerance"
    assert passed_other.evidence["allocation"]["world_size"] == 1
    assert passed_other.evidence["state"]["at_end"]["step"] == 20

    caught = wait_verdict(tampered, worker)
    assert caught.verdict == "failed", caught.reason
    assert caught.reason_code == "state_mismatch" and "model/" in caught.reason

    for drill_id, (reason_code, mention) in corrupted.items():
        drill = wait_verdict(drill_id, worker)
        assert drill.verdict == "failed", (reason_code, drill.verdict, drill.reason)
        assert drill.reason_code == reason_code, (drill.reason_code, drill.reason)
        assert mention in drill.reason
        drill.checkpoint.refresh_from_db()
        assert drill.checkpoint.integrity == "failed"
        assert drill.checkpoint.last_proven_at is None

    # A checkpoint that failed its integrity check cannot be resumed from.
    blocked = researcher_api.post(
        f"/api/v1/jobs/{job.id}/resume/", {"checkpoint_step": 20}, format="json"
    )
    assert blocked.status_code == 400
    assert "integrity" in blocked.json()["extra"]["fields"]["checkpoint"][0]
    detail = researcher_api.get(f"/api/v1/drills/{same}/").json()
    assert detail["verdict"] == "passed" and detail["evidence"]["steps"]
    panel = researcher_api.get(f"/api/v1/checkpoints/{checkpoints[10].pk}/").json()
    assert panel["fingerprint"]["tensors"] > 0
    assert [p["wrote_it"] for p in panel["proven_by"]] == [True]


def _trainer_variant(marker: str) -> tuple[str, list[tuple[str, bytes]]]:
    """Another trainer version: today's files plus one module, under its own digest."""
    from runs.runtime import trainer_files
    from runs.trainers import _digest_of

    files = [*trainer_files(), ("_variant.py", f"# {marker}\n".encode())]
    return _digest_of(files), files


@pytest.mark.nodes(2)
def test_drill_runs_the_recorded_trainer_version_and_a_compatibility_drill_the_current(
    verified_cluster: Cluster,
    dev_cluster_registered: Any,
    celery_stack: Any,
    researcher_api: APIClient,
    devcluster: DevCluster,
    tmp_path: Path,
) -> None:
    import io
    import zipfile

    import trainer
    from runs.trainers import archive_path

    worker = celery_stack["worker"]
    job = wait_finished(run_job(researcher_api, steps=10, every=5, name="versions"), worker)
    checkpoint = job.checkpoints.get(step=5)
    assert job.trainer_digest == trainer.source_digest()

    # Pretend an older trainer wrote it: Gantry keeps that version's archive only (the
    # cluster never saw it), so the drill ships it again and runs it.
    older, files = _trainer_variant("an older trainer")
    path = archive_path(older)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files:
            archive.writestr(name, data)
    path.write_bytes(buffer.getvalue())
    Job.objects.filter(id=job.id).update(trainer_digest=older)
    recorded = start_drill(researcher_api, checkpoint)
    compatibility = start_drill(researcher_api, checkpoint, trainer="current")
    ran = wait_verdict(recorded, worker)
    assert ran.verdict == "passed", ran.reason
    assert ran.trainer_digest == older
    assert (Path(devcluster.workdir) / "trainer" / older[:20] / ".complete").exists()
    compatible = wait_verdict(compatibility, worker)
    assert compatible.verdict == "passed", compatible.reason
    assert compatible.trainer_digest == trainer.source_digest()
    panel = researcher_api.get(f"/api/v1/checkpoints/{checkpoint.pk}/").json()
    assert {(p["trainer_digest"], p["wrote_it"]) for p in panel["proven_by"]} == {
        (older, True),
        (trainer.source_digest(), False),
    }

    # A version neither Gantry nor the cluster holds: inconclusive, before any Slurm job.
    gone, _ = _trainer_variant("a trainer nobody kept")
    Job.objects.filter(id=job.id).update(trainer_digest=gone)
    unavailable = wait_verdict(start_drill(researcher_api, checkpoint), worker)
    assert unavailable.verdict == "inconclusive", unavailable.reason
    assert unavailable.reason_code == "trainer_unavailable" and not unavailable.slurm_job_id
    checkpoint.refresh_from_db()
    assert checkpoint.integrity != "failed"  # inconclusive never blocks resuming


@pytest.mark.nodes(2)
def test_sshd_down_gives_error_not_failed_and_drills_recover(
    dev_cluster_registered: Any,
    celery_stack: Any,
    researcher_api: APIClient,
    devcluster: DevCluster,
    own_login_node: LoginNode,
) -> None:
    worker = celery_stack["worker"]
    job = wait_finished(run_job(researcher_api, steps=20, every=5, name="ssh-faults"), worker)
    checkpoints = {c.step: c for c in job.checkpoints.all()}

    # sshd down while a drill is submitted: it cannot run, which is an error, not a verdict.
    own_login_node.sshd_stop()
    try:
        from slurm.transport import close_all

        close_all()
        drill_id = start_drill(researcher_api, checkpoints[5], steps=3)
        errored = wait_verdict(drill_id, worker, timeout=120)
    finally:
        own_login_node.sshd_start()
    assert errored.verdict == "error", errored.reason
    assert "not a verdict on the checkpoint" in errored.reason
    checkpoints[5].refresh_from_db()
    assert checkpoints[5].integrity != "failed"

    # sshd down while a drill runs: the cluster shows the error, the drill goes on, and
    # once sshd is back Gantry reads the verdict.
    drill_id = start_drill(researcher_api, checkpoints[10], steps=3)
    wait_until(
        lambda: RestoreDrill.objects.get(id=drill_id).slurm_job_id,
        timeout=60,
        what="the drill's Slurm job",
    )
    own_login_node.sshd_stop()
    try:
        wait_until(
            lambda: (
                dev_cluster_registered.__class__.objects.get(
                    pk=dev_cluster_registered.pk
                ).last_reconcile_error
            ),
            timeout=60,
            what="the watcher to notice the cluster is unreachable",
        )
        assert RestoreDrill.objects.get(id=drill_id).is_active
    finally:
        own_login_node.sshd_start()
    recovered = wait_verdict(drill_id, worker, timeout=120)
    assert recovered.verdict == "passed", recovered.reason


@pytest.mark.nodes(2)
def test_policy_drills_a_running_job(
    dev_cluster_registered: Any,
    celery_stack: Any,
    researcher_api: APIClient,
    operator_api: APIClient,
) -> None:
    worker = celery_stack["worker"]
    job = run_job(researcher_api, steps=100000, every=10, name="long-running", nodes=1, keep=100000)
    try:
        wait_until(
            lambda: (Job.objects.get(id=job.id).last_step or 0) >= 25,
            timeout=120,
            what=lambda: f"training progress; worker log:\n{worker.log()[-2000:]}",
        )
        response = operator_api.put(
            f"/api/v1/clusters/{dev_cluster_registered.pk}/drill-policy/",
            {"enabled": True, "running_every_hours": 1, "max_in_flight": 1, "steps": 3},
            format="json",
        )
        assert response.status_code == 200, response.json()
        denied = researcher_api.put(
            f"/api/v1/clusters/{dev_cluster_registered.pk}/drill-policy/",
            {"enabled": False},
            format="json",
        )
        assert denied.status_code == 403
        drill = wait_until(
            lambda: RestoreDrill.objects.filter(checkpoint__job=job).first(),
            timeout=60,
            what="beat to start a policy drill",
        )
        assert drill.trigger == "policy_running" and drill.requested_by is None
        finished = wait_verdict(str(drill.id), worker)
        assert finished.verdict == "passed", finished.reason
        # At most one drill per job per period: no flood.
        assert RestoreDrill.objects.filter(checkpoint__job=job).count() == 1
    finally:
        researcher_api.post(f"/api/v1/jobs/{job.id}/cancel/")


def _sacct_user(devcluster: DevCluster, slurm_job_id: str) -> str:
    out = devcluster.slurm(["sacct", "-n", "-X", "-P", "-j", slurm_job_id, "-o", "User"]).stdout
    return out.strip()


@pytest.mark.slow
@pytest.mark.nodes(2)
def test_a_verifier_drill_runs_as_the_verifier_where_the_owner_cannot_write_and_proves(
    verified_cluster: Cluster,
    celery_stack: Any,
    researcher_api: APIClient,
    devcluster: DevCluster,
) -> None:
    import os
    import pwd

    worker = celery_stack["worker"]
    verifier = verified_cluster.verifier_account
    job = wait_finished(run_job(researcher_api, steps=15, every=5, name="attested"), worker)
    assert job.run_as == "alice"
    checkpoints = {c.step: c for c in job.checkpoints.all()}
    # The checkpoint failed an earlier check: resuming from it is blocked.
    Checkpoint.objects.filter(pk=checkpoints[5].pk).update(
        integrity="failed", integrity_detail="an earlier drill failed it"
    )

    drill = wait_verdict(start_drill(researcher_api, checkpoints[5]), worker)
    assert drill.verdict == "passed", drill.reason
    assert drill.attestation == "verifier" and drill.verifier_account == verifier
    # Slurm ran it as the verifier; its directory and report are the verifier's alone.
    assert _sacct_user(devcluster, drill.slurm_job_id) == verifier
    directory = Path(devcluster.workdir, "users", verifier, "drills", str(drill.id))
    env = devcluster_env()
    readers = {env.get("GANTRY_CLUSTER_USER", ""), verifier}
    assert owner_and_private_mode(directory, readers) == (verifier, 0o700)
    assert pwd.getpwuid(os.stat(directory / "drill.json").st_uid).pw_name == verifier
    owners_drills = Path(devcluster.workdir, "users", "alice", "runs", str(job.id), "drills")
    assert not (owners_drills / str(drill.id)).exists()
    # Alice can neither write a report there nor put anything in the verifier's area.
    for target in (directory / "drill.json", directory.parent / "forged.json"):
        refused = devcluster.run_as("alice", ["sh", "-c", f"echo '{{}}' > {target}"], check=False)
        assert refused.returncode != 0 and "Permission denied" in refused.stderr, refused
    # Its pass proves the checkpoint and lifts the block.
    checkpoints[5].refresh_from_db()
    assert checkpoints[5].last_proven_at is not None and checkpoints[5].integrity == "ok"
    resumed = researcher_api.post(
        f"/api/v1/jobs/{job.id}/resume/", {"checkpoint_step": 5}, format="json"
    )
    assert resumed.status_code == 202, resumed.json()
    researcher_api.post(f"/api/v1/jobs/{resumed.json()['id']}/cancel/")
    detail = researcher_api.get(f"/api/v1/drills/{drill.id}/").json()
    assert detail["attestation"] == "verifier" and detail["verifier_account"] == verifier

    # Without the verifier the same drill runs as alice: a pass, self-attested, lifts nothing.
    Cluster.objects.filter(pk=verified_cluster.pk).update(verifier_account="")
    Checkpoint.objects.filter(pk=checkpoints[10].pk).update(
        integrity="failed", integrity_detail="an earlier drill failed it"
    )
    own = wait_verdict(start_drill(researcher_api, checkpoints[10]), worker)
    assert own.verdict == "passed", own.reason
    assert own.attestation == "self" and _sacct_user(devcluster, own.slurm_job_id) == "alice"
    checkpoints[10].refresh_from_db()
    assert checkpoints[10].integrity == "failed" and checkpoints[10].last_proven_at is None
    blocked = researcher_api.post(
        f"/api/v1/jobs/{job.id}/resume/", {"checkpoint_step": 10}, format="json"
    )
    assert blocked.status_code == 400
    assert "integrity" in blocked.json()["extra"]["fields"]["checkpoint"][0]
