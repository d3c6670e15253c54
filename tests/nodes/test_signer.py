"""The certificate signer (``nodes.access.signer``), without a cluster or a Celery worker: what it
certifies (mapped accounts only, for the web's purpose, with its own database's principal,
lifetime and source addresses), that a web process (``GANTRY_CA_KEY_ACCESS=signer``)
never opens the CA key while it gets certificates and creates the CA, and how a missing
signer shows. The same through a real worker and sshd: tests/integration/test_identities.py."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from signer_support import in_process_round_trip, watching_opens

from core.audit import AuditAction
from core.models import AuditEvent
from factories import ClusterFactory, UserFactory
from nodes.models import Cluster, ClusterIdentity

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster(settings: Any, tmp_path: Path) -> Cluster:
    from nodes.access.identities import cluster_user_ca_ensure

    settings.SSH_DIR = tmp_path / "ssh"
    cluster = ClusterFactory(name="signcluster", ssh_user="gantry", user_ca_public_key="")
    cluster_user_ca_ensure(actor=None, cluster=cluster)
    rita = UserFactory(username="rita-signer", role="researchers")
    ClusterIdentity.objects.create(cluster=cluster, user=rita, account="alice")
    return cluster


def _public_line() -> str:
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    return key.public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()


def _sign(**changes: Any) -> dict[str, Any]:
    from nodes.access.signer import user_certificate_sign

    request = {
        "cluster": "signcluster",
        "account": "alice",
        "public_key": _public_line(),
        "purpose": "web",
    }
    request.update(changes)
    return user_certificate_sign(**request)


def test_the_signer_certifies_mapped_accounts_for_the_web_only(cluster: Cluster) -> None:
    assert "certificate" in _sign()
    someone = UserFactory(username="mallory", role="researchers")
    # Rows no service would write (the mapping refuses them), as if the database were edited.
    ClusterIdentity.objects.create(cluster=cluster, user=someone, account="root")
    ClusterIdentity.objects.create(
        cluster=cluster, user=UserFactory(username="eve", role="researchers"), account="gantry"
    )
    refusals = {
        "unmapped": _sign(account="bob"),
        "root": _sign(account="root"),
        "service": _sign(account="gantry"),
        "purpose": _sign(purpose="worker"),
        "cluster": _sign(cluster="nowhere"),
        "key": _sign(public_key="ssh-ed25519 bm90IGEga2V5"),
        "rsa": _sign(public_key="ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQC7 x"),
    }
    for why, answer in refusals.items():
        assert set(answer) == {"refused", "transient"} and answer["refused"], (why, answer)
    assert "not mapped" in refusals["unmapped"]["refused"]
    assert "system account" in refusals["root"]["refused"]
    assert "service account" in refusals["service"]["refused"]
    cluster.user_auth = Cluster.UserAuth.USER_KEYS
    cluster.save()
    assert "does not use certificates" in _sign()["refused"]


def test_the_signer_decides_principal_validity_and_source_addresses(
    cluster: Cluster, settings: Any
) -> None:
    settings.SSH_CERTIFICATE_MINUTES = 3
    Cluster.objects.filter(pk=cluster.pk).update(certificate_source_addresses="192.0.2.0/24")
    before = int(time.time())
    certificate = serialization.load_ssh_public_identity(_sign()["certificate"].encode())
    assert isinstance(certificate, serialization.SSHCertificate)
    assert certificate.valid_principals == [b"gantry:signcluster:alice"]
    assert certificate.key_id == b"gantry:signcluster:alice:web"
    assert certificate.critical_options == {b"source-address": b"192.0.2.0/24"}
    assert before + 180 <= certificate.valid_before <= before + 182
    ca = serialization.load_ssh_public_key(cluster.user_ca_public_key.encode())
    raw = (serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert certificate.signature_key().public_bytes(*raw) == ca.public_bytes(*raw)


def test_with_the_web_role_the_ca_key_is_never_opened(
    cluster: Cluster, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nodes.access import signer_client
    from nodes.access.cluster import ssh_config_as, user_ca_key_path
    from slurm.certificates import signed_key

    ca_path = user_ca_key_path(cluster)
    settings.CA_KEY_ACCESS = "signer"
    calls: list[str] = []
    with watching_opens(ca_path) as watch:
        monkeypatch.setattr(signer_client, "signer_round_trip", in_process_round_trip(watch, calls))
        config = ssh_config_as(cluster, "alice")
        assert config.certificate is not None
        assert config.certificate.ca_key_path == "" and config.certificate.signer is not None
        signed = signed_key(config.certificate)
        # The file is still readable, to this process too: only the code path keeps away.
        assert ca_path.read_bytes()
    assert calls == ["nodes.user_certificate_sign"]
    assert str(ca_path) in watch.opened and len(watch.opened) == 1  # the read above
    certificate = signed.key.public_blob
    assert certificate is not None and b"gantry:signcluster:alice" in certificate.key_blob


def test_with_the_web_role_creating_the_ca_goes_through_the_signer(
    settings: Any, tmp_path: Path, operator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nodes.access import signer_client
    from nodes.access.cluster import user_ca_key_path
    from nodes.access.identities import cluster_user_ca_ensure

    settings.SSH_DIR = tmp_path / "ssh"
    settings.CA_KEY_ACCESS = "signer"
    cluster = ClusterFactory(name="webcluster", user_ca_public_key="")
    ca_path = user_ca_key_path(cluster)
    calls: list[str] = []
    with watching_opens(ca_path) as watch:
        monkeypatch.setattr(signer_client, "signer_round_trip", in_process_round_trip(watch, calls))
        public = cluster_user_ca_ensure(actor=operator, cluster=cluster)
        assert cluster_user_ca_ensure(actor=operator, cluster=cluster) == public
    assert watch.opened == [] and calls == ["nodes.user_ca_ensure"] * 2
    assert ca_path.exists() and public.startswith("ssh-ed25519 ")
    created = AuditEvent.objects.get(action=AuditAction.CLUSTER_USER_CA_CREATE)
    assert created.actor == operator and created.details == {"public_key": public, "new_key": True}


def test_no_signer_answering_is_a_passing_error_that_names_the_queue(
    cluster: Cluster, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery import current_app
    from celery.exceptions import TimeoutError as CeleryTimeoutError

    from nodes.access.cluster import ssh_config_as
    from slurm.certificates import signed_key
    from slurm.errors import SshConfigurationError, SshTransientError

    class Unanswered:
        def get(self, timeout: float) -> Any:
            raise CeleryTimeoutError()

        def forget(self) -> None:
            pass

    sent: list[tuple[str, dict[str, Any]]] = []

    def send_task(name: str, kwargs: dict[str, Any]) -> Unanswered:
        sent.append((name, kwargs))
        return Unanswered()

    settings.CA_KEY_ACCESS = "signer"
    monkeypatch.setattr(current_app, "send_task", send_task)
    spec = ssh_config_as(cluster, "alice").certificate
    assert spec is not None
    with pytest.raises(SshTransientError, match="'signer' queue"):
        signed_key(spec)
    [(name, arguments)] = sent
    assert name == "nodes.user_certificate_sign"
    assert set(arguments) == {"cluster", "account", "public_key", "purpose"}
    assert arguments["public_key"].startswith("ssh-ed25519 ")

    class Refusing(Unanswered):
        def get(self, timeout: float) -> Any:
            return {"refused": "'alice' is not mapped", "transient": False}

    monkeypatch.setattr(current_app, "send_task", lambda name, kwargs: Refusing())
    with pytest.raises(SshConfigurationError, match="signer refused: 'alice' is not mapped"):
        signed_key(spec)


def test_signer_tasks_have_their_queue_and_make_run_sets_the_web_role() -> None:
    from controlplane import tasknames
    from controlplane.celery import app

    for name in (tasknames.USER_CERTIFICATE_SIGN, tasknames.USER_CA_ENSURE):
        assert app.amqp.router.route({}, name, (), {})["queue"].name == "signer"
    assert "signer" in app.amqp.queues
    script = (ROOT / "scripts" / "run").read_text().replace("\\\n", " ")
    [web] = [line for line in script.splitlines() if "manage.py runserver" in line]
    assert "GANTRY_CA_KEY_ACCESS=signer" in web
    [worker] = [line for line in script.splitlines() if "-m celery" in line and " worker " in line]
    queues = re.search(r"(?:-Q|--queues)[= ](\S+)", worker)
    assert queues is None or "signer" in queues.group(1).split(","), worker


def test_an_unknown_ca_key_access_is_refused_at_start() -> None:
    started = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env={
            "PATH": "/usr/bin:/bin",
            "DJANGO_SETTINGS_MODULE": "controlplane.settings_test",
            "GANTRY_CA_KEY_ACCESS": "everyone",
        },
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode != 0 and "GANTRY_CA_KEY_ACCESS" in started.stderr
