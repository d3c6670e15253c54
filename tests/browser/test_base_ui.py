from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from factories import ClusterFactory, GpuFactory, NodeFactory, SwitchFactory

pytestmark = pytest.mark.django_db(transaction=True)


def log_in(
    page: Any, live_server: Any, username: str, password: str = "correct-horse-battery"
) -> None:
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_selector("nav.mainnav")


def test_login_shows_navigation_and_every_page_opens(
    page: Any, live_server: Any, researcher: Any, artifacts: Path
) -> None:
    cluster = ClusterFactory(name="devcluster", is_default=True)
    switch = SwitchFactory(cluster=cluster, name="leaf1")
    node = NodeFactory(cluster=cluster, name="n1", leaf_switch=switch)
    GpuFactory(node=node, index=0, state="allocated")
    GpuFactory(node=node, index=1)

    page.goto(f"{live_server.url}/jobs/")
    # Not signed in: sent to the login page.
    assert "/accounts/login/" in page.url

    page.fill("#id_username", researcher.username)
    page.fill("#id_password", "wrong password")
    page.click("button[type=submit]")
    assert page.locator(".form-error").is_visible()

    log_in(page, live_server, researcher.username)
    nav = page.locator("nav.mainnav a")
    assert nav.all_inner_texts() == [
        "Overview",
        "Nodes",
        "Topology",
        "Jobs",
        "Drills",
        "Recovery",
        "Acceptance",
        "Studies",
    ]
    assert page.locator(".role").inner_text().lower() == "researcher"
    card = page.locator("article.cluster-card[data-cluster=devcluster]")
    assert "a100 1/2" in card.inner_text()
    page.screenshot(path=str(artifacts / "overview.png"), full_page=True)

    for label, heading in [
        ("Nodes", "Nodes"),
        ("Topology", "Topology"),
        ("Jobs", "Jobs"),
        ("Drills", "Restore drills"),
        ("Recovery", "Recovery"),
        ("Acceptance", "Acceptance"),
        ("Studies", "Scaling studies"),
    ]:
        # A click starts the navigation; the checks below wait for the new page (under load
        # the old page's heading can still be there when the click returns).
        page.click(f"nav.mainnav >> text={label}")
        page.wait_for_selector(f"nav.mainnav a[aria-current=page]:text-is('{label}')")
        assert page.locator("h1").first.inner_text().startswith(heading)
        assert page.locator("nav.mainnav a[aria-current=page]").inner_text() == label

    page.click("nav.mainnav >> text=Topology")
    page.wait_for_selector("nav.mainnav a[aria-current=page]:text-is('Topology')")
    assert page.locator("[data-switch=leaf1] [data-node=n1] .gpu-allocated").count() == 1

    page.click("text=Log out")
    page.wait_for_url("**/accounts/login/")
