"""Evidence confined to where it is true (issue 37, item 4): a node a job's own files name
is a suspect only when Slurm allocated it to that job; a drain is offered only on evidence
from two or more different owners, or on Slurm's own view of the node; the recovery page
says how many owners the evidence comes from.

The cluster has a shape the dev cluster does not (``tests/recovery/conftest.py``): nodes
gpu-b-01 to gpu-b-06 of partition train.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from recovery_support import crash_incident

from factories import JobFactory
from jobs.ingest import metrics_ingest
from jobs.models import Job
from jobs.stragglers import STRAGGLER_STREAK
from nodes.models import Cluster, Node
from recovery.cycle import recovery_cycle
from recovery.models import Incident, SuspectNode
from recovery.selectors import suspect_nodes
from recovery.services import _name_suspects

from .test_recovery import _running_job

pytestmark = pytest.mark.django_db


def _summary(cluster: Cluster, name: str) -> Any:
    [found] = [s for s in suspect_nodes(cluster_id=cluster.pk) if s.node.name == name]
    return found


# ------------------------------------------------------------------ within the allocation


def test_a_forged_straggler_on_another_researchers_node_names_nobody(
    cluster: Cluster, researcher: Any, other_researcher: Any, cancels: list[str]
) -> None:
    """The job (on gpu-b-01 and -02) writes per-rank timings that put a slow rank on
    gpu-b-05, where another researcher's job runs: no straggler, no incident, no suspect,
    and the other job is left alone."""
    job = _running_job(cluster, researcher)
    theirs = _running_job(
        cluster, other_researcher, allocated_nodes="gpu-b-05", slurm_job_id="5151"
    )
    forged = [[0, "gpu-b-01", 0.01, 0.05], [1, "gpu-b-05", 0.09, 0.05]]
    lines = b"".join(
        (
            json.dumps({"step": 1000 + i, "time": 1.7e9, "loss": 2.0, "ranks": forged}) + "\n"
        ).encode()
        for i in range(STRAGGLER_STREAK * 2)
    )
    metrics_ingest(job=job, data=lines, start_offset=job.metrics_offset)
    job.refresh_from_db()
    assert not (job.rank_timing or {}).get("streaks")
    recovery_cycle(cluster=cluster, seen={job.id, theirs.id}, now=timezone.now())
    assert not Incident.objects.filter(job=job).exists()
    assert not SuspectNode.objects.exists() and cancels == []


def test_the_same_timings_on_the_jobs_own_nodes_are_a_straggler(
    cluster: Cluster, researcher: Any, cancels: list[str]
) -> None:
    """The control of the test above: only the node differs."""
    job = _running_job(cluster, researcher)
    ranks = [[0, "gpu-b-01", 0.01, 0.05], [1, "gpu-b-02", 0.09, 0.05]]
    lines = b"".join(
        (json.dumps({"step": 1000 + i, "time": 1.7e9, "loss": 2.0, "ranks": ranks}) + "\n").encode()
        for i in range(STRAGGLER_STREAK)
    )
    metrics_ingest(job=job, data=lines, start_offset=job.metrics_offset)
    recovery_cycle(cluster=cluster, seen={job.id}, now=timezone.now())
    incident = Incident.objects.get(job=job)
    assert incident.signal == Incident.Signal.STRAGGLER
    assert incident.suspect_nodes == ["gpu-b-02"]


def test_a_straggler_state_naming_a_node_outside_the_allocation_opens_nothing(
    cluster: Cluster, researcher: Any, cancels: list[str]
) -> None:
    """A state stored before ingest checked the allocation (or written by hand)."""
    job = _running_job(cluster, researcher)
    Job.objects.filter(pk=job.pk).update(
        rank_timing={"streaks": {"1": {"node": "gpu-b-05", "streak": STRAGGLER_STREAK}}}
    )
    recovery_cycle(cluster=cluster, seen={job.id}, now=timezone.now())
    assert not Incident.objects.filter(job=job).exists() and cancels == []


def test_no_signal_can_record_a_suspect_outside_the_jobs_allocation(
    cluster: Cluster, researcher: Any
) -> None:
    """``_name_suspects`` is the one place every suspect goes through: a node of the
    cluster that is not the job's is refused whoever named it."""
    job = JobFactory(owner=researcher, cluster=cluster, allocated_nodes="gpu-b-[01-02]")
    incident = crash_incident(job)
    outside = Node.objects.get(cluster=cluster, name="gpu-b-04")
    _name_suspects(
        incident,
        job,
        [("gpu-b-05", "a name outside"), (outside, "a node outside"), ("gpu-b-02", "its own")],
    )
    assert set(SuspectNode.objects.values_list("node__name", flat=True)) == {"gpu-b-02"}
    incident.refresh_from_db()
    assert incident.suspect_nodes == ["gpu-b-02"]
    # A job whose allocation Gantry never learned names nobody.
    unplaced = JobFactory(owner=researcher, cluster=cluster, allocated_nodes="")
    _name_suspects(crash_incident(unplaced), unplaced, [("gpu-b-01", "no allocation")])
    assert SuspectNode.objects.count() == 1


# ------------------------------------------------------------------- offered for draining


def _suspect(cluster: Cluster, owner: Any, name: str, slurm_job_id: str) -> SuspectNode:
    job = JobFactory(owner=owner, cluster=cluster, slurm_job_id=slurm_job_id, allocated_nodes=name)
    node = Node.objects.get(cluster=cluster, name=name)
    return SuspectNode.objects.create(
        node=node, incident=crash_incident(job), evidence=f"job {slurm_job_id}: srun said so"
    )


def test_two_runs_of_one_owner_are_not_offered_for_draining(
    cluster: Cluster, researcher: Any, other_researcher: Any
) -> None:
    _suspect(cluster, researcher, "gpu-b-03", "901")
    _suspect(cluster, researcher, "gpu-b-03", "902")
    summary = _summary(cluster, "gpu-b-03")
    # Two lineages, one person's word.
    assert summary.jobs == 2 and summary.owners == 1
    assert not summary.offered_for_draining
    _suspect(cluster, other_researcher, "gpu-b-03", "903")
    summary = _summary(cluster, "gpu-b-03")
    assert summary.jobs == 3 and summary.owners == 2 and summary.offered_for_draining


@pytest.mark.parametrize(("state", "flags"), [("down", []), ("mixed", ["DRAIN"]), ("fail", [])])
def test_slurms_own_view_of_the_node_is_enough_to_offer_a_drain(
    cluster: Cluster, researcher: Any, state: str, flags: list[str]
) -> None:
    _suspect(cluster, researcher, "gpu-b-03", "901")
    assert not _summary(cluster, "gpu-b-03").offered_for_draining
    Node.objects.filter(cluster=cluster, name="gpu-b-03").update(state=state, state_flags=flags)
    summary = _summary(cluster, "gpu-b-03")
    assert summary.owners == 1 and summary.slurm_says_faulty and summary.offered_for_draining


def test_the_recovery_page_and_api_show_the_owners_behind_a_suspect(
    cluster: Cluster, researcher: Any, other_researcher: Any, operator: Any
) -> None:
    _suspect(cluster, researcher, "gpu-b-03", "901")
    _suspect(cluster, researcher, "gpu-b-03", "902")
    page = Client()
    page.force_login(operator)
    html = page.get("/recovery/").content.decode()
    row = html[html.index('data-node="gpu-b-03"') :].split("</tr>")[0]
    assert '<td data-testid="suspect-owners">1' in row and ">Drain</button>" not in row
    _suspect(cluster, other_researcher, "gpu-b-03", "903")
    html = page.get("/recovery/").content.decode()
    row = html[html.index('data-node="gpu-b-03"') :].split("</tr>")[0]
    assert '<td data-testid="suspect-owners">2' in row and ">Drain</button>" in row
    assert "3 runs of 2 owners" in row
    [listed] = page.get(f"/api/v1/suspect-nodes/?cluster={cluster.pk}").json()
    assert listed["owners"] == 2 and listed["runs"] == 3 and listed["offered_for_draining"]
