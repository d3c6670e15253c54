"""Rotating a cluster's user CA (``manage.py gantry_ca_rotate``), without a cluster: the
next CA is trusted beside the current one while Gantry still signs with the current one;
``--finish`` signs with the next and drops the old; both audited; never from a web process.
Logins through the overlap on a real sshd: tests/integration/test_identities.py."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from core.audit import AuditAction
from core.models import AuditEvent
from factories import ClusterFactory
from nodes.models import Cluster

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster(settings: Any, tmp_path: Path) -> Cluster:
    from nodes.access.identities import cluster_user_ca_ensure

    settings.SSH_DIR = tmp_path / "ssh"
    cluster = ClusterFactory(name="rotcluster", user_ca_public_key="")
    cluster_user_ca_ensure(actor=None, cluster=cluster)
    cluster.refresh_from_db()
    return cluster


def _signing_ca(cluster: Cluster) -> bytes:
    """The public key of the CA a certificate Gantry signs now names."""
    from nodes.access.cluster import ssh_config_as
    from slurm.certificates import sign_user_key

    spec = ssh_config_as(cluster, "alice").certificate
    assert spec is not None
    line = sign_user_key(spec, ed25519.Ed25519PrivateKey.generate().public_key())[0]
    certificate = serialization.load_ssh_public_identity(line)
    assert isinstance(certificate, serialization.SSHCertificate)
    return certificate.signature_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )


def _key(line: str) -> bytes:
    return " ".join(line.split()[:2]).encode()


def _command(*args: str) -> str:
    out = io.StringIO()
    call_command("gantry_ca_rotate", *args, stdout=out)
    return out.getvalue()


def test_rotation_trusts_both_then_signs_with_the_new_and_drops_the_old(
    cluster: Cluster, operator: Any
) -> None:
    from nodes.access.ca_rotation import user_ca_next_key_path
    from nodes.access.cluster import user_ca_key_path

    old = cluster.user_ca_public_key
    printed = _command("--cluster", "rotcluster")
    cluster.refresh_from_db()
    new = cluster.user_ca_next_public_key
    assert new and new != old
    assert printed.splitlines()[1:] == [old, new] and "--finish" in printed
    # The overlap: both lines for the login nodes, and Gantry still signs with the old CA.
    answer = APIClient()
    answer.force_authenticate(operator)
    shown = answer.get(f"/api/v1/clusters/{cluster.pk}/user-ca/").json()
    assert shown["trusted_ca_keys"] == [old, new] and shown["public_key"] == old
    assert _signing_ca(cluster) == _key(old)
    # Again: the same pending CA, no second audit event.
    assert _command("--cluster", "rotcluster", "--public-keys").splitlines() == [old, new]
    rotated = AuditEvent.objects.get(action=AuditAction.CLUSTER_USER_CA_ROTATE)
    assert rotated.details == {"current": old, "next": new, "new_key": True}

    printed = _command("--cluster", "rotcluster", "--finish")
    cluster.refresh_from_db()
    assert printed.splitlines()[1] == new and "Remove the old line" in printed
    assert (cluster.user_ca_public_key, cluster.user_ca_next_public_key) == (new, "")
    assert _signing_ca(cluster) == _key(new)
    assert not user_ca_next_key_path(cluster).exists() and user_ca_key_path(cluster).exists()
    shown = answer.get(f"/api/v1/clusters/{cluster.pk}/user-ca/").json()
    assert shown["trusted_ca_keys"] == [new]
    finished = AuditEvent.objects.get(action=AuditAction.CLUSTER_USER_CA_ROTATE_FINISH)
    assert finished.details == {"retired": old, "current": new}
    with pytest.raises(CommandError, match="no rotation to finish"):
        _command("--cluster", "rotcluster", "--finish")


def test_a_finish_whose_rename_happened_completes_the_database_part(cluster: Cluster) -> None:
    import os

    from nodes.access.ca_rotation import cluster_user_ca_rotate, user_ca_next_key_path
    from nodes.access.cluster import user_ca_key_path

    cluster_user_ca_rotate(actor=None, cluster=cluster)
    cluster.refresh_from_db()
    new = cluster.user_ca_next_public_key
    # A crash between the rename and the database write.
    os.replace(user_ca_next_key_path(cluster), user_ca_key_path(cluster))
    _command("--cluster", "rotcluster", "--finish")
    cluster.refresh_from_db()
    assert (cluster.user_ca_public_key, cluster.user_ca_next_public_key) == (new, "")


def test_the_access_page_shows_both_lines_during_a_rotation(
    cluster: Cluster, researcher: Any, client: Any
) -> None:
    from nodes.access.ca_rotation import cluster_user_ca_rotate

    cluster_user_ca_rotate(actor=None, cluster=cluster)
    cluster.refresh_from_db()
    client.force_login(researcher)
    page = client.get(f"/clusters/{cluster.pk}/access/").content.decode()
    assert cluster.user_ca_public_key in page and cluster.user_ca_next_public_key in page
    assert "a rotation is under way" in page
    assert "AuthorizedPrincipalsCommand /usr/local/sbin/gantry-principals" in page


def test_rotation_is_refused_where_the_ca_key_may_not_be_read(
    cluster: Cluster, settings: Any
) -> None:
    settings.CA_KEY_ACCESS = "signer"
    with pytest.raises(CommandError, match="may not read the CA key"):
        _command("--cluster", "rotcluster")
    settings.CA_KEY_ACCESS = "local"
    with pytest.raises(CommandError, match="no cluster named"):
        _command("--cluster", "nowhere")
    Cluster.objects.filter(pk=cluster.pk).update(user_auth=Cluster.UserAuth.USER_KEYS)
    with pytest.raises(CommandError, match="does not use certificates"):
        _command("--cluster", "rotcluster")


def test_operators_only(cluster: Cluster, researcher: Any) -> None:
    from django.core.exceptions import PermissionDenied

    from nodes.access.ca_rotation import cluster_user_ca_rotate

    with pytest.raises(PermissionDenied):
        cluster_user_ca_rotate(actor=researcher, cluster=cluster)
