"""The node page shows each GPU's health, the stack and its drift, and offers a critical
node for draining; the overview shows GPU capacity by health per partition; the API."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from django.test import Client

from factories import GpuFactory, NodeFactory
from health.services import probe_record
from nodes.models import Node

pytestmark = pytest.mark.django_db
NOW = datetime(2030, 5, 6, 12, 0, tzinfo=UTC)
Document = Callable[..., dict[str, Any]]


@pytest.fixture
def nodes() -> list[Node]:
    first = NodeFactory(name="n1")
    made = [first, *(NodeFactory(cluster=first.cluster, name=f"n{i}") for i in (2, 3))]
    for node in made:
        GpuFactory(node=node, index=0)
        GpuFactory(node=node, index=1)
    return made


def test_node_page_shows_gpu_health_and_offers_drain(
    client: Client, operator: Any, nodes: list[Node], document: Document
) -> None:
    node = nodes[0]
    probe_record(node=node, document=document("derived/a100-ecc-uncorrectable.xml"), now=NOW)
    client.force_login(operator)
    page = client.get(f"/nodes/{node.pk}/").content.decode()
    assert 'data-testid="node-health-state">critical<' in page
    assert "2 uncorrectable ECC error(s) since the last reset" in page
    assert "drain, then reset the GPU" in page
    assert 'data-gpu="1"' in page and "NVIDIA A100-SXM4-80GB" in page
    assert 'data-testid="health-drain-offer"' in page
    assert 'name="reason" value="GPU health critical: GPU 0: 2 uncorrectable ECC' in page


def test_researchers_see_health_but_no_drain_offer(
    client: Client, researcher: Any, nodes: list[Node], document: Document
) -> None:
    probe_record(node=nodes[0], document=document("derived/a100-ecc-uncorrectable.xml"), now=NOW)
    client.force_login(researcher)
    page = client.get(f"/nodes/{nodes[0].pk}/").content.decode()
    assert "node-health-state" in page and "health-drain-offer" not in page


def test_never_probed_says_so(client: Client, researcher: Any, nodes: list[Node]) -> None:
    client.force_login(researcher)
    page = client.get(f"/nodes/{nodes[0].pk}/").content.decode()
    assert 'data-testid="node-health-never"' in page


def test_drift_shown_on_the_node_page_and_overview(
    client: Client, operator: Any, nodes: list[Node], document: Document
) -> None:
    usual = {"python": "3.11.7", "kernel": "6.1.0", "torch": "2.4.0"}
    for node in nodes[:2]:
        probe_record(node=node, document=document(stack=usual), now=NOW)
    probe_record(node=nodes[2], document=document(stack={**usual, "torch": "2.5.1"}), now=NOW)
    client.force_login(operator)
    page = client.get(f"/nodes/{nodes[2].pk}/").content.decode()
    assert 'data-testid="node-drift"' in page and "torch 2.5.1 (majority 2.4.0)" in page
    same = client.get(f"/nodes/{nodes[0].pk}/").content.decode()
    assert 'data-testid="node-no-drift"' in same
    overview = client.get("/").content.decode()
    cluster = nodes[0].cluster.name
    row = overview[overview.index(f'data-partition="{cluster}/batch"') :]
    row = row[: row.index("</tr>")]
    assert ">6<" in row and ">1<" in row  # 6 healthy GPUs, 1 node off the majority stack


def test_overview_counts_gpus_by_health(
    client: Client, operator: Any, nodes: list[Node], document: Document
) -> None:
    probe_record(node=nodes[0], document=document("derived/a100-thermal.xml"), now=NOW)
    probe_record(node=nodes[1], document=document("derived/a100-recovery-reset.xml"), now=NOW)
    client.force_login(operator)
    body = client.get("/api/v1/health/capacity/").json()
    (row,) = body
    # n1: one warning GPU + one ok; n2 critical (both GPUs count as unhealthy); n3 unknown.
    assert (row["healthy"], row["degraded"], row["unhealthy"], row["unknown"]) == (1, 1, 2, 2)
    overview = client.get("/").content.decode()
    assert 'data-testid="gpu-capacity"' in overview


def test_node_health_api(researcher_api: Any, nodes: list[Node], document: Document) -> None:
    probe_record(node=nodes[0], document=document("derived/a100-thermal.xml"), now=NOW)
    body = researcher_api.get(f"/api/v1/nodes/{nodes[0].pk}/health/").json()
    assert body["state"] == "warning" and body["action"] == "watch"
    assert body["gpus"][0]["readings"]["clock_reasons_active"] == ["hw_thermal_slowdown"]
    assert body["stack_fingerprint"] and body["offered_for_draining"] is False
    never = researcher_api.get(f"/api/v1/nodes/{nodes[1].pk}/health/").json()
    assert never["state"] == "unknown" and never["gpus"] == []
    assert researcher_api.get("/api/v1/nodes/999999/health/").status_code == 404
