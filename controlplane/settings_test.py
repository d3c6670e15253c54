"""Test settings: only overrides. The database comes from DATABASE_URL when set
(the test command runs the suite against SQLite and PostgreSQL)."""

from __future__ import annotations

import os

os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("SECRET_KEY", "test-secret-key-not-for-production")
os.environ.setdefault("ALLOWED_HOSTS", "testserver,127.0.0.1,localhost")
os.environ.setdefault("GANTRY_TLS", "false")
# A Redis database of its own, so tests never see the development server's queues.
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/13")
os.environ.setdefault(
    "GANTRY_DATA_DIR",
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "var", "test-data"),
)
# A pytest-xdist worker (and every process it starts, which inherit its environment) gets a
# run of its own: broker key prefix and data directory (keys, the cluster's user CA), as its
# test database is its own. GANTRY_TEST_RUN_WORKER says which worker set them, so a process
# a worker starts keeps its worker's and a new worker never inherits the controller's.
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _XDIST_WORKER and os.environ.get("GANTRY_TEST_RUN_WORKER") != _XDIST_WORKER:
    os.environ["GANTRY_TEST_RUN_WORKER"] = _XDIST_WORKER
    os.environ["GANTRY_TEST_RUN_ID"] = f"run{os.getpid()}"
    os.environ["GANTRY_DATA_DIR"] = os.path.join(
        os.environ["GANTRY_DATA_DIR"], f"xdist-{_XDIST_WORKER}"
    )

from controlplane.settings import *  # noqa: E402, F403
from controlplane.settings import DATA_DIR  # noqa: E402

if "DATABASE_URL" not in os.environ:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(DATA_DIR / "test.sqlite3"),
            # One file per test run: two runs in one checkout never share (or delete) it.
            "TEST": {"NAME": str(DATA_DIR / f"test-db-{os.getpid()}.sqlite3")},
            # The same options as a sqlite DATABASE_URL gets: the worker under test opens
            # this file through one, and both must agree on WAL.
            "OPTIONS": {
                "timeout": 20,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
LOGGING = {"version": 1, "disable_existing_loggers": False}
STATIC_ROOT = DATA_DIR / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)

# Each test run gets its own broker key prefix: the pytest process sets GANTRY_TEST_RUN_ID
# and the workers it starts inherit it, so two runs on one machine never share queues.
TEST_RUN_ID = os.environ.setdefault("GANTRY_TEST_RUN_ID", f"run{os.getpid()}")
CELERY_BROKER_TRANSPORT_OPTIONS = {
    **CELERY_BROKER_TRANSPORT_OPTIONS,  # noqa: F405
    "global_keyprefix": f"gantry-test-{TEST_RUN_ID}:",
}

# Tests look at the overview right after changing the fleet: no snapshot reuse (the
# snapshot's own tests turn it on).
OVERVIEW_SNAPSHOT_SECONDS = 0

# Login throttling counts in a per-process cache in tests: no shared state between runs.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    # The same store as "default" (the same LOCATION): a test that empties the default
    # cache empties what pages computed too.
    "computed": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": ""},
    "ratelimit": {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
        "LOCATION": f"ratelimit-{os.getpid()}",
    },
    "worker_stats": {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
        "LOCATION": f"worker-stats-{os.getpid()}",
        "TIMEOUT": None,
    },
}
