"""Recovery on the dev cluster, with a real worker, beat and Redis: a rank of a two-node job
is killed (SIGKILL to the trainer process of one rank: a real crash, nothing the code under
test reads), the incident is opened from Slurm's final record, the newest checkpoint (not
proven yet) is drilled first, and the run resumes from it. The resumed run's losses equal
the original's bit for bit over the steps both logged."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
from drill_support import run_job
from recovery_support import rank_pids
from rest_framework.test import APIClient

from celery_support import wait_until
from devcluster_support import DevCluster
from drills.models import RestoreDrill
from jobs.models import Checkpoint, Job
from nodes.models import Cluster
from recovery.models import Incident

pytestmark = pytest.mark.django_db(transaction=True)


def _losses(job: Job, low: int, high: int) -> dict[int, float]:
    return dict(job.metric_points.filter(step__gt=low, step__lte=high).values_list("step", "loss"))


@pytest.mark.slow
@pytest.mark.nodes(2)
def test_a_killed_rank_is_recovered_from_a_proven_checkpoint_bit_exact(
    dev_cluster_registered: Any,
    celery_stack: Any,
    researcher_api: APIClient,
    devcluster: DevCluster,
    request: Any,
) -> None:
    # Drills prove only as the cluster's verifier (an account the owner cannot act as).
    verifier = devcluster.env.get("GANTRY_CLUSTER_VERIFIER")
    assert verifier, "this dev cluster has no verifier account: run scripts/devcluster up"
    Cluster.objects.filter(pk=dev_cluster_registered.pk).update(verifier_account=verifier)
    worker = celery_stack["worker"]
    # The same shape again (both nodes of the partition): the suspect srun names is not
    # left out, so the resumed run's losses can be compared bit for bit.
    job = run_job(researcher_api, steps=4000, every=40, name="recover-me", nodes=2)
    Job.objects.filter(pk=job.pk).update(recovery={"exclude_suspects": False})
    request.addfinalizer(lambda: _cancel_lineage(researcher_api, job))
    wait_until(
        lambda: (
            Checkpoint.objects.filter(job=job, step__gte=80).exists()
            and (Job.objects.get(id=job.id).last_step or 0) >= 100
        ),
        timeout=240,
        what=lambda: f"a checkpoint and steps past it; worker log:\n{worker.log()[-2000:]}",
    )
    job.refresh_from_db()
    run_dir = job.checkpoints.order_by("-step").first().path.rsplit("/checkpoints/", 1)[0]
    pids = rank_pids(run_dir)
    assert len(pids) >= 2, f"trainer ranks of {run_dir}: {pids}"
    os.kill(pids[-1], signal.SIGKILL)
    killed_at = time.monotonic()

    wait_until(
        lambda: (
            Incident.objects.filter(job=job, resumed_job__isnull=False).exists()
            or Incident.objects.filter(job=job, outcome__in=["held", "not_recovered"]).exists()
        ),
        timeout=300,
        what=lambda: f"the recovery; worker log:\n{worker.log()[-3000:]}",
    )
    incident = Incident.objects.get(job=job)
    job.refresh_from_db()
    assert job.state == "failed", (job.state, job.state_reason)
    assert incident.signal == Incident.Signal.CRASH, incident.detail
    assert incident.outcome == Incident.Outcome.RECOVERED, incident.reason
    checkpoint = incident.resumed_from
    assert checkpoint is not None and checkpoint.last_proven_at is not None
    # It was proven by the drill recovery started on it (no drill had run before).
    proof = RestoreDrill.objects.get(checkpoint=checkpoint)
    assert proof.trigger == "recovery" and proof.verdict == "passed", proof.reason
    assert proof.attestation == "verifier"
    # Lost work: at most the steps since the checkpoint resumed from.
    assert incident.lost_steps is not None
    assert incident.lost_steps <= (job.last_step or 0) - checkpoint.step
    resumed = incident.resumed_job
    assert resumed is not None and resumed.parent_id == job.id
    assert resumed.resume_from_id == checkpoint.pk
    detected_after = (incident.detected_at - incident.stopped_at).total_seconds()
    # Slurm's end time has whole seconds (and the exit record its own clock's): within one.
    assert detected_after >= -1.0 and time.monotonic() - killed_at < 300

    # The resumed run repeats the steps the original logged after the checkpoint, exactly.
    overlap_end = job.last_step or checkpoint.step
    wait_until(
        lambda: (Job.objects.get(id=resumed.id).last_step or 0) >= overlap_end,
        timeout=240,
        what=lambda: f"the resumed run to pass step {overlap_end}",
    )
    original = _losses(job, checkpoint.step, overlap_end)
    again = _losses(Job.objects.get(id=resumed.id), checkpoint.step, overlap_end)
    assert original and set(original) <= set(again)
    assert {step: again[step] for step in original} == original


def _cancel_lineage(api: APIClient, job: Job) -> None:
    """Leave nothing running on the shared dev cluster: the job and what resumed it."""
    for each in [job, *Job.objects.filter(parent=job)]:
        api.post(f"/api/v1/jobs/{each.id}/cancel/")
