"""The web bench's database: seeded at fleet scale (or reused), in a steady state, with what
its clients need: session cookies for each tree's authentication backend, API tokens, the
running jobs with points and a running drill."""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _benchlib as lib

DB = "gantry_bench_web"
# A key of this run's own: the sessions signed in here and the servers under test share it.
SECRET_KEY = secrets.token_urlsafe(48)
RESEARCHERS = 50
DJANGO_BACKEND = "django.contrib.auth.backends.ModelBackend"


@dataclass
class Seeded:
    """The bench database as the clients see it."""

    # Per authentication backend (see ``_session_cookies``): one session per researcher.
    cookies: dict[str, list[str]]
    # Per authentication backend: the operator's session.
    operator_cookies: dict[str, str]
    token: str
    operator_token: str
    metric_jobs: list[str]
    drill: str
    counts: dict[str, int]


def seed_or_reuse(args: argparse.Namespace) -> Seeded:
    """The bench database and what the clients need: session cookies, tokens, job ids."""
    os.environ["SECRET_KEY"] = SECRET_KEY  # gunicorn uses the same key: sessions must verify
    lib.pg_create(DB, fresh=not args.reuse)
    lib.django_setup(lib.pg_url(DB))
    from django.contrib.auth.models import User
    from django.db import connection

    from jobs.models import Job, MetricPoint
    from nodes.models import Node

    if not (args.reuse and MetricPoint.objects.count() >= args.points):
        lib.seed(
            jobs=args.jobs,
            metric_jobs=args.points // 100_000,
            points_per_job=100_000,
            nodes=args.nodes,
            users=RESEARCHERS,
        )
    owner = User.objects.get(username="bench-user-0")
    operator = User.objects.get(username="bench-operator")
    metric_jobs = _running_metric_jobs()
    drill = _running_drill(metric_jobs[0])
    _vacuum_analyze()
    seeded = Seeded(
        cookies=_session_cookies(owner, RESEARCHERS),
        operator_cookies={
            backend: cookies[0] for backend, cookies in _session_cookies(operator, 1).items()
        },
        token=_key_for_both_trees(owner),
        operator_token=_key_for_both_trees(operator),
        metric_jobs=metric_jobs,
        drill=drill,
        counts={
            "jobs": Job.objects.count(),
            "points": MetricPoint.objects.count(),
            "nodes": Node.objects.count(),
        },
    )
    connection.close()
    return seeded


def _key_for_both_trees(user: Any) -> str:
    """One API key both trees accept as ``Token <key>``: the baseline reads DRF's authtoken
    table (left in place, empty, by migration core 0004), this tree a legacy Gantry token
    of the same key (what that migration makes of a DRF key)."""
    from django.db import connection

    from core.models import ApiToken

    key = secrets.token_hex(20)
    ApiToken.objects.create(
        user=user,
        name="web bench",
        prefix=key[: ApiToken.LEGACY_SHOWN_PREFIX_LENGTH],
        key_hash=ApiToken.hash_secret(key),
        legacy=True,
    )
    with connection.cursor() as cursor:
        # DRF's table as its migrations make it (a database made by this tree lacks it).
        cursor.execute(
            "CREATE TABLE IF NOT EXISTS authtoken_token (key varchar(40) PRIMARY KEY, "
            "created timestamp with time zone NOT NULL, "
            "user_id integer NOT NULL UNIQUE REFERENCES auth_user (id))"
        )
        cursor.execute("DELETE FROM authtoken_token WHERE user_id = %s", [user.pk])
        cursor.execute(
            "INSERT INTO authtoken_token (key, user_id, created) VALUES (%s, %s, now())",
            [key, user.pk],
        )
    return key


def _running_metric_jobs() -> list[str]:
    """The jobs with points, running, with the sums ingest keeps filled in."""
    from jobs.ingest import point_totals_refresh
    from jobs.models import Job, MetricPoint

    metric_jobs = [
        str(j)
        for j in MetricPoint.objects.values_list("job_id", flat=True).distinct().order_by("job_id")
    ]
    Job.objects.filter(id__in=metric_jobs).update(state="running", files_final=False)
    # The seed stores points straight into the table; ingest keeps each job's sums as it
    # stores them (``jobs.ingest``): fill them as ingest would have.
    point_totals_refresh(job_ids=metric_jobs)
    return metric_jobs


def _running_drill(job_id: str) -> str:
    """A checkpoint of the first metric job with a restore drill running on it (the drill
    page polls its status while it runs)."""
    from datetime import timedelta

    from django.utils import timezone

    from drills.models import RestoreDrill
    from jobs.models import Checkpoint, Job

    job = Job.objects.get(id=job_id)
    checkpoint, _ = Checkpoint.objects.get_or_create(
        job=job, step=1000, defaults={"path": f"/runs/{job_id}/checkpoints/step-001000"}
    )
    drill, _ = RestoreDrill.objects.get_or_create(
        checkpoint=checkpoint,
        defaults={
            "cluster": job.cluster,
            "state": RestoreDrill.State.RUNNING,
            "slurm_job_id": "900001",
            "started_at": timezone.now() - timedelta(minutes=2),
        },
    )
    return str(drill.id)


def _vacuum_analyze() -> None:
    """A steady state, as autovacuum leaves a production database: no dead rows from the
    seed's updates, the visibility map set (index-only scans), statistics fresh."""
    from django.db import connection

    connection.close()
    psql = ["psql", "-h", lib.PG_HOST, "-p", lib.PG_PORT, "-U", lib.PG_USER]
    subprocess.run([*psql, "-qc", "VACUUM ANALYZE", DB], check=True)


def _session_cookies(user: Any, count: int) -> dict[str, list[str]]:
    """``count`` session cookies of ``user`` per authentication backend. A session names the
    backend that signed it in, and a tree accepts only its own (this one's loads the user
    with their roles; the baseline's is Django's)."""
    from django.conf import settings
    from django.test import Client

    cookies: dict[str, list[str]] = {}
    for backend in (settings.AUTHENTICATION_BACKENDS[0], DJANGO_BACKEND):
        cookies[backend] = []
        for _ in range(count):
            client = Client()
            client.force_login(user, backend=backend)
            value = client.cookies[settings.SESSION_COOKIE_NAME].value
            cookies[backend].append(f"{settings.SESSION_COOKIE_NAME}={value}")
    return cookies


def tree_backend(tree: Path, seeded: Seeded) -> str:
    """The authentication backend whose sessions ``tree`` accepts."""
    settings_py = (tree / "controlplane" / "settings.py").read_text()
    for backend in seeded.cookies:
        if backend != DJANGO_BACKEND and f'"{backend}"' in settings_py:
            return backend
    return DJANGO_BACKEND
