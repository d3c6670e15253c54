"""``probe_record``: stores the verdicts, sets the node's health state, and writes events
only when a state changes."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from factories import GpuFactory, NodeFactory
from health.models import GpuHealth, HealthEvent, NodeHealth, NodeProbe
from health.services import PROBES_KEPT, probe_record
from nodes.models import Node, NodeEvent

pytestmark = pytest.mark.django_db
NOW = datetime(2030, 5, 6, 12, 0, tzinfo=UTC)
Document = Callable[..., dict[str, Any]]


@pytest.fixture
def node() -> Node:
    node = NodeFactory(name="n1")
    GpuFactory(node=node, index=0)
    GpuFactory(node=node, index=1)
    return node


def test_a_healthy_probe_is_stored_and_marks_the_node_ok(node: Node, document: Document) -> None:
    health = probe_record(node=node, document=document(), now=NOW)
    assert (health.state, health.action) == ("ok", "none")
    assert health.stack["driver"] == "535.54.03" and health.stack["torch"] == "2.4.0"
    assert len(health.stack_fingerprint) == 16
    node.refresh_from_db()
    assert node.health_state == "ok"
    rows = list(GpuHealth.objects.filter(node=node).order_by("index"))
    assert [(row.index, row.state, row.model) for row in rows] == [
        (0, "ok", "NVIDIA A100-SXM4-80GB"),
        (1, "ok", "NVIDIA A100-SXM4-80GB"),
    ]
    assert rows[0].readings["memory_total_mib"] == 81920
    assert NodeProbe.objects.get(node=node).document["schema"] == "gantry-node-probe/1"


def test_events_only_on_change(node: Node, document: Document) -> None:
    probe_record(node=node, document=document(), now=NOW)
    first = set(HealthEvent.objects.values_list("gpu_index", "from_state", "to_state"))
    assert first == {(None, "unknown", "ok"), (0, "unknown", "ok"), (1, "unknown", "ok")}
    # The same verdict again: nothing new.
    probe_record(node=node, document=document(), now=NOW + timedelta(minutes=5))
    assert HealthEvent.objects.count() == 3
    # GPU 0 starts reporting uncorrectable ECC errors: one GPU event, one node event.
    faulty = document("derived/a100-ecc-uncorrectable.xml")
    health = probe_record(node=node, document=faulty, now=NOW + timedelta(minutes=10))
    assert (health.state, health.action) == ("critical", "reset_gpu")
    new = HealthEvent.objects.filter(at=NOW + timedelta(minutes=10))
    assert set(new.values_list("gpu_index", "from_state", "to_state")) == {
        (None, "ok", "critical"),
        (0, "ok", "critical"),
    }
    assert "uncorrectable ECC" in new.get(gpu_index=0).reason
    timeline = NodeEvent.objects.filter(node=node, kind="health").order_by("id").last()
    assert timeline is not None and (timeline.from_state, timeline.to_state) == ("ok", "critical")
    node.refresh_from_db()
    assert node.health_state == "critical"


def test_a_failed_probe_is_unknown_never_ok(node: Node, document: Document) -> None:
    probe_record(node=node, document=document(), now=NOW)
    failed = document(
        smi_command={
            "argv": ["nvidia-smi"],
            "exit_code": 9,
            "stdout": "",
            "stderr": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
            "seconds": 0.1,
            "error": None,
            "truncated": False,
        }
    )
    health = probe_record(node=node, document=failed, now=NOW + timedelta(minutes=5))
    assert health.state == "unknown"
    assert any("exit code 9" in reason and "NVIDIA driver" in reason for reason in health.reasons)
    # The GPUs it could not see are unknown too, with an event each.
    assert set(GpuHealth.objects.values_list("state", flat=True)) == {"unknown"}
    assert HealthEvent.objects.filter(to_state="unknown").count() == 3


@pytest.mark.parametrize(
    "bad",
    [None, "text", [], {"schema": "other/1", "commands": {}}, {"schema": "gantry-node-probe/1"}],
)
def test_malformed_documents_are_judged_unknown(node: Node, bad: Any) -> None:
    health = probe_record(node=node, document=bad, now=NOW)
    assert health.state == "unknown" and health.reasons
    assert NodeProbe.objects.get(node=node).parse_error


def test_missing_gpu_against_the_inventory_is_critical(node: Node, document: Document) -> None:
    GpuFactory(node=node, index=2)
    health = probe_record(node=node, document=document(), now=NOW)
    assert health.state == "critical" and health.action == "reboot"
    assert "2 GPU(s) visible, the inventory says 3" in health.reasons


def test_xid_79_from_the_kernel_log(node: Node, document: Document) -> None:
    doc = document("derived/h100-remap-failure.txt", kernel_log="derived/dmesg-xid79.txt")
    health = probe_record(node=node, document=doc, now=NOW)
    assert (health.state, health.action) == ("critical", "service")
    gpu0 = GpuHealth.objects.get(node=node, index=0)
    assert any("XID 79" in reason for reason in gpu0.reasons)


def test_only_the_newest_probes_are_kept(node: Node, document: Document) -> None:
    for minute in range(PROBES_KEPT + 3):
        probe_record(node=node, document=document(), now=NOW + timedelta(minutes=minute))
    assert NodeProbe.objects.filter(node=node).count() == PROBES_KEPT
    assert NodeHealth.objects.filter(node=node).count() == 1


def test_the_probe_recorded_on_a_real_h200_is_judged_ok() -> None:
    """The document ``python -m trainer probe`` printed on a lent one-GPU H200 machine
    (fixtures/h200/probe.json): parsed, judged and stored like any other."""
    import json
    from pathlib import Path

    recorded = json.loads((Path(__file__).parent / "fixtures" / "h200" / "probe.json").read_text())
    node = NodeFactory(name="h200-vm")
    GpuFactory(node=node, index=0, gpu_type="h200")
    health = probe_record(node=node, document=recorded, now=NOW)
    assert health.state == "ok", health.reasons
    assert health.stack["driver"] == "580.159.04" and health.stack["nccl"] == "2.28.9"
    row = GpuHealth.objects.get(node=node, index=0)
    assert row.model == "NVIDIA H200" and row.state == "ok"
    assert row.readings["memory_total_mib"] == 143771
