"""The interruption rate behind checkpoint advice counts only what Slurm or Gantry's health
checks evidence: Slurm's node failure, preemption and boot failure, and a failed (or
recovery-stopped) job whose node the health probe found turning critical while it ran.
A failure only the job itself claims (its exit code, its own files going quiet or slow)
is not counted: the rate is every researcher's advice, and one researcher could move it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone
from recovery_support import crash_incident

from factories import ClusterFactory, JobFactory, NodeFactory
from health.models import HealthEvent
from jobs.goodput.selectors import HEALTH_EVIDENCE_GRACE, _failure_history
from jobs.models import Job
from nodes.models import Cluster
from recovery.models import Incident

pytestmark = pytest.mark.django_db

START = timezone.now() - timedelta(days=1)
END = START + timedelta(hours=2)


@pytest.fixture
def cluster() -> Cluster:
    cluster = ClusterFactory(name="tenant-q")
    for name in ("q-01", "q-02", "q-03"):
        NodeFactory(cluster=cluster, name=name)
    return cluster


def _ended(cluster: Cluster, owner: Any, state: str, **values: Any) -> Job:
    fields: dict[str, Any] = {
        "owner": owner,
        "cluster": cluster,
        "state": state,
        "nodes": 2,
        "gpus_per_node": 4,
        "started_at": START,
        "ended_at": END,
        "allocated_nodes": "q-[01-02]",
    }
    fields.update(values)
    return JobFactory(**fields)


def _critical(cluster: Cluster, name: str, at: datetime) -> None:
    HealthEvent.objects.create(
        node=cluster.nodes.get(name=name),
        at=at,
        from_state="ok",
        to_state="critical",
        reason="XID 48: double-bit ECC error",
    )


def _count(cluster: Cluster) -> int:
    return _failure_history(cluster_id=cluster.pk).interruptions


def test_failures_only_the_job_claims_are_not_interruptions(
    cluster: Cluster, researcher: Any
) -> None:
    """A program that exits non-zero, and jobs recovery stopped on their own files (a hang,
    a straggler, a diverged loss): one researcher could write any number of these."""
    _ended(cluster, researcher, Job.State.FAILED, state_reason="NonZeroExitCode")
    _ended(cluster, researcher, Job.State.FAILED, state_reason="out of memory")
    for signal in (Incident.Signal.HANG, Incident.Signal.STRAGGLER, Incident.Signal.LOSS_SPIKE):
        crash_incident(_ended(cluster, researcher, Job.State.CANCELLED), signal=signal)
    history = _failure_history(cluster_id=cluster.pk)
    assert history.interruptions == 0
    # Their runtime still counts: the rate is per GPU-hour of every ended job.
    assert history.gpu_hours == pytest.approx(5 * 8 * 2.0)


def test_slurms_own_endings_are_interruptions(cluster: Cluster, researcher: Any) -> None:
    _ended(cluster, researcher, Job.State.NODE_FAIL)
    _ended(cluster, researcher, Job.State.FAILED, state_reason="preempted (signal 15)")
    _ended(cluster, researcher, Job.State.FAILED, state_reason="boot failure")
    _ended(cluster, researcher, Job.State.COMPLETED)
    assert _count(cluster) == 3


def test_a_failure_the_health_probe_saw_on_the_jobs_node_is_an_interruption(
    cluster: Cluster, researcher: Any
) -> None:
    _ended(cluster, researcher, Job.State.FAILED, state_reason="NonZeroExitCode")
    hung = _ended(cluster, researcher, Job.State.CANCELLED)
    crash_incident(hung, signal=Incident.Signal.HANG)
    assert _count(cluster) == 0
    _critical(cluster, "q-02", END + HEALTH_EVIDENCE_GRACE / 2)
    # Both ran on q-02; each counts once, whatever else the probe saw.
    _critical(cluster, "q-01", START + timedelta(minutes=30))
    assert _count(cluster) == 2
    # A completed job there is no interruption, whatever its nodes did.
    _ended(cluster, researcher, Job.State.COMPLETED)
    assert _count(cluster) == 2


@pytest.mark.parametrize(
    ("name", "at"),
    [
        ("q-03", START + timedelta(minutes=30)),  # a node the job did not run on
        ("q-01", END + HEALTH_EVIDENCE_GRACE * 2),  # long after the job ended
        ("q-01", START - timedelta(minutes=1)),  # before it started
    ],
)
def test_health_evidence_elsewhere_or_at_another_time_is_not_the_jobs(
    cluster: Cluster, researcher: Any, name: str, at: datetime
) -> None:
    _ended(cluster, researcher, Job.State.FAILED, state_reason="NonZeroExitCode")
    _critical(cluster, name, at)
    assert _count(cluster) == 0


def test_a_node_failure_the_probe_also_saw_counts_once(cluster: Cluster, researcher: Any) -> None:
    _ended(cluster, researcher, Job.State.NODE_FAIL)
    _critical(cluster, "q-01", START + timedelta(minutes=30))
    assert _count(cluster) == 1
