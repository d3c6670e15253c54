"""Per-user cluster identities without a cluster: mappings (API, audit, refusals), the
user CA and the certificates it signs, who a job / resume / drill runs as, and the 400 an
unmapped user gets."""

from __future__ import annotations

import stat
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from rest_framework.test import APIClient

from core.audit import AuditAction
from core.models import AuditEvent
from factories import (
    CheckpointFactory,
    ClusterFactory,
    GpuFactory,
    JobFactory,
    NodeFactory,
    PartitionFactory,
    UserFactory,
)
from jobs.models import Job
from nodes.models import Cluster, ClusterIdentity

pytestmark = pytest.mark.django_db


@pytest.fixture
def ssh_dir(settings: Any, tmp_path: Path) -> Path:
    settings.SSH_DIR = tmp_path / "ssh"
    return settings.SSH_DIR


@pytest.fixture
def cluster(ssh_dir: Path) -> Cluster:
    cluster = ClusterFactory(name="idcluster", is_default=True, user_ca_public_key="")
    PartitionFactory(cluster=cluster, name="batch", max_time_minutes=60, is_default=True)
    for name in ("n1", "n2"):
        node = NodeFactory(cluster=cluster, name=name, partitions=["batch"], cpus_total=2)
        GpuFactory(node=node, index=0)
    from nodes.access.identities import cluster_user_ca_ensure

    cluster_user_ca_ensure(actor=None, cluster=cluster)
    return cluster


def body(**overrides: Any) -> dict[str, Any]:
    data = {
        "name": "mine",
        "cluster": "idcluster",
        "partition": "batch",
        "nodes": 1,
        "tasks_per_node": 1,
        "time_limit_minutes": 5,
        "config": {"preset": "tiny", "steps": 10},
    }
    data.update(overrides)
    return data


def api_for(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user=user)
    return client


# ---------------------------------------------------------------- submitting


def test_an_unmapped_user_gets_a_400_naming_the_field_and_the_fix(cluster: Cluster) -> None:
    ursula = UserFactory(username="ursula", role="researchers")
    response = api_for(ursula).post("/api/v1/jobs/submit/", body(), format="json")
    assert response.status_code == 400, response.json()
    payload = response.json()
    assert set(payload) == {"message", "extra"}
    why = payload["extra"]["fields"]["cluster"][0]
    assert "ursula has no account on cluster idcluster" in why
    assert "ask an operator to map" in why
    assert not Job.objects.exists()
    # The preview (which shows the script and its paths) is refused the same way.
    preview = api_for(ursula).post("/api/v1/jobs/preview/", body(), format="json")
    assert preview.status_code == 400 and "cluster" in preview.json()["extra"]["fields"]


def test_a_mapped_user_submits_and_the_job_runs_as_their_account(
    cluster: Cluster, researcher: Any
) -> None:
    response = api_for(researcher).post("/api/v1/jobs/submit/", body(), format="json")
    assert response.status_code == 202, response.json()
    job = Job.objects.get(id=response.json()["id"])
    assert job.run_as == "alice"
    event = AuditEvent.objects.get(action=AuditAction.JOB_SUBMIT, target_id=str(job.id))
    assert event.details["run_as"] == "alice"
    from jobs.lifecycle import JOBS
    from jobs.script import job_script

    directory = f"/srv/gantry/users/alice/runs/{job.id}"
    assert JOBS.run_directory(job) == directory
    assert f"#SBATCH --chdir={directory}" in job_script(job)


def test_without_a_ca_a_certificate_cluster_refuses_submissions(
    ssh_dir: Path, researcher: Any
) -> None:
    bare = ClusterFactory(name="bare", user_ca_public_key="")
    PartitionFactory(cluster=bare, name="batch", is_default=True)
    GpuFactory(node=NodeFactory(cluster=bare, name="n1", partitions=["batch"]), index=0)
    response = api_for(researcher).post("/api/v1/jobs/submit/", body(cluster="bare"), format="json")
    assert response.status_code == 400
    assert "no user CA yet" in response.json()["extra"]["fields"]["cluster"][0]


def test_legacy_service_account_mode_is_an_explicit_audited_choice(
    cluster: Cluster, operator: Any, researcher: Any
) -> None:
    ursula = UserFactory(username="ursula", role="researchers")
    refused = api_for(researcher).put(
        f"/api/v1/clusters/{cluster.pk}/user-auth/", {"user_auth": "service_account"}
    )
    assert refused.status_code == 403
    answer = api_for(operator).put(
        f"/api/v1/clusters/{cluster.pk}/user-auth/",
        {"user_auth": "service_account"},
        format="json",
    )
    assert answer.status_code == 200, answer.json()
    event = AuditEvent.objects.get(action=AuditAction.CLUSTER_USER_AUTH)
    assert event.details == {"before": "certificate", "after": "service_account"}
    assert event.actor == operator
    response = api_for(ursula).post("/api/v1/jobs/submit/", body(), format="json")
    assert response.status_code == 202
    job = Job.objects.get(id=response.json()["id"])
    from jobs.lifecycle import JOBS

    assert job.run_as == "" and JOBS.run_directory(job) == f"/srv/gantry/runs/{job.id}"


def test_a_study_of_an_unmapped_user_is_refused_up_front(cluster: Cluster) -> None:
    ursula = UserFactory(username="ursula", role="researchers")
    response = api_for(ursula).post(
        "/api/v1/studies/",
        {
            "name": "s",
            "cluster": cluster.pk,
            "kind": "weak",
            "scales": [1, 2],
            "partition": "batch",
            "gpus_per_rank": 0,
        },
        format="json",
    )
    assert response.status_code == 400, response.json()
    assert "cluster" in response.json()["extra"]["fields"]


# ---------------------------------------------------------------- mappings


def test_operators_map_users_through_the_api_audited(
    cluster: Cluster, operator: Any, researcher: Any
) -> None:
    ursula = UserFactory(username="ursula", role="researchers")
    url = f"/api/v1/clusters/{cluster.pk}/identities/set/"
    assert api_for(researcher).post(url, {"user": "ursula", "account": "ursula"}).status_code == 403
    created = api_for(operator).post(url, {"user": "ursula", "account": "ursula"}, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["account"] == "ursula" and created.json()["user"] == "ursula"
    moved = api_for(operator).post(url, {"user": "ursula", "account": "dave"}, format="json")
    assert moved.status_code == 201
    events = AuditEvent.objects.filter(action=AuditAction.CLUSTER_IDENTITY_SET).order_by("id")
    assert [(e.details["before"], e.details["after"]) for e in events] == [
        (None, "ursula"),
        ("ursula", "dave"),
    ]
    assert all(e.actor == operator for e in events)
    assert ClusterIdentity.objects.get(cluster=cluster, user=ursula).account == "dave"
    listed = api_for(operator).get(f"/api/v1/clusters/{cluster.pk}/identities/").json()
    assert {row["user"]: row["account"] for row in listed}["ursula"] == "dave"
    mine = api_for(ursula).get(f"/api/v1/clusters/{cluster.pk}/identity/").json()
    assert mine["account"] == "dave" and mine["fix"] is None

    identity = ClusterIdentity.objects.get(cluster=cluster, user=ursula)
    gone = api_for(operator).post(f"/api/v1/clusters/{cluster.pk}/identities/{identity.pk}/delete/")
    assert gone.status_code == 204
    assert AuditEvent.objects.filter(action=AuditAction.CLUSTER_IDENTITY_DELETE).exists()
    mine = api_for(ursula).get(f"/api/v1/clusters/{cluster.pk}/identity/").json()
    assert mine["account"] is None and "ask an operator" in mine["fix"]


@pytest.mark.parametrize(
    ("account", "why"),
    [
        ("gantry", "service account"),
        ("root", "system account"),
        ("slurm", "system account"),
        ("www-data", "system account"),
        ("nobody", "system account"),
        ("Alice", "Unix user name"),
        ("alice\n", "Unix user name"),
        ("a;id", "Unix user name"),
        ("../etc", "Unix user name"),
        ("x" * 33, "Unix user name"),
        ("", "Unix user name"),
    ],
)
def test_accounts_that_must_never_be_mapped_are_refused_with_the_field(
    cluster: Cluster, operator: Any, account: str, why: str
) -> None:
    UserFactory(username="ursula", role="researchers")
    response = api_for(operator).post(
        f"/api/v1/clusters/{cluster.pk}/identities/set/",
        {"user": "ursula", "account": account},
        format="json",
    )
    assert response.status_code == 400, response.json()
    fields = response.json()["extra"]["fields"]
    assert "account" in fields and why in fields["account"][0]
    assert not ClusterIdentity.objects.filter(user__username="ursula").exists()


def test_one_user_per_account_and_one_account_per_user(
    cluster: Cluster, operator: Any, researcher: Any, other_researcher: Any
) -> None:
    from core.errors import FieldError
    from nodes.access.identities import cluster_identity_set

    with pytest.raises(FieldError, match="already mapped to rita-researcher"):
        cluster_identity_set(
            actor=operator, cluster=cluster, user=other_researcher, account="alice"
        )
    assert ClusterIdentity.objects.filter(cluster=cluster, user=researcher).count() == 1
    from django.db import IntegrityError, transaction

    with pytest.raises(IntegrityError), transaction.atomic():
        ClusterIdentity.objects.create(cluster=cluster, user=researcher, account="zed")


# ---------------------------------------------------------------- the CA


def test_the_ca_is_a_0600_file_its_public_half_shown_creation_audited(
    cluster: Cluster, ssh_dir: Path, operator: Any
) -> None:
    from nodes.access.cluster import user_ca_key_path
    from nodes.access.identities import cluster_user_ca_ensure

    path = user_ca_key_path(cluster)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    private = serialization.load_ssh_private_key(path.read_bytes(), password=None)
    assert isinstance(private, ed25519.Ed25519PrivateKey)
    public = private.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    cluster.refresh_from_db()
    assert cluster.user_ca_public_key.startswith(public.decode() + " gantry-user-ca:")
    # Again: the same key, no second audit event.
    assert cluster_user_ca_ensure(actor=operator, cluster=cluster) == cluster.user_ca_public_key
    assert AuditEvent.objects.filter(action=AuditAction.CLUSTER_USER_CA_CREATE).count() == 1
    answer = api_for(operator).get(f"/api/v1/clusters/{cluster.pk}/user-ca/").json()
    assert answer["public_key"] == cluster.user_ca_public_key
    assert answer["sshd_config_line"] == "TrustedUserCAKeys /etc/ssh/gantry-idcluster-user-ca.pub"
    # The login node accepts, per account, only Gantry's principal for it.
    assert answer["sshd_config_lines"] == [
        "TrustedUserCAKeys /etc/ssh/gantry-idcluster-user-ca.pub",
        "AuthorizedPrincipalsCommand /usr/local/sbin/gantry-principals --cluster idcluster "
        f"--service-account {cluster.ssh_user} %u",
        "AuthorizedPrincipalsCommandUser nobody",
    ]
    assert answer["trusted_ca_keys"] == [cluster.user_ca_public_key]
    detail = api_for(operator).get(f"/api/v1/clusters/{cluster.pk}/").json()
    assert detail["user_ca_public_key"] == cluster.user_ca_public_key
    assert detail["user_ca_sshd_config_line"] == answer["sshd_config_line"]


def test_certificates_name_one_principal_expire_in_minutes_and_grant_nothing_else(
    cluster: Cluster, settings: Any
) -> None:
    from nodes.access.cluster import ssh_config_as
    from slurm.certificates import sign_user_key

    settings.SSH_CERTIFICATE_MINUTES = 7
    config = ssh_config_as(cluster, "alice")
    assert config.user == "alice" and config.key_path == "" and config.certificate is not None
    user_key = ed25519.Ed25519PrivateKey.generate().public_key()
    before = int(time.time())
    line, _valid_before, serial = sign_user_key(config.certificate, user_key)
    certificate = serialization.load_ssh_public_identity(line)
    assert isinstance(certificate, serialization.SSHCertificate)
    assert certificate.type == serialization.SSHCertificateType.USER
    # Gantry's name for the account, never the bare account name a login node's default
    # (principal = user name) would take for the user.
    assert certificate.valid_principals == [b"gantry:idcluster:alice"]
    assert certificate.key_id == b"gantry:idcluster:alice"
    assert certificate.extensions == {} and certificate.critical_options == {}
    assert before + 7 * 60 <= certificate.valid_before <= before + 7 * 60 + 2
    assert certificate.valid_after <= before and certificate.serial == serial
    certificate.verify_cert_signature()
    ca = serialization.load_ssh_public_key(cluster.user_ca_public_key.encode())
    assert certificate.signature_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ) == ca.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)


def test_gantry_never_logs_in_as_the_service_account_or_a_bad_name_for_a_user(
    cluster: Cluster,
) -> None:
    from nodes.access.cluster import ssh_config_as
    from slurm.errors import SshConfigurationError

    with pytest.raises(SshConfigurationError, match="service account"):
        ssh_config_as(cluster, "gantry")
    for bad in ("root\n", "a b", "-oProxyCommand=x", "ALICE", "root", "daemon", "www-data"):
        with pytest.raises(ValueError):
            ssh_config_as(cluster, bad)
    cluster.user_auth = Cluster.UserAuth.SERVICE_ACCOUNT
    with pytest.raises(SshConfigurationError, match="service-account mode"):
        ssh_config_as(cluster, "alice")


def test_user_keys_mode_makes_a_key_pair_the_user_installs(
    cluster: Cluster, operator: Any, researcher: Any
) -> None:
    from nodes.access.cluster import user_key_path
    from nodes.access.identities import cluster_user_auth_set

    cluster = cluster_user_auth_set(actor=operator, cluster=cluster, user_auth="user_keys")
    mine = api_for(researcher).get(f"/api/v1/clusters/{cluster.pk}/identity/").json()
    assert mine["user_auth"] == "user_keys" and mine["account"] == "alice"
    assert mine["public_key"].startswith("ssh-ed25519 ")
    key = user_key_path(cluster, "alice")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    private = serialization.load_ssh_private_key(key.read_bytes(), password=None)
    public = private.public_key().public_bytes(  # type: ignore[union-attr]
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    assert mine["public_key"].startswith(public.decode())
    page = APIClient()
    page.force_login(researcher)
    html = page.get(f"/clusters/{cluster.pk}/access/").content.decode()
    assert mine["public_key"] in html and "PRIVATE KEY" not in html
    from nodes.access.cluster import ssh_config_as

    assert ssh_config_as(cluster, "alice").key_path == str(key)


# ---------------------------------------------------------------- who runs as whom


def test_a_resume_runs_as_the_checkpoints_account_whoever_asks(
    cluster: Cluster, operator: Any, researcher: Any
) -> None:
    from core.errors import FieldError
    from jobs.services import job_resume
    from nodes.access.identities import cluster_identity_set

    parent = JobFactory(owner=researcher, cluster=cluster, run_as="alice", state="completed")
    checkpoint = CheckpointFactory(job=parent, step=5)
    resumed = job_resume(actor=operator, checkpoint=checkpoint)
    assert resumed.owner == operator and resumed.run_as == "alice"
    # Re-mapped since: the old account's checkpoint is not resumed as someone else.
    cluster_identity_set(actor=operator, cluster=cluster, user=researcher, account="dave")
    with pytest.raises(FieldError, match="no longer rita-researcher's account"):
        job_resume(actor=researcher, checkpoint=checkpoint)


def test_a_drill_runs_as_the_checkpoints_account_and_is_audited_as_the_operator(
    cluster: Cluster, operator: Any, researcher: Any
) -> None:
    from drills.lifecycle import DRILLS
    from drills.models import RestoreDrill

    job = JobFactory(owner=researcher, cluster=cluster, run_as="alice", state="completed")
    checkpoint = CheckpointFactory(job=job, step=5)
    drill = RestoreDrill.objects.create(
        checkpoint=checkpoint, cluster=cluster, requested_by=operator, steps=1
    )
    assert DRILLS.run_as(drill) == "alice"
    assert DRILLS.run_directory(drill) == (
        f"/srv/gantry/users/alice/runs/{job.id}/drills/{drill.id}"
    )
    assert DRILLS.transport_of(drill).config.user == "alice"


def test_tag_matches_of_another_account_are_neither_adopted_nor_duplicates(
    cluster: Cluster, researcher: Any
) -> None:
    from jobs.lifecycle import JOBS
    from slurm.parsers import SlurmJob

    job = JobFactory(owner=researcher, cluster=cluster, run_as="alice")
    found = [
        SlurmJob(job_id="1", state="PENDING", user="bob"),
        SlurmJob(job_id="2", state="PENDING", user="alice"),
        SlurmJob(job_id="3", state="PENDING", user=None),
    ]
    assert [j.job_id for j in JOBS.owned(job, found)] == ["2", "3"]
    legacy = JobFactory(owner=researcher, cluster=cluster, run_as="")
    assert [j.job_id for j in JOBS.owned(legacy, found)] == ["3"]


# ---------------------------------------------------------------- the admin and the page


def test_the_admin_maps_users_through_the_service(
    cluster: Cluster, operator: Any, client: Any
) -> None:
    ursula = UserFactory(username="ursula", role="researchers")
    client.force_login(operator)
    page = client.get("/admin/nodes/clusteridentity/add/")
    assert page.status_code == 200
    refused = client.post(
        "/admin/nodes/clusteridentity/add/",
        {"cluster": cluster.pk, "user": ursula.pk, "account": "gantry"},
    )
    assert refused.status_code == 200 and "service account" in refused.content.decode()
    saved = client.post(
        "/admin/nodes/clusteridentity/add/",
        {"cluster": cluster.pk, "user": ursula.pk, "account": "ursula"},
    )
    assert saved.status_code == 302, saved.content.decode()[:2000]
    identity = ClusterIdentity.objects.get(cluster=cluster, user=ursula)
    assert identity.account == "ursula"
    event = AuditEvent.objects.get(action=AuditAction.CLUSTER_IDENTITY_SET)
    assert event.actor == operator and event.details["after"] == "ursula"
    change = client.get(f"/admin/nodes/cluster/{cluster.pk}/change/").content.decode()
    assert cluster.user_ca_public_key in change and "TrustedUserCAKeys" in change
    legacy = client.post(
        "/admin/nodes/cluster/",
        {"action": "use_service_account", "_selected_action": [cluster.pk]},
    )
    assert legacy.status_code == 302
    cluster.refresh_from_db()
    assert cluster.user_auth == Cluster.UserAuth.SERVICE_ACCOUNT
    switched = AuditEvent.objects.get(action=AuditAction.CLUSTER_USER_AUTH)
    assert switched.actor == operator and switched.details["after"] == "service_account"
    deleted = client.post(f"/admin/nodes/clusteridentity/{identity.pk}/delete/", {"post": "yes"})
    assert deleted.status_code == 302
    assert AuditEvent.objects.filter(action=AuditAction.CLUSTER_IDENTITY_DELETE).exists()


def test_the_access_page_shows_your_account_the_ca_and_no_one_elses_mapping(
    cluster: Cluster, researcher: Any, operator: Any, client: Any
) -> None:
    client.force_login(researcher)
    mine = client.get(f"/clusters/{cluster.pk}/access/").content.decode()
    assert "alice" in mine and cluster.user_ca_public_key in mine
    assert "TrustedUserCAKeys /etc/ssh/gantry-idcluster-user-ca.pub" in mine
    assert "carol" not in mine and "olivia-operator" not in mine
    client.force_login(operator)
    theirs = client.get(f"/clusters/{cluster.pk}/access/").content.decode()
    assert "rita-researcher" in theirs and "alice" in theirs
    ursula = UserFactory(username="ursula", role="researchers")
    client.force_login(ursula)
    none = client.get(f"/clusters/{cluster.pk}/access/").content.decode()
    assert "You have no account on idcluster" in none
