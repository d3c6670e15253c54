"""The evaluation table (health/evaluate.py's docstring): each fault case gives its state
and action; the healthy recorded machines are ok; missing data is unknown, never ok."""

from __future__ import annotations

from pathlib import Path

import pytest

from health.evaluate import State, evaluate_node, strongest_action, worst_state
from health.parsers import (
    parse_nvidia_smi,
    parse_nvlink_status,
    parse_topology,
    parse_xid_lines,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def read_fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    "smi", ["a100/nvidia-smi-q-x.xml", "h100/nvidia-smi-q.txt", "derived/a100-2gpu-healthy.xml"]
)
def test_healthy_recorded_machines_are_ok(smi: str) -> None:
    verdict = evaluate_node(
        report=parse_nvidia_smi(read_fixture(smi)),
        topology=parse_topology(read_fixture("h100/topo-m.txt")),
        links=parse_nvlink_status(read_fixture("h800/nvlink-status.txt"))[:0],
    )
    assert (verdict.state, verdict.action, verdict.reasons) == (State.OK, "none", ())
    assert all(gpu.state == State.OK for gpu in verdict.gpus)


@pytest.mark.parametrize(
    ("smi", "state", "action", "words"),
    [
        ("derived/a100-ecc-uncorrectable.xml", State.CRITICAL, "reset_gpu", "uncorrectable ECC"),
        ("derived/h100-remap-pending.txt", State.WARNING, "reset_gpu", "row remapping pending"),
        ("derived/h100-remap-failure.txt", State.CRITICAL, "service", "row remapping failed"),
        ("derived/a100-thermal.xml", State.WARNING, "watch", "thermal slowdown"),
        ("derived/a100-recovery-reset.xml", State.CRITICAL, "reset_gpu", "GPU reset"),
        ("derived/h100-pcie-x8.txt", State.WARNING, "watch", "x8, below its x16"),
    ],
)
def test_fault_cases(smi: str, state: str, action: str, words: str) -> None:
    verdict = evaluate_node(report=parse_nvidia_smi(read_fixture(smi)))
    assert (verdict.state, verdict.action) == (state, action)
    faulty, healthy = verdict.gpus
    assert faulty.state == state and any(words in reason for reason in faulty.reasons)
    # The edit was on GPU 0 only: GPU 1 of the same machine stays ok.
    assert healthy.state == State.OK
    assert any(reason.startswith("GPU 0: ") and words in reason for reason in verdict.reasons)


def test_xid_79_is_critical_and_asks_for_a_reboot() -> None:
    report = parse_nvidia_smi(read_fixture("derived/h100-remap-pending.txt").replace("Yes", "No"))
    xids = parse_xid_lines(read_fixture("derived/dmesg-xid79.txt"))
    verdict = evaluate_node(report=report, xids=xids)
    assert (verdict.state, verdict.action) == (State.CRITICAL, "reboot")
    assert (
        verdict.gpus[0].state == State.CRITICAL
        and "fallen off the bus" in verdict.gpus[0].reasons[0]
    )
    assert verdict.gpus[1].state == State.OK


@pytest.mark.parametrize(
    ("code", "state", "action"),
    [
        (48, "critical", "reset_gpu"),
        (63, "critical", "reset_gpu"),
        (64, "critical", "service"),
        (74, "critical", "reset_gpu"),
        (94, "critical", "reset_gpu"),
        (95, "critical", "reset_gpu"),
        (119, "critical", "reboot"),
        (92, "warning", "watch"),
        (13, "ok", "none"),
    ],
)
def test_xid_table(code: int, state: str, action: str) -> None:
    report = parse_nvidia_smi(read_fixture("h100/nvidia-smi-q.txt"))
    xids = parse_xid_lines(f"[ 5.0] NVRM: Xid (PCI:0000:19:00): {code}, pid=1, something")
    verdict = evaluate_node(report=report, xids=xids)
    assert (verdict.state, verdict.action) == (state, action)


def test_xid_of_a_gpu_nvidia_smi_no_longer_lists_is_critical() -> None:
    report = parse_nvidia_smi(read_fixture("h100/nvidia-smi-q.txt"))
    xids = parse_xid_lines("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.")
    verdict = evaluate_node(report=report, xids=xids, inventory_gpus=2)
    assert (verdict.state, verdict.action) == (State.CRITICAL, "reboot")
    assert any("no longer lists" in reason for reason in verdict.reasons)
    assert any("1 GPU(s) visible, the inventory says 2" in reason for reason in verdict.reasons)


def test_nvlink_down_is_critical() -> None:
    text = read_fixture("h100/nvidia-smi-q.txt")
    verdict = evaluate_node(
        report=parse_nvidia_smi(text),
        links=parse_nvlink_status(read_fixture("derived/h800-nvlink-down.txt")),
    )
    assert (verdict.state, verdict.action) == (State.CRITICAL, "reset_gpu")
    assert verdict.gpus[0].readings["nvlinks"][3] == {"link": 3, "active": False, "speed": None}


def test_fewer_bonded_nvlinks_in_the_topology_is_a_warning() -> None:
    matrix = read_fixture("h100/topo-m.txt").replace("GPU0\t X \tNV18", "GPU0\t X \tNV16", 1)
    verdict = evaluate_node(
        report=parse_nvidia_smi(read_fixture("h100/nvidia-smi-q.txt")),
        topology=parse_topology(matrix),
    )
    assert verdict.state == State.WARNING
    assert any("GPU0–GPU1 NV16" in reason for reason in verdict.reasons)


def test_memory_short_of_its_peers_is_critical() -> None:
    text = read_fixture("derived/a100-2gpu-healthy.xml").replace(
        "<total>81920 MiB</total>", "<total>40960 MiB</total>", 1
    )
    verdict = evaluate_node(report=parse_nvidia_smi(text))
    assert (verdict.state, verdict.action) == (State.CRITICAL, "service")
    assert "expected about 81920 MiB" in verdict.gpus[0].reasons[0]


def test_fail_closed_probe_failure_and_missing_fields_are_unknown() -> None:
    failed = evaluate_node(report=None, problems=["nvidia_smi: exit code 9"])
    assert (failed.state, failed.reasons) == (State.UNKNOWN, ("nvidia_smi: exit code 9",))
    assert evaluate_node(report=None).state == State.UNKNOWN
    sparse = parse_nvidia_smi(
        '<nvidia_smi_log><gpu id="00000000:01:00.0"><product_name>NVIDIA H200</product_name>'
        "</gpu></nvidia_smi_log>"
    )
    verdict = evaluate_node(report=sparse)
    assert verdict.state == State.UNKNOWN
    assert "not reported: uuid, memory total, temperature, clock reasons" in verdict.gpus[0].reasons
    assert evaluate_node(report=parse_nvidia_smi("<nvidia_smi_log/>")).state == State.UNKNOWN


def test_combining_states_and_actions() -> None:
    assert worst_state(["ok", "warning", "unknown"]) == "unknown"
    assert worst_state(["unknown", "critical"]) == "critical"
    assert worst_state([]) == "ok"
    assert strongest_action(["watch", "service", "reset_gpu"]) == "service"
