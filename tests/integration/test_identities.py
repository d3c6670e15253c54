"""Jobs run as the researcher, on the dev cluster: two researchers' jobs run under their own
Unix users (sacct says so), each run directory is readable by its account alone, an
operator's drill of a researcher's checkpoint runs as the researcher, an expired
certificate is refused by sshd and Gantry signs a new one, and the pool keeps one
connection per identity within its limits."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest
from drill_support import run_job, start_drill, wait_finished, wait_verdict
from rest_framework.test import APIClient

from celery_support import wait_until
from core.audit import AuditAction
from core.models import AuditEvent
from devcluster_support import DevCluster, devcluster_env, owner_and_private_mode
from jobs.models import Job
from nodes.models import Cluster

pytestmark = pytest.mark.django_db(transaction=True)


def _sacct_user(devcluster: DevCluster, slurm_job_id: str) -> str:
    out = devcluster.slurm(["sacct", "-n", "-X", "-P", "-j", slurm_job_id, "-o", "User"]).stdout
    return out.strip()


def _owner_and_mode(path: str) -> tuple[str, int]:
    # The service account reads run directories (an ACL); the verifier reads checkpoints.
    env = devcluster_env()
    readers = {env.get("GANTRY_CLUSTER_USER", ""), env.get("GANTRY_CLUSTER_VERIFIER", "")}
    return owner_and_private_mode(path, readers)


@pytest.mark.nodes(2)
def test_two_researchers_jobs_run_as_their_own_unix_users(
    dev_cluster_registered: Cluster,
    celery_stack: Any,
    researcher_api: APIClient,
    other_researcher: Any,
    operator_api: APIClient,
    operator: Any,
    devcluster: DevCluster,
) -> None:
    other_api = APIClient()
    other_api.force_authenticate(user=other_researcher)
    worker = celery_stack["worker"]
    ritas = run_job(researcher_api, steps=8, every=4, name="ritas", nodes=1)
    robs = run_job(other_api, steps=4, every=2, name="robs", nodes=1)
    ritas, robs = wait_finished(ritas, worker), wait_finished(robs, worker)
    assert (ritas.run_as, robs.run_as) == ("alice", "bob")

    # Slurm's accounting shows each job under its own Unix user.
    assert _sacct_user(devcluster, ritas.slurm_job_id) == "alice"
    assert _sacct_user(devcluster, robs.slurm_job_id) == "bob"

    # Each run directory is its account's alone (0700), under that account's area.
    workdir = devcluster.workdir
    rita_dir = f"{workdir}/users/alice/runs/{ritas.id}"
    rob_dir = f"{workdir}/users/bob/runs/{robs.id}"
    assert _owner_and_mode(rita_dir) == ("alice", 0o700)
    assert _owner_and_mode(rob_dir) == ("bob", 0o700)
    assert _owner_and_mode(f"{workdir}/users/alice") == ("alice", 0o700)
    assert _owner_and_mode(f"{workdir}/users")[1] == 0o1777
    for command in (["ls", rita_dir], ["cat", f"{rita_dir}/metrics.jsonl"]):
        refused = devcluster.run_as("bob", command, check=False)
        assert refused.returncode != 0 and "Permission denied" in refused.stderr, refused
    assert devcluster.run_as("alice", ["cat", f"{rita_dir}/metrics.jsonl"]).stdout
    # The trainer archive is shared and read-only for researchers.
    trainer_dirs = sorted(Path(workdir, "trainer").iterdir())
    assert trainer_dirs and all(_owner_and_mode(str(d))[0] == devcluster.user for d in trainer_dirs)
    assert devcluster.run_as("bob", ["touch", f"{trainer_dirs[0]}/x"], check=False).returncode

    # Gantry read both as their owners: metrics, checkpoints, the log tail.
    assert ritas.metric_points.count() == 8 and robs.metric_points.count() == 4
    assert ritas.checkpoints.count() == 2 and robs.checkpoints.count() == 2
    # The tail is read by a worker as alice (the web request reads nothing): polled.
    wait_until(
        lambda: (
            "gantry: job" in researcher_api.get(f"/api/v1/jobs/{ritas.id}/logs/").json()["text"]
        ),
        timeout=30,
        what="the log tail, read by the worker as alice",
    )
    submit = AuditEvent.objects.get(action=AuditAction.JOB_SUBMIT, target_id=str(robs.id))
    assert submit.details["run_as"] == "bob"

    # An operator's drill of rita's checkpoint runs as alice, audited as the operator's.
    checkpoint = ritas.checkpoints.get(step=4)
    drill_id = start_drill(operator_api, checkpoint)
    drill = wait_verdict(drill_id, worker)
    assert drill.verdict == "passed", (drill.verdict, drill.reason)
    assert _sacct_user(devcluster, drill.slurm_job_id) == "alice"
    started = AuditEvent.objects.get(action=AuditAction.DRILL_START, target_id=drill_id)
    assert started.actor == operator and started.details["run_as"] == "alice"
    assert _owner_and_mode(f"{rita_dir}/drills/{drill_id}") == ("alice", 0o700)


def _sshd_log(devcluster: DevCluster) -> str:
    return (devcluster.dir / "log" / "sshd.log").read_text(errors="replace")


@pytest.mark.nodes(0)
def test_an_expired_certificate_is_refused_and_gantry_signs_a_new_one(
    dev_cluster_registered: Cluster, devcluster: DevCluster, tmp_path: Path
) -> None:
    from nodes.access.cluster import ssh_config_as, transport_as
    from slurm.certificates import SignedKey, signed_key
    from slurm.connect import open_client
    from slurm.errors import SshAuthenticationError
    from slurm.transport import close_all

    close_all()
    config = ssh_config_as(dev_cluster_registered, "alice")
    assert config.certificate is not None
    expired = signed_key(config.certificate, now=time.time() - 7200, valid_seconds=60)
    log_before = len(_sshd_log(devcluster))
    with pytest.raises(SshAuthenticationError, match="user CA"):
        open_client(config, expired.key)
    assert "expired" in _sshd_log(devcluster)[log_before:].lower()

    # Gantry holds that certificate and believes it valid (the login node's clock runs
    # ahead, say): sshd refuses it, Gantry signs a new one once and gets in.
    transport = transport_as(dev_cluster_registered, "alice")
    transport._signed = SignedKey(
        key=expired.key, valid_before=time.time() + 3600, serial=expired.serial
    )
    assert transport.exec(["id", "-un"]).stdout.strip() == "alice"
    assert transport.certificates_signed == 1
    assert transport._signed is not None and transport._signed.serial != expired.serial
    # Reconnecting reuses the fresh certificate while it lasts.
    transport.close()
    assert transport.exec(["id", "-un"]).stdout.strip() == "alice"
    assert transport.certificates_signed == 1 and transport.connections_opened == 2

    # No CA sshd does not trust logs in (the service account: see
    # test_user_ca.py: Gantry cannot even make a certificate for it).
    from slurm.certificates import generate_ca_private_key

    stranger = tmp_path / "stranger_ca"
    stranger.write_bytes(generate_ca_private_key())
    stranger.chmod(0o600)
    untrusted = dataclasses.replace(config.certificate, ca_key_path=str(stranger), key_id="t:a")
    with pytest.raises(SshAuthenticationError):
        open_client(config, signed_key(untrusted).key)
    close_all()


@pytest.mark.nodes(0)
def test_the_pool_keeps_one_connection_per_identity_within_its_limits(
    dev_cluster_registered: Cluster, settings: Any
) -> None:
    from nodes.access.cluster import transport_as, transport_for
    from slurm.transport import close_all, close_idle, pool_connections

    close_all()
    settings.SSH_POOL_MAX_PER_CLUSTER = 2
    service = transport_for(dev_cluster_registered)
    login_node = service.config.login_node
    service.exec(["true"])
    for _ in range(3):
        assert transport_as(dev_cluster_registered, "alice").exec(["id", "-un"]).stdout == (
            "alice\n"
        )
    alice = transport_as(dev_cluster_registered, "alice")
    assert alice.connections_opened == 1 and alice.commands_run == 3
    assert len(pool_connections(login_node)) == 2
    # A third identity: the least recently used idle connection (the service account's)
    # is closed to make room.
    assert transport_as(dev_cluster_registered, "bob").exec(["id", "-un"]).stdout == "bob\n"
    open_now = pool_connections(login_node)
    assert len(open_now) == 2 and service not in open_now and service.idle_closes == 1
    # Used again, it reconnects (closing the next least recently used).
    service.exec(["true"])
    assert service.connected and service.connections_opened == 2
    assert not alice.connected and len(pool_connections(login_node)) == 2

    # Idle ones are closed after the idle timeout.
    settings.SSH_POOL_IDLE_TIMEOUT = 0.2
    transport_for(dev_cluster_registered)  # the pool takes the limits in force
    time.sleep(0.4)
    assert close_idle() == 2 and pool_connections(login_node) == []
    close_all()


@pytest.mark.nodes(0)
def test_an_account_the_login_node_refuses_fails_the_job_saying_why(
    dev_cluster_registered: Cluster, operator: Any
) -> None:
    """Mapped to an account sshd will not let in (no such Unix user there): nothing is
    sent to Slurm, and the job says what to check, instead of retrying forever."""
    from factories import UserFactory
    from jobs.services import job_submit_to_slurm
    from nodes.access.identities import cluster_identity_set

    dave = UserFactory(username="dave-nowhere", role="researchers")
    cluster_identity_set(
        actor=operator, cluster=dev_cluster_registered, user=dave, account="nosuchuser"
    )
    api = APIClient()
    api.force_authenticate(user=dave)
    response = api.post(
        "/api/v1/jobs/submit/",
        {
            "name": "nowhere",
            "partition": "batch",
            "nodes": 1,
            "tasks_per_node": 1,
            "time_limit_minutes": 5,
            "config": {"preset": "tiny", "steps": 2},
        },
        format="json",
    )
    assert response.status_code == 202, response.json()
    job_id = response.json()["id"]
    outcome = job_submit_to_slurm(job_id=job_id)
    job = Job.objects.get(id=job_id)
    assert job.state == "failed" and not job.slurm_job_id and job.sbatch_sent_at is None
    assert "could not log in to devcluster as nosuchuser" in job.state_reason, outcome
    assert "TrustedUserCAKeys" in job.state_reason
