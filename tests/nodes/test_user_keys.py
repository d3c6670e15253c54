"""Per-user keys (``user_keys`` mode): one key pair per (cluster, account) however many
makers race, the public key in the database always the pair of the private key on disk,
and a pair that does not match refused before any login, with the fix in words."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path
from typing import Any

import paramiko
import pytest
from django.db import connection

from factories import ClusterFactory, UserFactory
from nodes.models import Cluster, ClusterIdentity
from slurm import certificates
from slurm.errors import SshAuthenticationError, SshTransientError


@pytest.fixture
def keys_cluster(settings: Any, tmp_path: Path) -> Cluster:
    settings.SSH_DIR = tmp_path / "ssh"
    return ClusterFactory(
        name="keys", user_auth=Cluster.UserAuth.USER_KEYS, personas=False, host_key_line=""
    )


def _identity(cluster: Cluster, account: str = "alice") -> ClusterIdentity:
    return ClusterIdentity.objects.create(cluster=cluster, user=UserFactory(), account=account)


def _public_of(path: Path) -> str:
    return " ".join(certificates.public_line(path.read_bytes(), "").split()[:2])


def _stored(identity: ClusterIdentity) -> str:
    return " ".join(ClusterIdentity.objects.get(pk=identity.pk).public_key.split()[:2])


def _racing_generate(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Both makers generate before either stores (when both get that far): then the first
    to arrive stores its key last. Alone (the other waits its turn), no pause."""
    barrier = threading.Barrier(2, timeout=1)
    real = certificates.generate_key_pair
    made: list[str] = []

    def generate(comment: str) -> tuple[bytes, str]:
        pair = real(comment)
        made.append(pair[1])
        try:
            arrived = barrier.wait()
        except threading.BrokenBarrierError:
            return pair
        if arrived == 0:
            time.sleep(0.3)
        return pair

    monkeypatch.setattr("nodes.access.identities.generate_key_pair", generate)
    return made


@pytest.mark.django_db(transaction=True)
def test_two_makers_at_once_store_one_key_pair_whose_halves_match(
    keys_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nodes.access.cluster import user_key_path
    from nodes.access.identities import _ensure_user_key

    identity = _identity(keys_cluster)
    made = _racing_generate(monkeypatch)
    errors: list[BaseException] = []
    seen: list[str] = []

    def make() -> None:
        try:
            # Each maker read the row before either wrote: no public key yet.
            mine = ClusterIdentity.objects.get(pk=identity.pk)
            _ensure_user_key(keys_cluster, mine)
            seen.append(" ".join(mine.public_key.split()[:2]))
        except BaseException as error:
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=make) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    path = user_key_path(keys_cluster, "alice")
    on_disk = _public_of(path)
    assert _stored(identity) == on_disk and seen == [on_disk, on_disk]
    # One key was made and stored; nothing half-written is left beside it.
    assert len(made) == 1
    assert sorted(p.name for p in path.parent.iterdir()) == [".id_ed25519.lock", "id_ed25519"]


def _make_in_child(path: str, start: Any, answers: Any) -> None:
    from nodes.access.identities import user_key_pair_ensure

    start.wait(10)
    answers.put(user_key_pair_ensure(Path(path), "gantry:keys:bob"))


def test_worker_processes_racing_for_one_key_all_get_the_stored_ones_public_half(
    tmp_path: Path,
) -> None:
    context = multiprocessing.get_context("fork")
    path = tmp_path / "id_ed25519"
    start = context.Barrier(4)
    answers = context.Queue()
    children = [
        context.Process(target=_make_in_child, args=(str(path), start, answers)) for _ in range(4)
    ]
    for child in children:
        child.start()
    publics = {answers.get(timeout=30) for _ in children}
    for child in children:
        child.join(10)
    assert all(child.exitcode == 0 for child in children)
    assert publics == {f"{_public_of(path)} gantry:keys:bob"}


@pytest.mark.django_db
def test_an_existing_key_is_kept_and_an_unusable_one_replaced(keys_cluster: Cluster) -> None:
    from nodes.access.cluster import user_key_path
    from nodes.access.identities import _ensure_user_key

    identity = _identity(keys_cluster)
    _ensure_user_key(keys_cluster, identity)
    path = user_key_path(keys_cluster, "alice")
    first = _public_of(path)
    # Mapped again (the row's public key cleared): the key, maybe installed already, stays.
    ClusterIdentity.objects.filter(pk=identity.pk).update(public_key="")
    _ensure_user_key(keys_cluster, ClusterIdentity.objects.get(pk=identity.pk))
    assert _public_of(path) == first == _stored(identity)
    path.write_bytes(b"torn")
    _ensure_user_key(keys_cluster, ClusterIdentity.objects.get(pk=identity.pk))
    assert _public_of(path) != first and _stored(identity) == _public_of(path)
    assert [p.read_bytes() for p in path.parent.glob(".id_ed25519.unusable-*")] == [b"torn"]


@pytest.mark.django_db
def test_a_key_file_that_is_not_the_given_out_keys_pair_is_refused_before_login(
    keys_cluster: Cluster, operator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nodes.access.cluster import ssh_config_as, user_key_path
    from nodes.access.identities import cluster_identity_set
    from slurm.transport import SshTransport

    user = UserFactory()
    cluster_identity_set(actor=operator, cluster=keys_cluster, user=user, account="alice")
    path = user_key_path(keys_cluster, "alice")
    # Behind the database's back, another key lands in the file.
    private, _ = certificates.generate_key_pair("intruder")
    path.write_bytes(private)
    asked: list[str] = []

    def connect(self: Any, hostname: str, *args: Any, **kwargs: Any) -> None:
        asked.append(hostname)
        raise ConnectionRefusedError("stand-in: no server here")

    monkeypatch.setattr(paramiko.SSHClient, "connect", connect)
    with pytest.raises(SshAuthenticationError, match="not the pair") as raised:
        SshTransport(ssh_config_as(keys_cluster, "alice")).connect()
    assert asked == [] and "maps the account again" in str(raised.value)
    # The fix the message names: mapping the account again stores the held key's half.
    cluster_identity_set(actor=operator, cluster=keys_cluster, user=user, account="alice")
    assert _stored(ClusterIdentity.objects.get(cluster=keys_cluster, account="alice")) == (
        _public_of(path)
    )
    with pytest.raises(SshTransientError):
        SshTransport(ssh_config_as(keys_cluster, "alice")).connect()
    assert asked == [keys_cluster.ssh_host]
