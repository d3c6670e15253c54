"""Nodes and Topology pages in a real browser, on the real dev cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def log_in(page: Any, live_server: Any, username: str) -> None:
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", "correct-horse-battery")
    page.click("button[type=submit]")
    page.wait_for_selector("nav.mainnav")


@pytest.mark.exclusive
def test_nodes_and_topology_show_the_dev_cluster(
    page: Any, live_server: Any, synced_devcluster: Any, researcher: Any, artifacts: Path
) -> None:
    log_in(page, live_server, researcher.username)
    page.click("nav.mainnav >> text=Nodes")
    rows = page.locator("#node-table tbody tr")
    assert rows.count() == 4
    n1 = page.locator("tr[data-node=n1]")
    assert "a100" in n1.inner_text() and "0/2" in n1.inner_text()
    assert "leaf1" in n1.inner_text() and "batch" in n1.inner_text()
    assert "h100" in page.locator("tr[data-node=n3]").inner_text()
    # A researcher gets no drain button.
    assert page.locator("[data-action=drain]").count() == 0
    page.screenshot(path=str(artifacts / "nodes.png"), full_page=True)

    page.select_option("select[name=state]", "idle")
    page.fill("input[name=gpu_type]", "h100")
    page.click("form.filters button[type=submit]")
    assert sorted(
        page.locator("#node-table tbody tr").evaluate_all("rows => rows.map(r => r.dataset.node)")
    ) == ["n3", "n4"]

    page.click("nav.mainnav >> text=Topology")
    spine = page.locator("[data-switch=spine]")
    assert spine.count() == 1
    assert sorted(
        spine.locator("[data-switch=leaf1] [data-node]").evaluate_all(
            "els => els.map(e => e.dataset.node)"
        )
    ) == ["n1", "n2"]
    assert sorted(
        spine.locator("[data-switch=leaf2] [data-node]").evaluate_all(
            "els => els.map(e => e.dataset.node)"
        )
    ) == ["n3", "n4"]
    assert page.locator("[data-node=n3] .gpu").count() == 2
    assert "1 CPU/GPU" in page.locator("[data-node=n3]").inner_text()
    assert "2000 MB/GPU" in page.locator("[data-node=n3]").inner_text()
    page.screenshot(path=str(artifacts / "topology.png"), full_page=True)


@pytest.mark.exclusive
def test_operator_drains_and_resumes_from_the_page(
    page: Any, live_server: Any, synced_devcluster: Any, operator: Any, devcluster: Any
) -> None:
    log_in(page, live_server, operator.username)
    page.goto(f"{live_server.url}/nodes/")
    row = page.locator("tr[data-node=n2]")
    row.locator("input[name=reason]").fill("page drain test")
    try:
        row.locator("[data-action=drain]").click()
        page.wait_for_selector(".messages")
        assert page.locator("tr[data-node=n2]").get_attribute("data-state") == "drained"
        assert "page drain test" in page.locator("tr[data-node=n2] .reason").inner_text()
        state = devcluster.slurm(["sinfo", "-h", "-n", "n2", "-o", "%T"]).stdout.strip()
        assert state == "drained"
    finally:
        resume = page.locator("tr[data-node=n2] [data-action=resume]")
        if resume.count():
            resume.click()
            page.wait_for_selector(".messages")
        else:
            devcluster.slurm(["scontrol", "update", "nodename=n2", "state=resume"], check=False)
    assert page.locator("tr[data-node=n2]").get_attribute("data-state") == "idle"
