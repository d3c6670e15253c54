"""Nothing in a researcher's home runs when their job starts, on the dev cluster: a
``usercustomize.py`` in the researcher's user site-packages (which every plain Python the
account starts imports) writes ``id -un`` to a canary file; a job submitted through Gantry
as that researcher must start its ranks without running it.

The dev cluster's own Python is a virtual environment that never reads a user site, so
this job runs on the cluster's system Python, which does, as a site Python on a real
cluster would. That Python has no torch: the trainer starts and stops at ``import torch``,
which is as far as this test needs it to get (it proves Python started the trainer)."""

from __future__ import annotations

import os
import pwd
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from celery_support import wait_until
from devcluster_support import DevCluster
from jobs.models import Job
from nodes.models import Cluster

pytestmark = pytest.mark.django_db(transaction=True)

SYSTEM_PYTHON = "/usr/bin/python3"
# The researcher persona's account on the dev cluster.
ACCOUNT = "alice"

USERCUSTOMIZE = """\
import os, subprocess
# Only for this test's job (the marker): other work of the account is left alone.
if os.environ.get("GANTRY_USER_CANARY") == {token!r}:
    with open({canary!r}, "w") as out:
        out.write(subprocess.run(["id", "-un"], capture_output=True, text=True).stdout)
"""


def _plant(devcluster: DevCluster, token: str, canary: Path) -> tuple[Path, Path | None]:
    """The account's usercustomize; returns it and the topmost directory made for it
    (None: its directory was there already)."""
    found = devcluster.run_as(
        ACCOUNT, [SYSTEM_PYTHON, "-c", "import site; print(site.getusersitepackages())"]
    )
    site_dir = Path(found.stdout.strip())
    made: Path | None = None
    if not site_dir.exists():
        made = site_dir
        while not made.parent.exists():
            made = made.parent
        devcluster.run_as(ACCOUNT, ["mkdir", "-p", str(site_dir)])
    hook = site_dir / "usercustomize.py"
    assert not hook.exists(), f"{hook} is someone else's"
    hook.write_text(USERCUSTOMIZE.format(token=token, canary=str(canary)))
    account = pwd.getpwnam(ACCOUNT)
    os.chown(hook, account.pw_uid, account.pw_gid)
    return hook, made


def _remove(hook: Path, made: Path | None) -> None:
    """Take out what this test put in the account's home, and only that."""
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
        return
    hook.unlink(missing_ok=True)
    for compiled in (hook.parent / "__pycache__").glob("usercustomize.*"):
        compiled.unlink(missing_ok=True)


@pytest.mark.exclusive
def test_a_usercustomize_in_the_researchers_home_never_runs_when_the_job_starts(
    dev_cluster_registered: Cluster,
    celery_stack: Any,
    researcher_api: APIClient,
    devcluster: DevCluster,
) -> None:
    token = uuid.uuid4().hex
    canary = Path(f"/tmp/gantry-usercustomize-{token}")
    hook, made = _plant(devcluster, token, canary)
    try:
        # The hook is live: any plain Python the account starts runs it.
        devcluster.run_as(
            ACCOUNT, ["env", f"GANTRY_USER_CANARY={token}", SYSTEM_PYTHON, "-c", "pass"]
        )
        assert canary.read_text().strip() == ACCOUNT
        canary.unlink()

        Cluster.objects.filter(pk=dev_cluster_registered.pk).update(python=SYSTEM_PYTHON)
        body = {
            "name": "usercustomize-canary",
            "partition": "batch",
            "nodes": 1,
            "gpus_per_node": 1,
            "tasks_per_node": 1,
            "time_limit_minutes": 5,
            "config": {"preset": "tiny", "steps": 4},
            "environment": {"GANTRY_USER_CANARY": token},
        }
        response = researcher_api.post("/api/v1/jobs/submit/", body, format="json")
        assert response.status_code == 202, response.json()
        job_id = response.json()["id"]
        worker = celery_stack["worker"]
        wait_until(
            lambda: Job.objects.get(id=job_id).files_final,
            timeout=180,
            what=lambda: f"the job to end; worker log:\n{worker.log()[-3000:]}",
        )
        job = Job.objects.get(id=job_id)
        assert job.run_as == ACCOUNT and job.slurm_job_id, (job.state, job.state_reason)
        # Read by a worker as the job's account (the web request reads nothing): polled.
        log = wait_until(
            lambda: researcher_api.get(f"/api/v1/jobs/{job_id}/logs/").json()["text"],
            timeout=30,
            what="the log tail, read by the worker",
        )
        # Python did start the trainer (and stopped where this Python lacks torch) ...
        assert "No module named 'torch'" in log, log[-2000:]
        # ... without running the account's hook first.
        assert not canary.exists(), f"usercustomize ran as {canary.read_text().strip()!r}"
    finally:
        canary.unlink(missing_ok=True)
        _remove(hook, made)
