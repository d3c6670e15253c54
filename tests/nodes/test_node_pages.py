from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from factories import GpuFactory, NodeFactory, SwitchFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def node() -> Any:
    switch = SwitchFactory(name="leaf1")
    node = NodeFactory(cluster=switch.cluster, name="n7", leaf_switch=switch, cpus_alloc=1)
    GpuFactory(node=node, index=0, state="allocated", gpu_type="h100")
    GpuFactory(node=node, index=1, gpu_type="h100")
    return node


def test_node_list_shows_gpu_use_and_no_actions_for_researchers(
    client: Client, researcher: Any, node: Any
) -> None:
    client.force_login(researcher)
    page = client.get("/nodes/").content.decode()
    assert "h100" in page and "1/2" in page and "leaf1" in page
    assert 'data-action="drain"' not in page


def test_operator_sees_drain_controls(client: Client, operator: Any, node: Any) -> None:
    client.force_login(operator)
    page = client.get("/nodes/").content.decode()
    assert 'data-action="drain"' in page


def test_researcher_cannot_drain_through_the_page(
    client: Client, researcher: Any, node: Any
) -> None:
    client.force_login(researcher)
    response = client.post(f"/nodes/{node.pk}/drain/", {"reason": "mine now"})
    assert response.status_code == 403
    node.refresh_from_db()
    assert node.state == "idle"


def test_filters_narrow_the_list(client: Client, researcher: Any, node: Any) -> None:
    NodeFactory(cluster=node.cluster, name="n8", state="drained", reason="bad dimm")
    client.force_login(researcher)
    # Rows are matched by their data-node attribute: a bare "n8" can turn up in a CSRF token.
    n7, n8 = 'data-node="n7"', 'data-node="n8"'
    drained = client.get("/nodes/?state=drained").content.decode()
    assert n8 in drained and n7 not in drained
    by_reason = client.get("/nodes/?q=dimm").content.decode()
    assert n8 in by_reason and n7 not in by_reason
    by_gpu = client.get("/nodes/?gpu_type=h100").content.decode()
    assert n7 in by_gpu and n8 not in by_gpu


def test_empty_states_say_what_to_do(client: Client, researcher: Any) -> None:
    client.force_login(researcher)
    assert "No nodes yet" in client.get("/nodes/").content.decode()
    assert "No cluster registered yet" in client.get("/topology/").content.decode()


def test_node_api_filters_and_shape(researcher_api: Any, node: Any) -> None:
    body = researcher_api.get("/api/v1/nodes/?gpu_type=h100").json()
    assert [row["name"] for row in body["results"]] == ["n7"]
    assert body["results"][0]["gpus"] == {
        "total": 2,
        "allocated": 1,
        "by_type": {"h100": {"total": 2, "allocated": 1}},
    }
    bad = researcher_api.get("/api/v1/nodes/?state=sleepy")
    assert bad.status_code == 400
    assert "state" in bad.json()["extra"]["fields"]
    tree = researcher_api.get("/api/v1/topology/").json()
    assert tree["clusters"][0]["switches"][0]["nodes"][0]["name"] == "n7"


def test_outsider_gets_no_inventory(outsider_api: Any, node: Any) -> None:
    response = outsider_api.get("/api/v1/nodes/")
    assert response.status_code == 403
    assert set(response.json()) == {"message", "extra"}
