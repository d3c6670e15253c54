"""The acceptance API and pages: operators start and cancel, every role reads; bad input
is a 400 with the field; the run page shows tiers, criteria, the busbw chart, convicted
nodes with their drain, and the certificate download; the node page its history."""

from __future__ import annotations

import json
from typing import Any

import pytest
from acceptance_support import (
    LoginNode,
    a100_cluster,
    drive,
)
from django.test import Client
from rest_framework.test import APIClient

from acceptance.models import AcceptanceRun, BusbwThreshold
from nodes.models import Cluster, Node

pytestmark = pytest.mark.django_db
GB = 1e9


@pytest.fixture
def cluster() -> Cluster:
    cluster = a100_cluster()
    for level in ("node", "leaf", "spine"):
        BusbwThreshold.objects.create(cluster=cluster, level=level, busbw=5 * GB)
    return cluster


def _body(cluster: Cluster, **extra: Any) -> dict[str, Any]:
    return {"cluster": cluster.pk, "scope": "nodes", "value": "n[1-2]", **extra}


def test_only_operators_start_and_bad_input_is_a_400(
    cluster: Cluster, operator_api: APIClient, researcher_api: APIClient
) -> None:
    url = "/api/v1/acceptance/runs/start/"
    assert researcher_api.post(url, _body(cluster), format="json").status_code == 403
    assert not AcceptanceRun.objects.exists()
    refused = operator_api.post(url, _body(cluster, value="n[1-9]"), format="json")
    assert refused.status_code == 400 and "n5" in refused.json()["message"]
    refused = operator_api.post(url, _body(cluster, options={"max_mib": 0}), format="json")
    assert refused.status_code == 400
    started = operator_api.post(url, _body(cluster, tiers=["collectives"]), format="json")
    assert started.status_code == 202, started.json()
    assert started.json()["nodes"] == ["n1", "n2"] and started.json()["partition"] == "train"
    # The same nodes again while the first run tests them: refused.
    again = operator_api.post(url, _body(cluster), format="json")
    assert again.status_code == 409


def test_every_role_reads_and_the_certificate_comes_when_the_run_ends(
    cluster: Cluster, operator_api: APIClient, researcher_api: APIClient, login_node: LoginNode
) -> None:
    started = operator_api.post(
        "/api/v1/acceptance/runs/start/", _body(cluster, tiers=["collectives"]), format="json"
    )
    run_id = started.json()["id"]
    listed = researcher_api.get("/api/v1/acceptance/runs/")
    assert [r["id"] for r in listed.json()["results"]] == [run_id]
    certificate_url = f"/api/v1/acceptance/runs/{run_id}/certificate/"
    assert researcher_api.get(certificate_url).status_code == 404
    drive(AcceptanceRun.objects.get(id=run_id), login_node, lambda group: 10 * GB)
    detail = researcher_api.get(f"/api/v1/acceptance/runs/{run_id}/").json()
    assert detail["verdict"] == "passed" and detail["steps"]
    certificate = researcher_api.get(certificate_url)
    assert certificate.status_code == 200
    assert certificate.json()["schema"] == "gantry-acceptance-certificate/1"
    assert researcher_api.post(f"/api/v1/acceptance/runs/{run_id}/cancel/").status_code == 403


def test_the_run_page_shows_criteria_chart_convicted_and_drain(
    cluster: Cluster, operator: Any, operator_api: APIClient, login_node: LoginNode
) -> None:
    started = operator_api.post(
        "/api/v1/acceptance/runs/start/",
        {"cluster": cluster.pk, "scope": "partition", "value": "train", "tiers": ["collectives"]},
        format="json",
    )
    run = AcceptanceRun.objects.get(id=started.json()["id"])
    drive(run, login_node, lambda group: 1 * GB if group == ("n4",) else 10 * GB)
    client = Client()
    client.force_login(operator)
    page = client.get(f"/acceptance/{run.id}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="busbw-chart"' in html and "<rect" in html
    n4 = Node.objects.get(cluster=cluster, name="n4")
    assert f'action="/nodes/{n4.pk}/drain/"' in html
    assert (
        'data-node="n4"' in html and 'data-node="n1"' not in html.split("acceptance-convicted")[1]
    )
    download = client.get(f"/acceptance/{run.id}/certificate.json")
    assert json.loads(download.content)["convicted"] == ["n4"]
    node_page = client.get(f"/nodes/{n4.pk}/").content.decode()
    assert 'id="node-certificates"' in node_page and "convicted" in node_page


def test_the_start_page_is_for_operators(cluster: Cluster, researcher: Any, operator: Any) -> None:
    client = Client()
    client.force_login(researcher)
    page = client.get("/acceptance/")
    assert page.status_code == 200 and 'id="acceptance-start"' not in page.content.decode()
    denied = client.post("/acceptance/start/", {"cluster": cluster.pk})
    assert denied.status_code == 403
    client.force_login(operator)
    refused = client.post("/acceptance/start/", {"cluster": cluster.pk, "scope": "nodes"})
    assert refused.status_code == 400
    started = client.post(
        "/acceptance/start/",
        {"cluster": cluster.pk, "scope": "nodes", "value": "n[3-4]", "tiers": ["inventory"]},
    )
    assert started.status_code == 302
    assert AcceptanceRun.objects.get().nodes == ["n3", "n4"]
