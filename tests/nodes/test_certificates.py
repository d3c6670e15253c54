"""Red team, without a cluster: what Gantry's user CA certifies. Never root, a system
account or the service account (a certificate spec for them cannot even be made); the one
principal is Gantry's namespaced name; ``source-address`` when the cluster has networks
(as ``ssh-keygen -L`` reads the certificate); a signer's answer is held to what was asked;
and the login node's principals command prints nothing for the accounts Gantry refuses."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from core.errors import FieldError
from factories import ClusterFactory
from nodes.models import Cluster

pytestmark = pytest.mark.django_db
REPO = Path(__file__).resolve().parents[2]
PRINCIPALS = REPO / "scripts" / "gantry-principals"


@pytest.fixture
def cluster(settings: Any, tmp_path: Path) -> Cluster:
    from nodes.access.identities import cluster_user_ca_ensure

    settings.SSH_DIR = tmp_path / "ssh"
    cluster = ClusterFactory(name="certcluster", ssh_user="gantry", user_ca_public_key="")
    cluster_user_ca_ensure(actor=None, cluster=cluster)
    return cluster


def _sign(cluster: Cluster, account: str = "alice") -> serialization.SSHCertificate:
    from nodes.access.cluster import ssh_config_as
    from slurm.certificates import sign_user_key

    config = ssh_config_as(cluster, account)
    assert config.certificate is not None
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    line, _valid_before, _serial = sign_user_key(config.certificate, key)
    certificate = serialization.load_ssh_public_identity(line)
    assert isinstance(certificate, serialization.SSHCertificate)
    return certificate


@pytest.mark.parametrize("account", ["root", "toor", "daemon", "nobody", "systemd-network"])
def test_gantry_refuses_to_sign_for_root_or_a_system_account(
    cluster: Cluster, account: str
) -> None:
    from nodes.access.cluster import certificate_spec, ssh_config_as
    from slurm.certificates import CertificateSpec

    with pytest.raises(ValueError, match="system account"):
        ssh_config_as(cluster, account)
    with pytest.raises(ValueError, match="system account"):
        certificate_spec(cluster, account)
    # By construction: no spec, so nothing to sign, whoever builds it.
    with pytest.raises(ValueError, match="system account"):
        CertificateSpec(
            cluster="certcluster",
            account=account,
            service_account="gantry",
            key_id="x",
            ca_key_path="/nonexistent",
        )


def test_gantry_refuses_to_sign_for_the_service_account(cluster: Cluster) -> None:
    from nodes.access.cluster import certificate_spec
    from slurm.certificates import CertificateSpec

    with pytest.raises(ValueError, match="service account"):
        certificate_spec(cluster, "gantry")
    with pytest.raises(ValueError, match="service account"):
        CertificateSpec(
            cluster="c", account="svc", service_account="svc", key_id="x", ca_key_path="/k"
        )


def test_the_principal_is_gantrys_namespaced_name_and_nothing_else(cluster: Cluster) -> None:
    certificate = _sign(cluster, "alice")
    assert certificate.valid_principals == [b"gantry:certcluster:alice"]
    assert b"alice" not in certificate.valid_principals
    assert certificate.critical_options == {} and certificate.extensions == {}


def test_source_address_is_on_the_certificate_when_the_cluster_has_networks(
    cluster: Cluster, operator: Any, tmp_path: Path
) -> None:
    from nodes.services import cluster_update

    cluster_update(
        actor=operator,
        cluster=cluster,
        certificate_source_addresses="10.1.0.0/16, 192.0.2.7",
    )
    cluster.refresh_from_db()
    certificate = _sign(cluster)
    assert certificate.critical_options == {b"source-address": b"10.1.0.0/16,192.0.2.7/32"}
    # OpenSSH reads it the same way.
    path = tmp_path / "alice-cert.pub"
    path.write_bytes(certificate.public_bytes())
    listing = subprocess.run(
        ["ssh-keygen", "-L", "-f", str(path)], capture_output=True, text=True, check=True
    ).stdout
    assert "source-address 10.1.0.0/16,192.0.2.7/32" in listing
    assert "gantry:certcluster:alice" in listing


@pytest.mark.parametrize("bad", ["10.0.0.1/8", "not-an-address", "10.0.0.0/33", "10.0.0.0/8;x"])
def test_source_addresses_are_validated_as_cidr(cluster: Cluster, operator: Any, bad: str) -> None:
    from nodes.services import cluster_update

    with pytest.raises(FieldError) as raised:
        cluster_update(actor=operator, cluster=cluster, certificate_source_addresses=bad)
    assert raised.value.field == "certificate_source_addresses"
    assert "CIDR" in raised.value.why or "network" in raised.value.why
    cluster.refresh_from_db()
    assert cluster.certificate_source_addresses == ""


def test_the_admin_sets_source_addresses_through_the_service(
    cluster: Cluster, operator: Any, client: Any
) -> None:
    from core.audit import AuditAction
    from core.models import AuditEvent

    client.force_login(operator)
    page = client.get(f"/admin/nodes/cluster/{cluster.pk}/change/")
    assert page.status_code == 200 and "certificate_source_addresses" in page.content.decode()
    form = {
        key: value
        for key, value in page.context["adminform"].form.initial.items()
        if value is not None and not isinstance(value, list | dict)
    }
    form.update(
        {
            "certificate_source_addresses": "10.2.0.0/24",
            "extra_allowed_environment": "[]",
            "partitions-TOTAL_FORMS": "0",
            "partitions-INITIAL_FORMS": "0",
        }
    )
    url = f"/admin/nodes/cluster/{cluster.pk}/change/"
    refused = client.post(url, {**form, "certificate_source_addresses": "10.0.0.1/8"})
    assert refused.status_code == 200 and "host bits set" in refused.content.decode()
    saved = client.post(url, form)
    assert saved.status_code == 302, saved.content.decode()[:2000]
    cluster.refresh_from_db()
    assert cluster.certificate_source_addresses == "10.2.0.0/24"
    updated = AuditEvent.objects.get(action=AuditAction.CLUSTER_UPDATE)
    assert updated.details["after"]["certificate_source_addresses"] == "10.2.0.0/24"


def _fresh_spec(**changes: Any) -> Any:
    from slurm.certificates import CertificateSpec

    values = {
        "cluster": "c1",
        "account": "alice",
        "service_account": "gantry",
        "key_id": "gantry:c1:alice:web",
        "signer": lambda spec, public: "",
    }
    values.update(changes)
    return CertificateSpec(**values)


def test_a_signers_answer_is_held_to_what_was_asked(tmp_path: Path) -> None:
    """A signer that answers with another key's certificate, another principal, a bare
    account name or other source addresses is refused: the web never logs in with it."""
    from slurm.certificates import (
        CertificateSpec,
        check_signed,
        generate_ca_private_key,
        sign_user_key,
    )
    from slurm.errors import SshConfigurationError

    ca = tmp_path / "ca"
    ca.write_bytes(generate_ca_private_key())
    asked = _fresh_spec()
    ours = ed25519.Ed25519PrivateKey.generate().public_key()
    theirs = ed25519.Ed25519PrivateKey.generate().public_key()

    def made(spec: CertificateSpec, key: ed25519.Ed25519PublicKey) -> str:
        return sign_user_key(spec, key)[0].decode()

    local = {"ca_key_path": str(ca), "signer": None}
    good = made(_fresh_spec(**local), ours)
    assert check_signed(asked, ours, good)[0] == good.encode()
    lies = [
        made(_fresh_spec(**local), theirs),
        made(_fresh_spec(account="bob", **local), ours),
        made(_fresh_spec(cluster="c2", **local), ours),
        made(_fresh_spec(source_addresses=("10.0.0.0/8",), **local), ours),
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGt5IHNvbWV0aGluZyBlbHNlIGVudGlyZWx5IQ== x",
        "garbage",
    ]
    for lie in lies:
        with pytest.raises(SshConfigurationError):
            check_signed(asked, ours, lie)


def test_a_spec_needs_a_ca_file_or_a_signer_and_no_local_validity_with_a_signer() -> None:
    from slurm.certificates import signed_key

    with pytest.raises(ValueError, match="CA key file or a signer"):
        _fresh_spec(signer=None)
    with pytest.raises(ValueError, match="signer decides"):
        signed_key(_fresh_spec(), now=time.time() - 3600)


def _principals(account: str, *extra: str) -> str:
    argv = [str(PRINCIPALS), "--cluster", "c1", "--service-account", "svc", *extra, account]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=10).stdout


def test_the_principals_command_prints_nothing_for_root_system_and_service_accounts() -> None:
    for account in ("root", "daemon", "bin", "nobody", "svc", "no-such-user-here", "-x", "A"):
        assert _principals(account) == "", account
    # daemon (uid 1) is only refused for its uid: inside a range, it gets its one principal,
    # and --also-bare adds the bare name for the upgrade overlap.
    assert _principals("daemon", "--min-uid", "1", "--max-uid", "1") == "gantry:c1:daemon\n"
    assert _principals("daemon", "--min-uid", "1", "--max-uid", "1", "--also-bare") == (
        "gantry:c1:daemon\ndaemon\n"
    )
    # root and the service account never, whatever the range.
    assert _principals("root", "--min-uid", "0", "--also-bare") == ""
    refused = subprocess.run(
        [str(PRINCIPALS), "--cluster", "bad name", "--service-account", "svc", "alice"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert refused.returncode == 2 and refused.stdout == ""
