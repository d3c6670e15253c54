"""Every admin page renders for an operator, with real rows in it."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from core.audit import audit_event_record
from drills.models import RestoreDrill
from factories import (
    CheckpointFactory,
    GpuFactory,
    JobFactory,
    NodeFactory,
    PartitionFactory,
    SwitchFactory,
)
from jobs.models import JobEvent, MetricPoint
from nodes.models import Link, NodeEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def populated(operator: Any, researcher: Any) -> dict[str, Any]:
    switch = SwitchFactory(name="leaf1")
    node = NodeFactory(
        cluster=switch.cluster, name="n1", leaf_switch=switch, state="drained", reason="fan"
    )
    gpu_a = GpuFactory(node=node, index=0)
    gpu_b = GpuFactory(node=node, index=1)
    PartitionFactory(cluster=switch.cluster)
    Link.objects.create(
        cluster=switch.cluster,
        scope="intra_node",
        kind="nvlink",
        node=node,
        gpu_a=gpu_a,
        gpu_b=gpu_b,
    )
    Link.objects.create(
        cluster=switch.cluster, scope="node_switch", kind="infiniband", node=node, switch=switch
    )
    NodeEvent.objects.create(
        node=node, kind="state", from_state="idle", to_state="drained", message="fan"
    )
    job = JobFactory(
        owner=researcher, cluster=switch.cluster, name="llm-tiny", total_steps=100, last_step=40
    )
    JobEvent.objects.create(job=job, kind="state", from_state="queued", to_state="pending")
    MetricPoint.objects.create(job=job, step=1, wall_time=timezone.now(), loss=3.2)
    checkpoint = CheckpointFactory(job=job, step=100)
    RestoreDrill.objects.create(checkpoint=checkpoint, allocation={"nodes": 1}, allocation_key="n1")
    audit_event_record(actor=operator, action="node.drain", target=node, details={"reason": "fan"})
    from drills.models import DrillBudget, DrillPolicy

    DrillPolicy.objects.create(cluster=switch.cluster, enabled=True, running_every_hours=6)
    DrillBudget.objects.create(cluster=switch.cluster, max_active_drills=2)
    from core.models import ApiToken

    # Made directly, not by the service: the audit log test expects one event.
    ApiToken.objects.create(user=researcher, name="laptop", prefix="gty_abcd", key_hash="0" * 64)
    return {"node": node, "job": job}


def test_every_registered_model_lists_and_opens_for_an_operator(
    client: Client, operator: Any, populated: dict[str, Any]
) -> None:
    client.force_login(operator)
    assert client.get(reverse("admin:index")).status_code == 200
    for model in admin.site._registry:
        if model._meta.app_label not in {"core", "nodes", "jobs", "drills"}:
            continue
        info = (model._meta.app_label, model._meta.model_name)
        listing = client.get(reverse("admin:{}_{}_changelist".format(*info)))
        assert listing.status_code == 200, info
        obj = model.objects.first()
        assert obj is not None, f"fixture made no {info}"
        detail = client.get(reverse("admin:{}_{}_change".format(*info), args=[obj.pk]))
        assert detail.status_code == 200, info


def test_node_list_shows_operator_columns_and_links(
    client: Client, operator: Any, populated: dict[str, Any]
) -> None:
    client.force_login(operator)
    page = client.get(reverse("admin:nodes_node_changelist")).content.decode()
    assert "GPUs alloc/total" in page
    assert "0/2" in page  # two GPUs, none allocated
    assert "fan" in page  # the drain reason is a column
    assert reverse("admin:nodes_switch_change", args=[populated["node"].leaf_switch_id]) in page


def test_slurm_owned_fields_are_read_only(
    client: Client, operator: Any, populated: dict[str, Any]
) -> None:
    client.force_login(operator)
    page = client.get(
        reverse("admin:nodes_node_change", args=[populated["node"].pk])
    ).content.decode()
    # Read-only fields render as text, not as inputs.
    assert 'name="state"' not in page
    assert 'name="reason"' not in page


def test_audit_log_cannot_be_edited(
    client: Client, operator: Any, populated: dict[str, Any]
) -> None:
    client.force_login(operator)
    from core.models import AuditEvent

    event = AuditEvent.objects.get()
    page = client.get(reverse("admin:core_auditevent_change", args=[event.pk])).content.decode()
    assert 'name="action"' not in page
    assert client.get(reverse("admin:core_auditevent_add")).status_code == 403
    assert (
        client.post(
            reverse("admin:core_auditevent_delete", args=[event.pk]), {"post": "yes"}
        ).status_code
        == 403
    )
    assert AuditEvent.objects.filter(pk=event.pk).exists()


def test_researcher_is_kept_out_of_the_admin(client: Client, researcher: Any) -> None:
    client.force_login(researcher)
    response = client.get(reverse("admin:index"))
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]
