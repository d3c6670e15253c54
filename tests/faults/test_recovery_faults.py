"""Recovery under real faults on the dev cluster (real Slurm, sshd, worker, beat, Redis):
a rank stopped with SIGSTOP (a hang), a rank killed (a crash), the trainer's NaN fault, one node made slow by a CPU
quota on its processes (a cgroup: nothing the code under test reads), the newest checkpoint
damaged with every hash valid, a node that kills every attempt with exclusion off, and
Gantry's own view failing (sacct down, squeue timing out, sshd gone) while a healthy job
runs. Each test records a row in the fault table (``make faults`` prints it)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db.models import Count
from drill_damage import _scale_weights, rewrite_rank
from recovery_support import (
    append_trial,
    cancel_lineage,
    cpu_quota,
    losses,
    node_of,
    rank_of,
    rank_pids,
    resume,
    run_dir_of,
    submit,
    trial_record,
)
from rest_framework.test import APIClient

from celery_support import wait_until
from devcluster_support import DevCluster, LoginNode
from drills.models import RestoreDrill
from fault_support import SACCT_DOWN, FaultReport
from jobs.models import Checkpoint, Job
from nodes.models import Cluster
from recovery.models import Incident, RecoveryPolicy

pytestmark = pytest.mark.django_db(transaction=True)

# Trials of each fault (``make faults`` and bench/recovery_bench.py run more; each trial
# appends its figures to test-artifacts/recovery-trials.jsonl).
TRIALS = int(os.environ.get("GANTRY_RECOVERY_TRIALS", "1"))
# Healthy jobs that run while Gantry's view of the cluster fails.
HEALTHY_JOBS = int(os.environ.get("GANTRY_RECOVERY_HEALTHY_JOBS", "2"))
trials = pytest.mark.parametrize("trial", range(TRIALS))
# The longest of these run in ``make faults`` only (scripts/faults sets GANTRY_FAULTS_FULL);
# ``make test`` runs the others, and tests/recovery covers the logic of all of them.
full_only = pytest.mark.skipif(
    os.environ.get("GANTRY_FAULTS_FULL") != "1",
    reason="make faults runs it (GANTRY_FAULTS_FULL=1); tests/recovery covers its logic",
)


@pytest.fixture
def recovering_cluster(dev_cluster_registered: Cluster, devcluster: DevCluster) -> Cluster:
    """The dev cluster with its verifier (drills prove) and a policy with the shortest hang
    floor the form allows, suspects left out."""
    verifier = devcluster.env.get("GANTRY_CLUSTER_VERIFIER")
    assert verifier, "this dev cluster has no verifier account: run scripts/devcluster up"
    Cluster.objects.filter(pk=dev_cluster_registered.pk).update(verifier_account=verifier)
    RecoveryPolicy.objects.update_or_create(
        cluster=dev_cluster_registered,
        defaults={"hang_floor_seconds": 30, "exclude_suspects": True, "max_attempts": 3},
    )
    dev_cluster_registered.refresh_from_db()
    return dev_cluster_registered


def _running_past(job: Job, step: int, *, timeout: float = 240) -> None:
    wait_until(
        lambda: (
            Checkpoint.objects.filter(job=job, step__gte=step).exists()
            and (Job.objects.get(id=job.id).last_step or 0) >= step + 20
        ),
        timeout=timeout,
        what=lambda: f"job {job.name} to save a checkpoint at step {step} and go on",
    )


def _settled(job: Job, worker: Any, timeout: float = 360) -> Incident:
    """The job's incident once it resumed or stopped (held, not recovered)."""
    wait_until(
        lambda: (
            Incident.objects.filter(job=job)
            .exclude(outcome__in=list(Incident.ACTIVE_OUTCOMES))
            .exists()
        ),
        timeout=timeout,
        what=lambda: f"the incident of {job.name}; worker log:\n{worker.log()[-3000:]}",
    )
    return Incident.objects.get(job=job)


def _resumed_runs_past(incident: Incident, step: int, timeout: float = 240) -> Job:
    resumed = incident.resumed_job
    assert resumed is not None, incident.reason
    wait_until(
        lambda: (Job.objects.get(id=resumed.id).last_step or 0) >= step,
        timeout=timeout,
        what=lambda: f"the resumed run to pass step {step}",
    )
    return Job.objects.get(id=resumed.id)


def _two_ranks_past_80(api: APIClient, request: Any, name: str) -> tuple[Job, int, str]:
    """A one-node job of two ranks running past its checkpoint of step 80 (the dev
    cluster's partitions have two nodes each: the resume can leave the suspect node out
    only for a one-node job); returns it with its last rank's pid and that rank's node."""
    job = submit(api, name=name, nodes=1, steps=6000, every=40, tasks_per_node=2, gpus_per_node=2)
    request.addfinalizer(lambda: cancel_lineage(api, job))
    _running_past(job, 80)
    pids = rank_pids(run_dir_of(job))
    assert len(pids) == 2, pids
    last = max(pids, key=rank_of)
    return job, last, node_of(last)


def _recovered_without(incident: Incident, job: Job, node: str, signal_kind: str) -> Job:
    """The incident named ``node`` alone and recovered from a proven checkpoint onto
    other nodes; returns the resumed job once it runs past the failed one."""
    assert incident.signal == signal_kind, incident.detail
    assert incident.outcome == Incident.Outcome.RECOVERED, incident.reason
    assert incident.suspect_nodes == [node], (incident.suspect_nodes, incident.detail)
    assert node in (incident.excluded_nodes or [])
    resumed = _resumed_runs_past(incident, (job.last_step or 0) + 20)
    assert node not in (resumed.allocated_nodes or ""), resumed.allocated_nodes
    assert resumed.resume_from is not None and resumed.resume_from.last_proven_at is not None
    return resumed


def _record(report: FaultReport, fault: str, ok: bool, notes: str) -> None:
    row = report.row(fault)
    row.trials, row.faults_injected, row.wrong = 1, 1, 0 if ok else 1
    row.notes = notes


@pytest.mark.slow
@pytest.mark.nodes(2)
@trials
def test_a_stopped_rank_is_a_hang_named_and_left_out(
    trial: int,
    recovering_cluster: Cluster,
    celery_stack: Any,
    researcher_api: APIClient,
    fault_report: FaultReport,
    request: Any,
) -> None:
    job, stopped, node = _two_ranks_past_80(researcher_api, request, "hang-sigstop")
    os.kill(stopped, signal.SIGSTOP)
    request.addfinalizer(lambda: resume([stopped]))
    started = time.monotonic()

    incident = _settled(job, celery_stack["worker"])
    detected = time.monotonic() - started
    # The stopped rank's heartbeat went stale while its peer's kept being rewritten.
    _recovered_without(incident, job, node, Incident.Signal.HANG)
    budget = float(incident.evidence["budget_s"])
    trial_record("hang (SIGSTOP)", incident, expected=[node])
    _record(
        fault_report,
        "recovery: rank stopped (SIGSTOP, hang)",
        True,
        f"detected in {detected:.0f} s (budget {budget:.0f} s), suspect {node}",
    )


@pytest.mark.nodes(2)
@full_only
@trials
def test_a_killed_rank_is_a_crash_named_and_left_out(
    trial: int,
    recovering_cluster: Cluster,
    celery_stack: Any,
    researcher_api: APIClient,
    fault_report: FaultReport,
    request: Any,
) -> None:
    # SIGKILL to one rank's trainer process: srun reports the task's node, Slurm ends the
    # job failed, and the resume (one node, so the other node of the partition) leaves it out.
    job, killed, node = _two_ranks_past_80(researcher_api, request, "crash-sigkill")
    os.kill(killed, signal.SIGKILL)

    incident = _settled(job, celery_stack["worker"])
    job.refresh_from_db()
    _recovered_without(incident, job, node, Incident.Signal.CRASH)
    checkpoint = incident.resumed_from
    assert checkpoint is not None
    trial_record(
        "crash (rank SIGKILL)",
        incident,
        expected=[node],
        steps_since_checkpoint=(job.last_step or 0) - checkpoint.step,
    )
    _record(
        fault_report,
        "recovery: rank killed (SIGKILL, crash)",
        True,
        f"suspect {node}, resumed from step {checkpoint.step}",
    )


@pytest.mark.slow
@pytest.mark.nodes(1)
@trials
def test_nan_weights_resume_below_the_divergence(
    trial: int,
    recovering_cluster: Cluster,
    celery_stack: Any,
    researcher_api: APIClient,
    fault_report: FaultReport,
    request: Any,
) -> None:
    job = submit(
        researcher_api,
        name="nan-weights",
        nodes=1,
        steps=4000,
        every=40,
        environment={"TRAINER_FAULT": "nan_weights@120"},
    )
    request.addfinalizer(lambda: cancel_lineage(researcher_api, job))
    incident = _settled(job, celery_stack["worker"], timeout=420)
    job.refresh_from_db()
    assert incident.signal == Incident.Signal.NONFINITE_LOSS, incident.detail
    assert incident.outcome == Incident.Outcome.RECOVERED, incident.reason
    assert job.nonfinite_loss_step is not None and job.nonfinite_loss_step > 120
    checkpoint = incident.resumed_from
    # The checkpoint of step 120 holds the NaN (saved after the poisoned update): below it.
    assert checkpoint is not None and checkpoint.step < 120, checkpoint
    resumed = _resumed_runs_past(incident, job.nonfinite_loss_step + 40)
    again = losses(resumed, checkpoint.step, job.nonfinite_loss_step + 40)
    assert again and all(value == value for value in again.values()), again  # no NaN
    # Before the fault, the resumed run repeats the original's losses bit for bit.
    before = losses(job, checkpoint.step, 120)
    assert before and {step: again[step] for step in before} == before
    trial_record(
        "NaN weights", incident, steps_since_checkpoint=(job.last_step or 0) - checkpoint.step
    )
    _record(
        fault_report,
        "recovery: NaN weights (trainer fault)",
        True,
        f"NaN at step {job.nonfinite_loss_step}, resumed from step {checkpoint.step}",
    )


@pytest.mark.exclusive
@full_only
@trials
def test_a_slow_node_is_named_and_left_out(
    trial: int,
    recovering_cluster: Cluster,
    celery_stack: Any,
    researcher_api: APIClient,
    fault_report: FaultReport,
    request: Any,
) -> None:
    job = submit(
        researcher_api,
        name="slow-node",
        nodes=1,
        steps=20000,
        every=100,
        tasks_per_node=2,
        gpus_per_node=2,
    )
    request.addfinalizer(lambda: cancel_lineage(researcher_api, job))
    _running_past(job, 100)
    pids = rank_pids(f"/{job.id}")
    slow = max(pids, key=rank_of)
    node = node_of(slow)
    with cpu_quota(15, "slow-rank") as slow_down:
        slow_down(slow)
        incident = _settled(job, celery_stack["worker"], timeout=300)
    assert incident.signal == Incident.Signal.STRAGGLER, incident.detail
    assert incident.suspect_nodes == [node], (incident.suspect_nodes, incident.detail)
    assert incident.outcome == Incident.Outcome.RECOVERED, incident.reason
    assert node in (incident.excluded_nodes or [])
    trial_record("slow rank (cgroup CPU quota)", incident, expected=[node])
    _record(fault_report, "recovery: slow node (cgroup CPU quota 15%)", True, f"named {node}")


@pytest.mark.nodes(2)
@full_only
@trials
def test_a_damaged_newest_checkpoint_is_drilled_and_skipped(
    trial: int,
    recovering_cluster: Cluster,
    celery_stack: Any,
    researcher_api: APIClient,
    fault_report: FaultReport,
    request: Any,
) -> None:
    job = submit(researcher_api, name="damaged-newest", nodes=1, steps=6000, every=40)
    request.addfinalizer(lambda: cancel_lineage(researcher_api, job))
    _running_past(job, 80)
    proven = Checkpoint.objects.get(job=job, step=80)
    response = researcher_api.post(f"/api/v1/checkpoints/{proven.pk}/drills/", {}, format="json")
    assert response.status_code == 202, response.json()
    wait_until(
        lambda: Checkpoint.objects.get(pk=proven.pk).last_proven_at is not None,
        timeout=240,
        what=lambda: "the drill of step 80 to prove it",
    )
    _running_past(job, 160)
    pids = rank_pids(run_dir_of(job))
    assert len(pids) == 1, pids
    # Freeze the run, let the watcher register what it wrote, damage the newest checkpoint
    # (every hash rewritten to match), then kill the rank: a crash.
    os.kill(pids[0], signal.SIGSTOP)
    request.addfinalizer(lambda: resume(pids))
    time.sleep(6)
    newest = Checkpoint.objects.filter(job=job).order_by("-step").first()
    assert newest is not None and newest.step > 80
    damaged = Path(newest.path)
    owner = damaged.stat()
    rewrite_rank(damaged, 0, _scale_weights)
    # As the owner would leave it (the test runs as root): the researcher's own files.
    for path in [damaged, *damaged.rglob("*")]:
        os.chown(path, owner.st_uid, owner.st_gid)
    os.kill(pids[0], signal.SIGKILL)

    incident = _settled(job, celery_stack["worker"], timeout=420)
    drills = list(
        RestoreDrill.objects.filter(checkpoint__job=job).values_list(
            "checkpoint__step", "trigger", "verdict", "reason"
        )
    )
    seen = (incident.skipped, incident.resumed_from, drills)
    assert incident.outcome == Incident.Outcome.RECOVERED, (incident.reason, seen)
    assert str(newest.step) in (incident.skipped or {}), seen
    assert incident.resumed_from is not None and incident.resumed_from.last_proven_at
    assert incident.resumed_from.step < newest.step
    trial_record("newest checkpoint damaged", incident, damaged_step=newest.step)
    _record(
        fault_report,
        "recovery: newest checkpoint damaged (hashes valid)",
        True,
        f"step {newest.step} skipped ({incident.skipped[str(newest.step)][:60]}), resumed "
        f"from step {incident.resumed_from.step}",
    )


def _processes_of_slurm_job(slurm_job_id: str) -> list[int]:
    """Every process of the Slurm job on this host: its slurmstepd and all it started (the
    batch script, srun, the ranks; their environment names the job). A dead node takes
    them all at once, with no exit trap run."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (cmdline.startswith("slurmstepd:") and f"[{slurm_job_id}." in cmdline) or (
            f"SLURM_JOB_ID={slurm_job_id}".encode() in environ
        ):
            found.append(int(entry.name))
    return found


def _node_back(devcluster: DevCluster, node: str) -> None:
    """Start the node's slurmd again and wait until Slurm has it back in service (the
    tests after this one need every node)."""
    devcluster.script("up", timeout=180)
    for _ in range(120):
        state = devcluster.slurm(["sinfo", "-h", "-n", node, "-o", "%T"], check=False).stdout
        if state.strip() and "down" not in state and "drain" not in state:
            return
        if "down" in state and "*" not in state:
            devcluster.slurm(
                ["scontrol", "update", f"nodename={node}", "state=resume"], check=False
            )
        time.sleep(1)
    raise AssertionError(f"{node} did not come back: {state!r}")


@pytest.mark.exclusive
@trials
def test_a_dead_node_is_named_from_slurms_view_and_left_out(
    trial: int,
    recovering_cluster: Cluster,
    celery_stack: Any,
    researcher_api: APIClient,
    devcluster: DevCluster,
    fault_report: FaultReport,
    request: Any,
) -> None:
    # Slurm declares the node dead after SlurmdTimeout (30 s on the dev cluster): the hang
    # floor is set above that, so the first evidence is Slurm's NODE_FAIL.
    RecoveryPolicy.objects.filter(cluster=recovering_cluster).update(hang_floor_seconds=240)
    job = submit(researcher_api, name="node-dies", nodes=1, steps=6000, every=40)
    request.addfinalizer(lambda: cancel_lineage(researcher_api, job))
    _running_past(job, 80)
    # Where its rank really runs (the process's own slurmd), not what a first attempt said.
    ranks = rank_pids(run_dir_of(job))
    assert len(ranks) == 1, ranks
    node = node_of(ranks[0])
    # The node dies: its slurmd, and the job's processes on it, killed at once.
    request.addfinalizer(lambda: _node_back(devcluster, node))
    job.refresh_from_db()
    victims = [devcluster.pids()[f"slurmd-{node}"], *_processes_of_slurm_job(job.slurm_job_id)]
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    started = time.monotonic()
    incident = _settled(job, celery_stack["worker"], timeout=420)
    took = time.monotonic() - started
    job.refresh_from_db()
    assert job.state == "node_fail", (job.state, job.state_reason)
    assert incident.signal == Incident.Signal.NODE_FAILURE, incident.detail
    assert incident.suspect_nodes == [node], (incident.suspect_nodes, incident.evidence)
    assert incident.outcome == Incident.Outcome.RECOVERED, incident.reason
    assert node in (incident.excluded_nodes or [])
    resumed = _resumed_runs_past(incident, (job.last_step or 0) + 20)
    assert node not in (resumed.allocated_nodes or ""), resumed.allocated_nodes
    trial_record("node dies (slurmd killed)", incident, expected=[node])
    _record(
        fault_report,
        "recovery: node dies (slurmd and its processes killed)",
        True,
        f"{node} named; incident settled {took:.0f} s after the kill (SlurmdTimeout 30 s)",
    )


SQUEUE_SLOW = """#!/bin/sh
# Gantry fault test: squeue hangs past the command timeout.
sleep 120
"""


@pytest.mark.nodes(2)
def test_gantry_blind_is_never_a_recovery(
    recovering_cluster: Cluster,
    celery_stack: Any,
    researcher_api: APIClient,
    devcluster: DevCluster,
    fault_report: FaultReport,
    request: Any,
    own_login_node: LoginNode,
) -> None:
    jobs = [
        submit(
            researcher_api,
            name=f"healthy-blind-{index}",
            nodes=2 if index == 0 else 1,
            steps=1600,
            every=200,
        )
        for index in range(HEALTHY_JOBS)
    ]
    for job in jobs:
        request.addfinalizer(lambda job=job: cancel_lineage(researcher_api, job))
    _running_past(jobs[0], 200)
    # Blind for longer than the hang floor, three ways in a row.
    with own_login_node.shim("sacct", SACCT_DOWN):
        time.sleep(20)
        with own_login_node.shim("squeue", SQUEUE_SLOW):
            time.sleep(40)
    own_login_node.sshd_stop()
    try:
        time.sleep(40)
    finally:
        own_login_node.sshd_start()
    ids = [job.id for job in jobs]
    wait_until(
        lambda: (
            not Job.objects.filter(id__in=ids)
            .exclude(state__in=["completed", "failed", "cancelled"])
            .exists()
        ),
        timeout=360 + 60 * HEALTHY_JOBS,
        what=lambda: (
            "the healthy jobs to finish; worker log:\n" + celery_stack["worker"].log()[-2000:]
        ),
    )
    states = dict(Job.objects.filter(id__in=ids).values_list("state").annotate(n=Count("id")))
    incidents = Incident.objects.filter(job_id__in=ids).count()
    resumed = Job.objects.filter(parent_id__in=ids).count()
    _record(
        fault_report,
        "recovery: sacct down, squeue timing out, sshd gone",
        incidents == 0 and states == {"completed": len(ids)},
        f"{len(ids)} healthy jobs: {incidents} incidents, {resumed} resumes; {states}",
    )
    trial_file_note = {"kind": "healthy under blindness", "jobs": len(ids), "incidents": incidents}
    append_trial(trial_file_note)
    assert states == {"completed": len(ids)}, states
    assert incidents == 0, list(Incident.objects.filter(job_id__in=ids).values("signal", "detail"))
    assert resumed == 0


def _keep_killing(node: str, stop: threading.Event) -> None:
    """Kill every trainer rank that starts on ``node`` (a node that fails every job)."""
    while not stop.is_set():
        for pid in rank_pids(""):
            with contextlib.suppress(ProcessLookupError, AssertionError, OSError):
                if node_of(pid) == node:
                    os.kill(pid, signal.SIGKILL)
        stop.wait(0.5)


@pytest.mark.exclusive
@full_only
def test_a_node_that_kills_every_attempt_holds_the_job_without_exclusion(
    recovering_cluster: Cluster,
    celery_stack: Any,
    researcher_api: APIClient,
    fault_report: FaultReport,
    request: Any,
) -> None:
    # Two a100 nodes exist: every attempt of a two-node a100 job lands on the bad one.
    job = submit(
        researcher_api,
        name="bad-node-no-exclusion",
        nodes=2,
        steps=6000,
        every=40,
        gpu_type="a100",
        recovery={"exclude_suspects": False, "max_attempts": 2},
    )
    request.addfinalizer(lambda: cancel_lineage(researcher_api, job))
    _running_past(job, 80)
    pids = rank_pids(run_dir_of(job))
    node = node_of(max(pids, key=rank_of))
    stop = threading.Event()
    killer = threading.Thread(target=_keep_killing, args=(node, stop), daemon=True)
    killer.start()
    request.addfinalizer(stop.set)
    wait_until(
        lambda: Incident.objects.filter(lineage_root=job, outcome=Incident.Outcome.HELD).exists(),
        timeout=600,
        what=lambda: (
            "the lineage to be held; incidents: "
            + str(list(Incident.objects.filter(lineage_root=job).values("outcome", "reason")))
        ),
    )
    stop.set()
    held = Incident.objects.get(lineage_root=job, outcome=Incident.Outcome.HELD)
    attempts = Incident.objects.filter(lineage_root=job, resumed_job__isnull=False).count()
    assert attempts <= 2, attempts
    assert held.reason, held
    assert all(not (i.excluded_nodes or []) for i in Incident.objects.filter(lineage_root=job))
    _record(
        fault_report,
        "recovery: node kills every attempt, exclusion off",
        True,
        f"held after {attempts} resumes: {held.reason[:70]}",
    )
