"""Clusters end to end on the dev cluster: register through the API, sync, drain/resume,
and refuse host keys that are not the pinned one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from celery_support import database_url_for, start_worker, wait_until
from core.models import AuditEvent
from devcluster_support import DevCluster
from nodes.models import Cluster, Gpu, Link, Node, NodeEvent, Partition, Switch
from nodes.sync import cluster_sync
from slurm.transport import close_all


def register_payload(devcluster: DevCluster, **overrides: Any) -> dict[str, Any]:
    payload = {
        "name": "devcluster",
        "ssh_host": devcluster.host,
        "ssh_port": devcluster.port,
        "ssh_user": devcluster.user,
        "private_key": devcluster.key.read_text(),
        "workdir": devcluster.workdir,
        "python": devcluster.python,
        "host_key_fingerprint": devcluster.host_fingerprint,
    }
    payload.update(overrides)
    return payload


@pytest.fixture
def registered(devcluster: DevCluster, operator_api: APIClient) -> Cluster:
    close_all()
    response = operator_api.post(
        "/api/v1/clusters/register/", register_payload(devcluster), format="json"
    )
    assert response.status_code == 201, response.json()
    cluster = Cluster.objects.get(name="devcluster")
    result = cluster_sync(cluster_id=cluster.pk)
    assert result.ok, result.error
    return cluster


@pytest.mark.nodes(0)
@pytest.mark.django_db
def test_register_pins_the_host_key_and_probes(
    devcluster: DevCluster, operator_api: APIClient
) -> None:
    close_all()
    response = operator_api.post(
        "/api/v1/clusters/register/", register_payload(devcluster), format="json"
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["fingerprint_seen"] == devcluster.host_fingerprint
    assert body["probe"]["slurm_version"].startswith("22.05")
    assert body["probe"]["cluster_name"] == "gantrydev"
    assert body["probe"]["accounting_available"] is True
    assert sorted(body["probe"]["partitions"]) == ["batch", "gpu"]
    # The private key is never echoed.
    assert "PRIVATE KEY" not in response.content.decode()
    cluster = Cluster.objects.get(name="devcluster")
    assert cluster.host_key_fingerprint == devcluster.host_fingerprint
    assert cluster.is_default and cluster.default_partition == "batch"
    key_file = Path(cluster_key_path(cluster))
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert AuditEvent.objects.filter(action="cluster.register").count() == 1


@pytest.mark.nodes(0)
@pytest.mark.django_db
def test_without_a_fingerprint_trust_on_first_use_is_an_explicit_choice(
    devcluster: DevCluster, operator_api: APIClient
) -> None:
    """No fingerprint: refused, naming the key the server presents; with trust on first
    use that key is pinned and the audit log says how it came to be trusted."""
    close_all()
    refused = operator_api.post(
        "/api/v1/clusters/register/",
        register_payload(devcluster, host_key_fingerprint=""),
        format="json",
    )
    assert refused.status_code == 400, refused.json()
    why = refused.json()["extra"]["fields"]["host_key_fingerprint"][0]
    assert devcluster.host_fingerprint in why and "trust on first use" in why
    assert not Cluster.objects.exists()
    trusted = operator_api.post(
        "/api/v1/clusters/register/",
        register_payload(devcluster, host_key_fingerprint="", trust_on_first_use=True),
        format="json",
    )
    assert trusted.status_code == 201, trusted.json()
    cluster = Cluster.objects.get(name="devcluster")
    assert cluster.host_key_fingerprint == devcluster.host_fingerprint
    event = AuditEvent.objects.get(action="cluster.register")
    assert event.details["host_key_trust"] == "trust on first use"
    assert event.details["host_key"] == devcluster.host_fingerprint


def cluster_key_path(cluster: Cluster) -> str:
    from nodes.access.cluster import private_key_path

    return str(private_key_path(cluster))


@pytest.mark.exclusive
@pytest.mark.django_db
def test_sync_brings_nodes_gpus_partitions_and_the_switch_tree(registered: Cluster) -> None:
    nodes = {node.name: node for node in Node.objects.filter(cluster=registered)}
    assert sorted(nodes) == ["n1", "n2", "n3", "n4"]
    assert all(node.cpus_total == 2 and node.memory_mb == 4000 for node in nodes.values())
    gpus = Gpu.objects.filter(node__cluster=registered)
    assert gpus.count() == 8
    assert set(gpus.values_list("gpu_type", flat=True)) == {"a100", "h100"}
    assert {n.gpus.first().gpu_type for n in (nodes["n1"], nodes["n2"])} == {"a100"}
    partitions = {p.name: p for p in Partition.objects.filter(cluster=registered)}
    assert sorted(partitions) == ["batch", "gpu"]
    assert partitions["batch"].is_default and partitions["batch"].max_time_minutes == 60
    switches = {s.name: s for s in Switch.objects.filter(cluster=registered)}
    assert sorted(switches) == ["leaf1", "leaf2", "spine"]
    assert switches["leaf1"].parent == switches["spine"] == switches["leaf2"].parent
    assert nodes["n1"].leaf_switch == switches["leaf1"] == nodes["n2"].leaf_switch
    assert nodes["n3"].leaf_switch == switches["leaf2"] == nodes["n4"].leaf_switch
    assert Link.objects.filter(cluster=registered, scope="node_switch").count() == 4
    registered.refresh_from_db()
    assert registered.sync_status == "ok" and registered.last_sync_error == ""

    # A second sync changes nothing and records no event.
    events_before = NodeEvent.objects.count()
    result = cluster_sync(cluster_id=registered.pk)
    assert result.ok and result.state_changes == 0
    assert NodeEvent.objects.count() == events_before


@pytest.mark.exclusive
@pytest.mark.django_db
def test_drain_and_resume_n2_through_the_api(
    registered: Cluster, devcluster: DevCluster, operator_api: APIClient, researcher_api: APIClient
) -> None:
    n2 = Node.objects.get(cluster=registered, name="n2")

    denied = researcher_api.post(f"/api/v1/nodes/{n2.pk}/drain/", {"reason": "x"}, format="json")
    assert denied.status_code == 403
    missing = operator_api.post(f"/api/v1/nodes/{n2.pk}/drain/", {}, format="json")
    assert missing.status_code == 400
    assert "reason" in missing.json()["extra"]["fields"]

    try:
        response = operator_api.post(
            f"/api/v1/nodes/{n2.pk}/drain/", {"reason": "fan replacement"}, format="json"
        )
        assert response.status_code == 200, response.json()
        assert response.json()["state"] in ("drained", "draining")
        slurm_view = devcluster.slurm(["sinfo", "-h", "-n", "n2", "-o", "%T|%E"]).stdout.strip()
        assert slurm_view.startswith("drain"), slurm_view
        assert "fan replacement" in slurm_view
        n2.refresh_from_db()
        assert n2.state == "drained" and "fan replacement" in n2.reason
        assert AuditEvent.objects.filter(action="node.drain", target_id=str(n2.pk)).exists()
    finally:
        response = operator_api.post(f"/api/v1/nodes/{n2.pk}/resume/", format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["state"] == "idle"
    # Right after a resume Slurm shows "idle*" for a moment (not responding yet).
    wait_until(
        lambda: devcluster.slurm(["sinfo", "-h", "-n", "n2", "-o", "%T"]).stdout.strip() == "idle",
        timeout=20,
        what="n2 idle in Slurm",
    )
    assert list(n2.events.values_list("kind", flat=True)[:2]) == ["resume", "drain"]


@pytest.mark.nodes(0)
@pytest.mark.django_db
def test_wrong_expected_fingerprint_is_refused(
    devcluster: DevCluster, operator_api: APIClient
) -> None:
    wrong = "SHA256:" + "A" * 43
    response = operator_api.post(
        "/api/v1/clusters/register/",
        register_payload(devcluster, host_key_fingerprint=wrong),
        format="json",
    )
    assert response.status_code == 400
    body = response.json()
    assert devcluster.host_fingerprint in body["extra"]["fields"]["host_key_fingerprint"][0]
    assert not Cluster.objects.exists()


@pytest.mark.nodes(0)
@pytest.mark.django_db
def test_changed_host_key_puts_the_cluster_in_error_and_keeps_the_inventory(
    registered: Cluster,
) -> None:
    # Pretend we had pinned another key: the server's real key no longer matches.
    other = "AAAAC3NzaC1lZDI1NTE5AAAAIKgkN+1j2n5fW4cGqE5j2b1uJmM4N7kH1mT4wJv3xY9Z"
    registered.host_key_line = f"[127.0.0.1]:2222 ssh-ed25519 {other}"
    registered.host_key_fingerprint = "SHA256:" + "B" * 43
    registered.save()
    close_all()
    result = cluster_sync(cluster_id=registered.pk)
    assert not result.ok
    registered.refresh_from_db()
    assert registered.sync_status == "error"
    assert "Host key refused" in registered.last_sync_error
    assert registered.sync_failures == 1
    # Nothing already known is deleted or marked gone.
    assert Node.objects.filter(cluster=registered).exclude(state="gone").count() == 4
    close_all()


@pytest.mark.nodes(0)
@pytest.mark.django_db
def test_unreachable_port_and_bad_key_are_clear_refusals(
    devcluster: DevCluster, operator_api: APIClient
) -> None:
    closed = operator_api.post(
        "/api/v1/clusters/register/",
        register_payload(devcluster, ssh_port=1, host_key_fingerprint=""),
        format="json",
    )
    assert closed.status_code == 400
    assert "cannot reach 127.0.0.1:1" in closed.json()["message"]
    bad_key = operator_api.post(
        "/api/v1/clusters/register/",
        register_payload(devcluster, private_key="not a key"),
        format="json",
    )
    assert bad_key.status_code == 400
    assert "private_key" in bad_key.json()["extra"]["fields"]
    wrong_user = operator_api.post(
        "/api/v1/clusters/register/",
        register_payload(devcluster, ssh_user="nobody"),
        format="json",
    )
    assert wrong_user.status_code == 400
    assert "SSH login refused" in wrong_user.json()["message"]
    assert not Cluster.objects.exists()


@pytest.mark.nodes(0)
@pytest.mark.django_db(transaction=True)
def test_sync_now_runs_on_a_real_worker(
    registered: Cluster, operator_api: APIClient, tmp_path: Path, request: Any
) -> None:
    Cluster.objects.filter(pk=registered.pk).update(last_sync_at=None)
    worker = start_worker(
        database_url=database_url_for(connection.settings_dict), log_path=tmp_path / "worker.log"
    )
    request.addfinalizer(worker.stop)
    response = operator_api.post(f"/api/v1/clusters/{registered.pk}/sync/")
    assert response.status_code == 202
    wait_until(
        lambda: Cluster.objects.get(pk=registered.pk).last_sync_at is not None,
        timeout=60,
        what=lambda: f"the worker's sync; log:\n{worker.log()}",
    )
    assert Cluster.objects.get(pk=registered.pk).sync_status == "ok"


@pytest.mark.nodes(0)
@pytest.mark.django_db
def test_register_from_the_admin(devcluster: DevCluster, operator: Any, client: Any) -> None:
    close_all()
    client.force_login(operator)
    form = {
        "name": "devcluster",
        "description": "",
        "ssh_host": devcluster.host,
        "ssh_port": devcluster.port,
        "ssh_user": devcluster.user,
        "private_key": devcluster.key.read_text(),
        "expected_fingerprint": "SHA256:" + "C" * 43,
        "workdir": devcluster.workdir,
        "python": devcluster.python,
        "default_partition": "",
        "partitions-TOTAL_FORMS": "0",
        "partitions-INITIAL_FORMS": "0",
    }
    refused = client.post("/admin/nodes/cluster/add/", form)
    assert refused.status_code == 200
    assert devcluster.host_fingerprint in refused.content.decode()
    assert not Cluster.objects.exists()
    form["expected_fingerprint"] = devcluster.host_fingerprint
    accepted = client.post("/admin/nodes/cluster/add/", form)
    assert accepted.status_code == 302, accepted.content.decode()[:2000]
    cluster = Cluster.objects.get(name="devcluster")
    assert cluster.slurm_version.startswith("22.05")
    assert (
        "PRIVATE KEY"
        not in client.get(f"/admin/nodes/cluster/{cluster.pk}/change/").content.decode()
    )
