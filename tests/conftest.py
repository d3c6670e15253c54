"""Shared fixtures. Personas: an operator, a researcher, another researcher, an outsider.

The operator and the researchers have an account on every cluster (``factories.
PERSONA_ACCOUNTS``: on the dev cluster, the Unix users carol, alice and bob), so their jobs
run as their own account there; the outsider and users made by hand have none."""

from __future__ import annotations

import types
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from factories import UserFactory, map_personas


def pytest_configure(config: Any) -> None:
    """Remove a SQLite test database a previous run left behind, WAL files included:
    a fresh database file next to an old WAL file reads as a disk I/O error."""
    from django.conf import settings

    name = settings.DATABASES["default"].get("TEST", {}).get("NAME")
    if name and settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        for suffix in ("", "-wal", "-shm", "-journal"):
            path = Path(f"{name}{suffix}")
            if path.exists():
                path.unlink()


def _persona(**values: Any) -> Any:
    user = UserFactory(**values)
    map_personas(user=user)
    return user


@pytest.fixture
def operator(db: Any) -> Any:
    return _persona(username="olivia-operator", role="operators", is_staff=True)


@pytest.fixture
def researcher(db: Any) -> Any:
    return _persona(username="rita-researcher", role="researchers")


@pytest.fixture
def other_researcher(db: Any) -> Any:
    return _persona(username="rob-researcher", role="researchers")


@pytest.fixture
def outsider(db: Any) -> Any:
    """Signed in, but in no role."""
    return UserFactory(username="otto-outsider")


def _client_for(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user=user)
    return client


@pytest.fixture
def operator_api(operator: Any) -> APIClient:
    return _client_for(operator)


@pytest.fixture
def researcher_api(researcher: Any) -> APIClient:
    return _client_for(researcher)


@pytest.fixture
def outsider_api(outsider: Any) -> APIClient:
    return _client_for(outsider)


@pytest.fixture
def anonymous_api() -> APIClient:
    return APIClient()


from celery_support import STACK_ENV  # noqa: E402


@pytest.fixture
def celery_stack(transactional_db: Any, tmp_path: Any, request: Any) -> Any:
    """A real Celery worker and beat against the test database and the test Redis."""
    from django.db import connection

    from celery_support import database_url_for, flush_test_broker, start_beat, start_worker

    flush_test_broker()
    url = database_url_for(connection.settings_dict)
    worker = start_worker(database_url=url, log_path=tmp_path / "worker.log", extra_env=STACK_ENV)
    request.addfinalizer(worker.stop)
    beat = start_beat(database_url=url, log_path=tmp_path / "beat.log", extra_env=STACK_ENV)
    request.addfinalizer(beat.stop)
    return {"worker": worker, "beat": beat}


@pytest.fixture(scope="session")
def devcluster() -> Any:
    """The real dev cluster (Slurm + sshd on loopback), brought up once; never torn down."""
    from devcluster_support import ensure_up

    return ensure_up()


@pytest.fixture
def dev_cluster_registered(transactional_db: Any) -> Any:
    """The dev cluster (brought up if needed) registered in Gantry and synced once, its
    sshd trusting the cluster's user CA, the personas mapped to their Unix accounts."""
    from devcluster_support import ensure_up
    from nodes.registration import cluster_register
    from nodes.slurm.transport import close_all
    from nodes.sync import cluster_sync

    devcluster = ensure_up()
    devcluster.wait_quiet()
    close_all()
    registration = cluster_register(
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
    )
    assert cluster_sync(cluster_id=registration.cluster.pk).ok
    devcluster.trust_user_ca(registration.cluster.user_ca_public_key)
    map_personas(cluster=registration.cluster)
    return registration.cluster


@pytest.fixture
def still_clock(monkeypatch: pytest.MonkeyPatch) -> datetime:
    """The clock held still (``timezone.now`` and the minute conditional responses turn
    over on) for tests that revalidate a page: what pages show moves with the clock (work at
    risk in GPU-hours grows by 0.01 every few seconds, relative times turn over each minute),
    and a revalidation that straddles such a change is rightly answered 200, not 304."""
    import core.conditional

    frozen = timezone.now()
    monkeypatch.setattr(timezone, "now", lambda: frozen)
    monkeypatch.setattr(core.conditional, "time", types.SimpleNamespace(time=frozen.timestamp))
    return frozen
