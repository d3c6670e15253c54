"""Red team on a real sshd: how far Gantry's user CA reaches. A certificate Gantry signs for
alice names ``gantry:devcluster:alice`` and logs in as alice only (not bob, not root);
certificates the same CA might be made to sign (a stolen key, a buggy signer) for root, the
service account, another cluster's namespace or a bare account name are refused by the
login node's principals command; where root may log in by key, no Gantry certificate does;
``source-address`` is enforced; the web role streams output and cancels through a real
worker without opening the CA key; a CA rotation keeps logins working through the overlap
and drops the old CA after ``--finish``."""

from __future__ import annotations

import base64
import dataclasses
import io
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.serialization import SSHCertificateBuilder, SSHCertificateType
from rest_framework.test import APIClient
from signer_support import watching_opens

import lanes
from celery_support import wait_until
from devcluster_support import DevCluster
from jobs.models import Job
from nodes.models import Cluster

pytestmark = pytest.mark.django_db(transaction=True)
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "devcluster"


def _forged(ca_path: Path, principal: str) -> paramiko.PKey:
    """A key with a certificate for ``principal`` signed with the CA file directly, past
    every check of Gantry's: what a stolen CA key or a buggy signer could make."""
    ca = serialization.load_ssh_private_key(ca_path.read_bytes(), password=None)
    assert isinstance(ca, ed25519.Ed25519PrivateKey)
    key = ed25519.Ed25519PrivateKey.generate()
    now = int(time.time())
    certificate = (
        SSHCertificateBuilder()
        .public_key(key.public_key())
        .serial(1)
        .type(SSHCertificateType.USER)
        .key_id(b"red-team")
        .valid_principals([principal.encode()])
        .valid_after(now - 60)
        .valid_before(now + 300)
        .sign(ca)
    )
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    pkey = paramiko.Ed25519Key.from_private_key(io.StringIO(private))
    pkey.load_certificate(certificate.public_bytes().decode())
    return pkey


def _principals_of(key: paramiko.PKey) -> list[bytes]:
    blob = key.public_blob
    assert blob is not None
    line = f"{blob.key_type} {base64.b64encode(blob.key_blob).decode()}"
    certificate = serialization.load_ssh_public_identity(line.encode())
    assert isinstance(certificate, serialization.SSHCertificate)
    return certificate.valid_principals


@pytest.mark.nodes(0)
def test_a_certificate_gantry_signs_for_alice_logs_in_as_alice_only(
    dev_cluster_registered: Cluster, devcluster: DevCluster
) -> None:
    from nodes.access.cluster import ssh_config_as, user_ca_key_path
    from slurm.certificates import signed_key
    from slurm.connect import open_client
    from slurm.errors import SshAuthenticationError

    config = ssh_config_as(dev_cluster_registered, "alice")
    assert config.certificate is not None
    signed = signed_key(config.certificate)
    assert _principals_of(signed.key) == [b"gantry:devcluster:alice"]
    client, _seen = open_client(config, signed.key)
    try:
        assert client.exec_command("id -un")[1].read().decode().strip() == "alice"
    finally:
        client.close()
    for other in ("bob", "root", devcluster.user):
        with pytest.raises(SshAuthenticationError):
            open_client(dataclasses.replace(config, user=other), signed.key)

    # What the CA could be made to sign is refused too: the login node's principals
    # command names one Gantry principal per ordinary account, and none for these.
    ca = user_ca_key_path(dev_cluster_registered)
    for user, principal in (
        ("root", "gantry:devcluster:root"),
        (devcluster.user, f"gantry:devcluster:{devcluster.user}"),
        ("alice", "gantry:othercluster:alice"),
        # A bare account name: what certificates said before, and what sshd's default
        # (principal = user name) would take.
        ("alice", "alice"),
        ("root", "root"),
    ):
        with pytest.raises(SshAuthenticationError):
            open_client(dataclasses.replace(config, user=user), _forged(ca, principal))
    # The forging works: the same CA's certificate with the right principal gets in.
    client, _seen = open_client(config, _forged(ca, "gantry:devcluster:alice"))
    client.close()


@pytest.mark.nodes(0)
def test_source_address_is_enforced_by_sshd(
    dev_cluster_registered: Cluster, devcluster: DevCluster
) -> None:
    from nodes.access.cluster import transport_as
    from slurm.errors import SshAuthenticationError
    from slurm.transport import close_all

    close_all()
    log_start = len((devcluster.dir / "log" / "sshd.log").read_text(errors="replace"))
    Cluster.objects.filter(pk=dev_cluster_registered.pk).update(
        certificate_source_addresses="192.0.2.0/24"
    )
    elsewhere = Cluster.objects.get(pk=dev_cluster_registered.pk)
    with pytest.raises(SshAuthenticationError):
        transport_as(elsewhere, "alice").exec(["id", "-un"])
    log = (devcluster.dir / "log" / "sshd.log").read_text(errors="replace")[log_start:]
    assert "not from a permitted source address (127.0.0.1)" in log
    Cluster.objects.filter(pk=dev_cluster_registered.pk).update(
        certificate_source_addresses="127.0.0.0/8"
    )
    here = Cluster.objects.get(pk=dev_cluster_registered.pk)
    assert transport_as(here, "alice").exec(["id", "-un"]).stdout == "alice\n"
    close_all()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def root_login_sshd(tmp_path: Path) -> Iterator[Any]:
    """A second sshd of this test's own, on a free loopback port, where root may log in
    by key (``PermitRootLogin prohibit-password``, as on many login nodes): ``start(lines)``
    runs it with these extra sshd_config lines, trusting ``tmp_path/trusted``."""
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if os.geteuid() != 0 or not os.path.exists(sshd):
        pytest.skip("needs root and OpenSSH's sshd")
    host_key = tmp_path / "host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    running: list[subprocess.Popen[bytes]] = []

    def start(lines: list[str]) -> tuple[int, Path]:
        for process in running:
            process.terminate()
            process.wait(timeout=10)
        port = _free_port()
        config = tmp_path / f"sshd_config_{port}"
        config.write_text(
            "\n".join(
                [
                    f"Port {port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {host_key}",
                    f"PidFile {tmp_path}/sshd-{port}.pid",
                    "PermitRootLogin prohibit-password",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "AuthorizedKeysFile none",
                    f"TrustedUserCAKeys {tmp_path}/trusted",
                    *lines,
                ]
            )
            + "\n"
        )
        process = subprocess.Popen(
            [sshd, "-D", "-f", str(config), "-E", str(tmp_path / f"sshd-{port}.log")]
        )
        running.append(process)
        known = tmp_path / f"known_hosts_{port}"
        public = (tmp_path / "host_key.pub").read_text().split()[:2]
        known.write_text(f"[127.0.0.1]:{port} {' '.join(public)}\n")
        wait_until(lambda: _listening(port), timeout=10, what=f"sshd on {port}")
        return port, known

    yield start
    for process in running:
        process.terminate()
        process.wait(timeout=10)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _login(port: int, known: Path, user: str, key: paramiko.PKey) -> str | None:
    """``id -un`` after logging in as ``user``; None when sshd refuses."""
    client = paramiko.SSHClient()
    client.load_host_keys(str(known))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(
            "127.0.0.1",
            port=port,
            username=user,
            pkey=key,
            look_for_keys=False,
            allow_agent=False,
            timeout=10,
        )
        return client.exec_command("id -un")[1].read().decode().strip()
    except paramiko.AuthenticationException:
        return None
    finally:
        client.close()


@pytest.mark.nodes(0)
def test_where_root_may_log_in_by_key_no_gantry_certificate_does(
    dev_cluster_registered: Cluster, root_login_sshd: Any, tmp_path: Path, devcluster: DevCluster
) -> None:
    from nodes.access.cluster import user_ca_key_path
    from nodes.access.identities import sshd_config_lines

    ca = user_ca_key_path(dev_cluster_registered)
    (tmp_path / "trusted").write_text(dev_cluster_registered.user_ca_public_key + "\n")
    # The old setup (TrustedUserCAKeys alone): a certificate naming root logs in as root.
    port, known = root_login_sshd([])
    before = _login(port, known, "root", _forged(ca, "root"))
    shadow = subprocess.run(
        ["getent", "shadow", "root"], capture_output=True, text=True, check=False
    ).stdout.split(":")
    if len(shadow) > 1 and not shadow[1].startswith("!"):
        # Root's account is not locked here: the hole shows.
        assert before == "root"
    # The lines Gantry shows for the cluster (the trusted file's path aside).
    lines = sshd_config_lines(dev_cluster_registered)
    assert lines[0].startswith("TrustedUserCAKeys ")
    port, known = root_login_sshd(lines[1:])
    for principal in ("root", "gantry:devcluster:root", f"gantry:devcluster:{devcluster.user}"):
        assert _login(port, known, "root", _forged(ca, principal)) is None, principal
    assert (
        _login(port, known, devcluster.user, _forged(ca, f"gantry:devcluster:{devcluster.user}"))
        is None
    )
    # The same sshd lets alice in with Gantry's principal for her.
    assert _login(port, known, "alice", _forged(ca, "gantry:devcluster:alice")) == "alice"


@pytest.mark.nodes(1)
def test_the_web_role_streams_output_and_cancels_through_a_real_signer(
    dev_cluster_registered: Cluster,
    celery_stack: Any,
    researcher_api: APIClient,
    devcluster: DevCluster,
    settings: Any,
) -> None:
    from nodes.access.cluster import user_ca_key_path
    from slurm.transport import close_all

    response = researcher_api.post(
        "/api/v1/jobs/submit/",
        {
            "name": "streamed",
            "partition": lanes.assigned_partition(),
            "nodes": 1,
            "tasks_per_node": 1,
            "time_limit_minutes": 5,
            "config": {"preset": "tiny", "steps": 100000},
        },
        format="json",
    )
    assert response.status_code == 202, response.json()
    job_id = response.json()["id"]
    worker = celery_stack["worker"]

    def output_on_disk() -> bool:
        job = Job.objects.get(id=job_id)
        if job.state != "running":
            return False
        path = Path(devcluster.workdir, "users", "alice", "runs", job_id)
        return (path / f"slurm-{job.slurm_job_id}.out").stat().st_size > 0

    wait_until(output_on_disk, timeout=120, what=lambda: f"output; worker:\n{worker.log()[-3000:]}")
    # From here on this process is a web process: it may not read the CA key.
    settings.CA_KEY_ACCESS = "signer"
    close_all()
    with watching_opens(user_ca_key_path(dev_cluster_registered)) as watch:
        output = researcher_api.get(f"/api/v1/jobs/{job_id}/output/")
        assert output.status_code in (200, 206), output.content[:500]
        body = b"".join(output.streaming_content) if output.streaming else output.content
        assert b"gantry: job" in body
        # The tail and the cancel go through the worker (which signs for itself); this
        # process only records and reads the database.
        wait_until(
            lambda: (
                "gantry: job" in researcher_api.get(f"/api/v1/jobs/{job_id}/logs/").json()["text"]
            ),
            timeout=30,
            what="the log tail, read by the worker",
        )
        cancelled = researcher_api.post(f"/api/v1/jobs/{job_id}/cancel/")
        assert cancelled.status_code == 202, cancelled.json()
        assert cancelled.json()["request"] == "cancel requested"
    close_all()
    assert watch.opened == []
    wait_until(
        lambda: Job.objects.get(id=job_id).state == "cancelled", timeout=60, what="cancelled"
    )
    # The worker signed it, for the web's purpose, and sshd saw that key id.
    assert "signed a certificate for gantry:devcluster:alice (web" in worker.log()
    sshd_log = (devcluster.dir / "log" / "sshd.log").read_text(errors="replace")
    assert "ID gantry:devcluster:alice:web" in sshd_log


def _untrust(devcluster: DevCluster, line: str) -> None:
    """What the login node's admin does at the end of a rotation."""
    subprocess.run(
        [str(SCRIPT), "untrust-ca", str(devcluster.dir)],
        input=line + "\n",
        text=True,
        capture_output=True,
        check=True,
        timeout=60,
    )


@pytest.fixture
def own_ca_cluster(
    transactional_db: Any, settings: Any, tmp_path: Path, devcluster: DevCluster
) -> Iterator[tuple[Cluster, list[str]]]:
    """The dev cluster registered with a user CA of this test's own (keys under tmp_path),
    so a rotation touches no other test's CA; the dev sshd's trust in it is undone after."""
    from factories import map_personas
    from nodes.registration import cluster_register
    from slurm.transport import close_all

    settings.SSH_DIR = tmp_path / "ssh"
    close_all()
    cluster = cluster_register(
        actor=None,
        name="devcluster",
        ssh_host=devcluster.host,
        ssh_port=devcluster.port,
        ssh_user=devcluster.user,
        private_key=devcluster.key.read_text(),
        workdir=devcluster.workdir,
        python=devcluster.python,
        expected_fingerprint=devcluster.host_fingerprint,
        is_default=True,
        sync=False,
    ).cluster
    map_personas(cluster=cluster)
    trusted: list[str] = []
    yield cluster, trusted
    close_all()
    for line in trusted:
        _untrust(devcluster, line)


@pytest.mark.nodes(0)
def test_a_ca_rotation_keeps_logins_working_and_drops_the_old_ca(
    own_ca_cluster: Any, devcluster: DevCluster
) -> None:
    from django.core.management import call_command

    from nodes.access.cluster import ssh_config_as, transport_as, user_ca_key_path
    from slurm.connect import open_client
    from slurm.errors import SshAuthenticationError
    from slurm.transport import close_all

    cluster, trusted = own_ca_cluster
    old_line = cluster.user_ca_public_key
    devcluster.trust_user_ca(old_line)
    trusted.append(old_line)
    assert transport_as(cluster, "alice").exec(["id", "-un"]).stdout == "alice\n"
    old_ca_copy = user_ca_key_path(cluster).read_bytes()

    out = io.StringIO()
    call_command("gantry_ca_rotate", "--cluster", "devcluster", "--public-keys", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == old_line and len(lines) == 2
    # The login node's admin adds the new line; logins go on, with the old CA.
    devcluster.trust_user_ca(lines[1])
    trusted.append(lines[1])
    close_all()
    cluster.refresh_from_db()
    assert transport_as(cluster, "alice").exec(["id", "-un"]).stdout == "alice\n"

    call_command("gantry_ca_rotate", "--cluster", "devcluster", "--finish", stdout=io.StringIO())
    cluster.refresh_from_db()
    assert cluster.user_ca_public_key == lines[1]
    # Before the admin drops the old line, and after: Gantry's logins use the new CA.
    close_all()
    assert transport_as(cluster, "alice").exec(["id", "-un"]).stdout == "alice\n"
    _untrust(devcluster, old_line)
    close_all()
    assert transport_as(cluster, "alice").exec(["id", "-un"]).stdout == "alice\n"
    # A certificate of the old CA is refused now.
    stale = Path(str(user_ca_key_path(cluster)) + ".old-copy")
    stale.write_bytes(old_ca_copy)
    stale.chmod(0o600)
    config = ssh_config_as(cluster, "alice")
    with pytest.raises(SshAuthenticationError):
        open_client(config, _forged(stale, "gantry:devcluster:alice"))
    close_all()
