"""The node page (``console.pages.node_detail_page``): the jobs on the node, running
and recently ended, as far as the viewer may see them, and the node's events."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from factories import ClusterFactory, JobFactory, NodeFactory
from jobs import selectors
from jobs.selectors import jobs_on_node
from nodes.models import NodeEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster() -> Any:
    return ClusterFactory(name="east")


@pytest.fixture
def nodes(cluster: Any) -> dict[str, Any]:
    return {
        name: NodeFactory(cluster=cluster, name=name)
        for name in ("prefix1", "prefix2", "prefix3", "gpu-a7")
    }


def page(client: Client, node: Any) -> str:
    response = client.get(f"/nodes/{node.pk}/")
    assert response.status_code == 200
    return str(response.content.decode())


def test_running_job_shows_on_the_nodes_of_its_host_list_only(
    client: Client, researcher: Any, nodes: dict[str, Any], cluster: Any
) -> None:
    job = JobFactory(
        owner=researcher,
        cluster=cluster,
        name="wide-run",
        state="running",
        allocated_nodes="prefix[1-2]",
        gpus_per_node=4,
        gpu_type="h100",
        started_at=timezone.now() - timedelta(hours=1),
    )
    client.force_login(researcher)
    on_two = page(client, nodes["prefix2"])
    assert f'href="/jobs/{job.id}/"' in on_two
    assert "wide-run" in on_two and "4 × h100 per node" in on_two
    on_three = page(client, nodes["prefix3"])
    assert "wide-run" not in on_three
    assert "No Gantry job runs here now." in on_three


def test_mixed_host_list_and_a_name_without_a_leading_number(
    researcher: Any, nodes: dict[str, Any], cluster: Any
) -> None:
    JobFactory(
        owner=researcher, cluster=cluster, state="running", allocated_nodes="prefix[1,3],gpu-a7"
    )
    names = {
        name: [job.allocated_nodes for job in jobs_on_node(user=researcher, node=node).running]
        for name, node in nodes.items()
    }
    assert names == {
        "prefix1": ["prefix[1,3],gpu-a7"],
        "prefix2": [],
        "prefix3": ["prefix[1,3],gpu-a7"],
        "gpu-a7": ["prefix[1,3],gpu-a7"],
    }


def test_recent_jobs_are_the_newest_ended_within_the_window(
    researcher: Any, nodes: dict[str, Any], cluster: Any
) -> None:
    now = timezone.now()
    for hours in range(1, 5):
        JobFactory(
            owner=researcher,
            cluster=cluster,
            name=f"ended-{hours}h",
            state="completed",
            allocated_nodes="prefix2",
            ended_at=now - timedelta(hours=hours),
        )
    JobFactory(
        owner=researcher,
        cluster=cluster,
        name="too-old",
        state="failed",
        allocated_nodes="prefix2",
        ended_at=now - timedelta(days=8),
    )
    # The same node name on another cluster is another node.
    JobFactory(
        owner=researcher,
        cluster=ClusterFactory(name="west"),
        name="elsewhere",
        state="completed",
        allocated_nodes="prefix2",
        ended_at=now - timedelta(minutes=5),
    )
    found = jobs_on_node(user=researcher, node=nodes["prefix2"], recent_days=7, limit=3, now=now)
    assert [job.name for job in found.recent] == ["ended-1h", "ended-2h", "ended-3h"]
    assert found.running == []


def test_only_candidate_host_lists_are_expanded(
    researcher: Any, nodes: dict[str, Any], cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for index in range(5):
        JobFactory(
            owner=researcher, cluster=cluster, state="running", allocated_nodes=f"other[{index}-9]"
        )
    JobFactory(owner=researcher, cluster=cluster, state="running", allocated_nodes="")
    JobFactory(owner=researcher, cluster=cluster, state="running", allocated_nodes="prefix[2-")
    mine = JobFactory(owner=researcher, cluster=cluster, state="running", allocated_nodes="prefix2")
    expanded: list[str] = []
    real_expand = selectors.expand

    def counting_expand(expression: str | None) -> list[str]:
        expanded.append(str(expression))
        return real_expand(expression)

    monkeypatch.setattr(selectors, "expand", counting_expand)
    found = jobs_on_node(user=researcher, node=nodes["prefix2"])
    assert [job.id for job in found.running] == [mine.id]
    # The malformed host list is a candidate and is skipped, not an error.
    assert sorted(expanded) == ["prefix2", "prefix[2-"]


def test_researchers_see_only_their_jobs_and_a_count_of_the_others(
    client: Client,
    researcher: Any,
    other_researcher: Any,
    operator: Any,
    nodes: dict[str, Any],
    cluster: Any,
) -> None:
    JobFactory(
        owner=other_researcher,
        cluster=cluster,
        name="someone-elses",
        state="running",
        allocated_nodes="prefix2",
    )
    JobFactory(
        owner=other_researcher,
        cluster=cluster,
        name="someone-elses-ended",
        state="completed",
        allocated_nodes="prefix2",
        ended_at=timezone.now(),
    )
    client.force_login(researcher)
    as_researcher = page(client, nodes["prefix2"])
    assert "someone-elses" not in as_researcher
    assert "Other users' jobs running here: 1." in as_researcher
    client.force_login(operator)
    as_operator = page(client, nodes["prefix2"])
    assert "someone-elses" in as_operator and "someone-elses-ended" in as_operator
    assert "Other users" not in as_operator


def test_events_are_listed_and_the_empty_state_says_so(
    client: Client, researcher: Any, nodes: dict[str, Any]
) -> None:
    client.force_login(researcher)
    quiet = page(client, nodes["prefix3"])
    assert "No events recorded for this node yet" in quiet
    NodeEvent.objects.create(
        node=nodes["prefix2"],
        kind="state",
        from_state="idle",
        to_state="drained",
        message="bad dimm",
    )
    busy = page(client, nodes["prefix2"])
    assert "bad dimm" in busy and 'data-testid="node-events"' in busy
    assert "No events recorded" not in busy
    assert "No Gantry job of yours ended here in the last 7 days." in busy
