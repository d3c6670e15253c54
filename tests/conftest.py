"""Shared fixtures. Personas: an operator, a researcher, another researcher, an outsider.

The operator and the researchers have an account on every cluster (``factories.
PERSONA_ACCOUNTS``: on the dev cluster, the Unix users carol, alice and bob), so their jobs
run as their own account there; the outsider and users made by hand have none."""

from __future__ import annotations

import os
import time
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


import lanes  # noqa: E402

# Fixtures through which a test reaches the database (pytest-django's, directly or below
# another fixture: ``fixturenames`` is the closure).
_DATABASE_FIXTURES = frozenset(
    {"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback"}
)


def _uses_the_database(item: Any) -> bool:
    return item.get_closest_marker("django_db") is not None or bool(
        _DATABASE_FIXTURES & set(getattr(item, "fixturenames", ()))
    )


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    lanes.check_declared(items)
    if os.environ.get("GANTRY_TEST_DATABASE_ONLY") == "1":
        # The PostgreSQL lane: a test that never reaches the database ran in the checks
        # lane already and would run the same here.
        kept = [item for item in items if _uses_the_database(item)]
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept
    if getattr(config.option, "numprocesses", None):
        lanes.longest_first(items)


@pytest.fixture(scope="session")
def _celery_logs(tmp_path_factory: Any) -> Path:
    return Path(tmp_path_factory.mktemp("celery"))


@pytest.fixture
def celery_stack(transactional_db: Any, _celery_logs: Path) -> Any:
    """A real Celery worker and beat against the test database and the test Redis: the
    process's shared pair (``celery_support.SharedStack``), their logs read from this
    test's start; at the end, the worker has finished what it was doing."""
    from django.db import connection

    from celery_support import SHARED, database_url_for

    stack = SHARED.ensure(
        database_url=database_url_for(connection.settings_dict), log_dir=_celery_logs
    )
    SHARED.mark_logs()
    yield stack
    SHARED.drain()


@pytest.fixture(scope="session")
def devcluster() -> Any:
    """The real dev cluster (Slurm + sshd on loopback), brought up once; never torn down."""
    from devcluster_support import ensure_up

    return ensure_up()


@pytest.fixture(autouse=True)
def _cluster_lane(request: Any) -> Any:
    """A test marked ``nodes`` holds its node slots while it runs; one marked ``exclusive``
    starts on a quiet cluster (tests/lanes.py). A test that does not ask for the shared
    Celery stack runs without it: no worker takes tasks it means to run by hand."""
    if "celery_stack" not in request.fixturenames:
        from celery_support import SHARED

        SHARED.stop()
    need = lanes.need_of(request.node)
    if need is None or not lanes.uses_cluster(request.node):
        yield None
        return
    cluster = request.getfixturevalue("devcluster")
    sizes, _default = _partition_sizes(cluster)
    named, any_of = lanes.wanted(need, sizes)
    asked = time.time()
    with lanes.NodeSlots(sizes).held(named, any_of=any_of) as given:
        if need.exclusive:
            cluster.wait_quiet()
        pinned = next(iter(named)) if len(named) == 1 and not need.exclusive else None
        started = time.time()
        try:
            with lanes.assigned(given or pinned):
                yield need
        finally:
            held = {**named, **({given: any_of} if given else {})}
            lanes.record(request.node.nodeid, held, asked=asked, started=started, ended=time.time())


@pytest.fixture
def lane_partition(_cluster_lane: Any) -> str:
    """The partition this test's jobs go to: the one its marker names, or the one the lane
    gave it (tests/lanes.py)."""
    return lanes.assigned_partition()


_SIZES: dict[str, Any] = {}


def _partition_sizes(cluster: Any) -> tuple[dict[str, int], str]:
    if "sizes" not in _SIZES:
        _SIZES["sizes"] = lanes.partition_sizes(cluster)
    return _SIZES["sizes"]


@pytest.fixture
def own_login_node(devcluster: Any) -> Any:
    """A login node of this test's own (``devcluster_support.LoginNode``): stopping it or
    putting shims in front of its commands disturbs no other test. A test that asks for it
    gets the dev cluster registered through it."""
    from devcluster_support import LoginNode

    login = LoginNode(devcluster).start()
    yield login
    login.close()


@pytest.fixture
def dev_cluster_registered(transactional_db: Any, devcluster: Any, request: Any) -> Any:
    """The dev cluster registered in Gantry and synced once, its sshd trusting the
    cluster's user CA, the personas mapped to their Unix accounts; through the test's own
    login node where it asks for one. At the end, every Slurm job of this test is cancelled
    and gone from the queue (it waits for its own jobs, never for an idle cluster)."""
    from nodes.registration import cluster_register
    from nodes.sync import cluster_sync
    from slurm.transport import close_all

    port = devcluster.port
    if "own_login_node" in request.fixturenames:
        port = request.getfixturevalue("own_login_node").port
    close_all()
    registration = cluster_register(
        actor=None,
        name="devcluster",
        ssh_host=devcluster.host,
        ssh_port=port,
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
    # The operator's drill budget for a test cluster: the drill suites start dozens of
    # drills of one researcher at once (the defaults allow 3; tests/drills checks them).
    from drills.models import DrillBudget

    DrillBudget.objects.update_or_create(
        cluster=registration.cluster,
        defaults={"max_active_drills": 200, "max_gpus": 1000, "max_gpu_hours_per_day": 100000},
    )
    yield registration.cluster
    _slurm_jobs_of_this_test_gone(devcluster)


def _slurm_jobs_of_this_test_gone(devcluster: Any, timeout: float = 120) -> None:
    """Stop the watcher looking at this test's clusters, let the worker finish its task,
    then cancel every Slurm job tagged with an object of this test's database and wait
    until none is left in the queue."""
    from datetime import timedelta

    from celery_support import SHARED, wait_until
    from devcluster_support import slurm_jobs_named
    from nodes.models import Cluster
    from slurm.commands import job_tag
    from watcher.cycle import KINDS

    later = timezone.now() + timedelta(days=1)
    Cluster.objects.update(next_reconcile_at=later, next_sync_at=later)
    for kind in KINDS:
        kind.model.objects.filter(state=kind.QUEUED).update(state=kind.CANCELLED)
    SHARED.drain()
    tags = {
        job_tag(uuid) for kind in KINDS for uuid in kind.model.objects.values_list("id", flat=True)
    }
    if not tags:
        return
    left = slurm_jobs_named(devcluster, tags)
    if left:
        devcluster.slurm(["scancel", *left], check=False)
        wait_until(
            lambda: not slurm_jobs_named(devcluster, tags),
            timeout=timeout,
            what=f"Slurm jobs {left} of this test to leave the queue",
        )


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
