"""Recovery through the API and the pages: incidents under the job's access rule, the
policy read by all and changed by operators (audited), suspect nodes cleared by operators."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from recovery_support import crash_incident
from rest_framework.test import APIClient

from core.models import AuditEvent
from factories import ClusterFactory, JobFactory, NodeFactory
from recovery.models import RecoveryPolicy, SuspectNode

pytestmark = pytest.mark.django_db


def _api(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_a_researcher_sees_the_incidents_of_their_own_jobs_only(
    researcher: Any, other_researcher: Any, operator: Any
) -> None:
    mine = crash_incident(JobFactory(owner=researcher))
    theirs = crash_incident(JobFactory(owner=other_researcher))
    seen = {row["id"] for row in _api(researcher).get("/api/v1/incidents/").json()["results"]}
    assert seen == {mine.pk}
    everyone = {row["id"] for row in _api(operator).get("/api/v1/incidents/").json()["results"]}
    assert everyone == {mine.pk, theirs.pk}
    # Another's job as a filter: the same 404 as a job that does not exist.
    answer = _api(researcher).get(f"/api/v1/incidents/?job={theirs.job_id}")
    assert answer.status_code == 404


def test_the_policy_is_read_by_all_and_changed_by_operators_with_an_audit(
    researcher: Any, operator: Any
) -> None:
    cluster = ClusterFactory()
    url = f"/api/v1/clusters/{cluster.pk}/recovery-policy/"
    assert _api(researcher).get(url).json()["max_attempts"] == 3
    assert _api(researcher).put(url, {"max_attempts": 1}, format="json").status_code == 403
    changed = _api(operator).put(url, {"max_attempts": 1, "on_hang": "hold"}, format="json")
    assert changed.status_code == 200 and changed.json()["on_hang"] == "hold"
    assert RecoveryPolicy.objects.get(cluster=cluster).max_attempts == 1
    event = AuditEvent.objects.get(action="recovery_policy.update")
    assert (
        event.details["before"]["max_attempts"] == 3 and event.details["after"]["max_attempts"] == 1
    )
    bad = _api(operator).put(url, {"on_hang": "reboot"}, format="json")
    assert bad.status_code == 400 and "on_hang" in bad.json()["extra"]["fields"]


def test_suspects_are_listed_with_evidence_and_cleared_by_operators(
    researcher: Any, other_researcher: Any, operator: Any
) -> None:
    cluster = ClusterFactory()
    node = NodeFactory(cluster=cluster, name="rack7-node3")
    # Two owners' runs: a drain is offered (one owner's two runs would not be).
    for owner in (researcher, other_researcher):
        incident = crash_incident(JobFactory(owner=owner, cluster=cluster))
        SuspectNode.objects.create(node=node, incident=incident, evidence="NODE_FAIL; it was down")
    listed = _api(operator).get("/api/v1/suspect-nodes/").json()
    assert listed[0]["node"] == "rack7-node3" and listed[0]["offered_for_draining"] is True
    assert len(listed[0]["evidence"]) == 2
    assert _api(researcher).get("/api/v1/suspect-nodes/").status_code == 403
    page = Client()
    page.force_login(operator)
    html = page.get("/recovery/").content.decode()
    assert 'data-node="rack7-node3"' in html and ">Drain</button>" in html
    cleared = _api(operator).post(f"/api/v1/nodes/{node.pk}/suspicions/clear/", {"why": "fixed"})
    assert cleared.json()["cleared"] == 2
    assert not SuspectNode.objects.filter(cleared_at__isnull=True).exists()
    assert AuditEvent.objects.filter(action="suspect_node.clear").count() == 1
    node_page = page.get(f"/nodes/{node.pk}/").content.decode()
    assert "NODE_FAIL; it was down" in node_page


def test_the_recovery_page_says_so_when_nothing_happened(researcher: Any) -> None:
    page = Client()
    page.force_login(researcher)
    html = page.get("/recovery/").content.decode()
    assert "nothing you can see has crashed or hung" in html
    assert "Suspect nodes" not in html


@pytest.fixture
def submit_cluster() -> Any:
    from factories import GpuFactory, PartitionFactory

    cluster = ClusterFactory(name="tenant-c", is_default=True, default_partition="long")
    PartitionFactory(cluster=cluster, name="long", max_time_minutes=600, is_default=True)
    for index in range(3):
        node = NodeFactory(cluster=cluster, name=f"c{index}", partitions=["long"], cpus_total=4)
        GpuFactory(node=node, index=0, gpu_type="l40s")
    return cluster


def _submit(user: Any, **extra: Any) -> Any:
    body = {
        "name": "with recovery",
        "partition": "long",
        "nodes": 2,
        "time_limit_minutes": 10,
        "config": {"preset": "tiny", "steps": 20},
        **extra,
    }
    return _api(user).post("/api/v1/jobs/submit/", body, format="json")


@pytest.mark.parametrize(
    "recovery, why",
    [
        ({"on_hang": "reboot"}, "on_hang"),
        ({"max_attempts": 99}, "max_attempts"),
        ({"max_attempts": True}, "max_attempts"),
        ({"gpu_hours_budget": -1}, "gpu_hours_budget"),
        ({"enabled": "yes"}, "enabled"),
        ({"retry_forever": True}, "unknown"),
    ],
)
def test_bad_recovery_settings_are_refused_with_the_field(
    submit_cluster: Any, researcher: Any, recovery: dict[str, Any], why: str
) -> None:
    answer = _submit(researcher, recovery=recovery)
    assert answer.status_code == 400
    assert why in answer.json()["extra"]["fields"]["recovery"][0]


def test_a_jobs_recovery_settings_and_exclusions_are_kept(
    submit_cluster: Any, researcher: Any
) -> None:
    from jobs.models import Job

    answer = _submit(researcher, recovery={"max_attempts": 5, "on_hang": "notify"}, exclude="c1")
    assert answer.status_code == 202, answer.json()
    job = Job.objects.get(id=answer.json()["id"])
    assert job.recovery == {"max_attempts": 5, "on_hang": "notify"}
    assert job.exclude_nodes == "c1"
    too_many = _submit(researcher, exclude="c[0-1]")
    assert too_many.status_code == 400
    assert "leaves 1 node" in too_many.json()["extra"]["fields"]["exclude"][0]
