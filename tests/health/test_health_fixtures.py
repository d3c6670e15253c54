"""Every recorded output under fixtures/ parses with sane values: dropping a new machine's
files into a folder (e.g. fixtures/h200/) is all it takes to have them checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from health.evaluate import State, evaluate_node
from health.parsers import (
    parse_nvidia_smi,
    parse_nvlink_status,
    parse_topology,
    parse_xid_lines,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _files(*patterns: str) -> list[Path]:
    found = sorted({path for pattern in patterns for path in FIXTURES.rglob(pattern)})
    return found


QUERIES = _files("*.xml", "nvidia-smi-q*.txt", "*-q*.txt", "h100-*.txt")
QUERIES = [path for path in QUERIES if "nvlink" not in path.name and "dmesg" not in path.name]
TOPOLOGIES = _files("topo-m*.txt")
NVLINKS = _files("nvlink-status*.txt", "*nvlink-down*.txt")
KERNEL_LOGS = _files("dmesg*.txt")


def _id(path: Path) -> str:
    return str(path.relative_to(FIXTURES))


def test_the_fixture_sets_are_not_empty() -> None:
    assert len(QUERIES) >= 3 and TOPOLOGIES and NVLINKS and KERNEL_LOGS


@pytest.mark.parametrize("path", QUERIES, ids=_id)
def test_every_nvidia_smi_query_parses_with_sane_values(path: Path) -> None:
    report = parse_nvidia_smi(path.read_text())
    assert report.driver_version and report.driver_version[0].isdigit()
    assert report.cuda_version and report.cuda_version[0].isdigit()
    assert report.gpus, "no GPU read"
    for gpu in report.gpus:
        assert gpu.model and gpu.model.startswith("NVIDIA")
        assert gpu.uuid and gpu.uuid.startswith("GPU-")
        assert gpu.memory_total_mib and 8_000 < gpu.memory_total_mib < 300_000
        assert gpu.memory_used_mib is not None and 0 <= gpu.memory_used_mib <= gpu.memory_total_mib
        assert gpu.temperature_c is not None and 0 < gpu.temperature_c < 120
        assert gpu.power_draw_w is not None and 0 < gpu.power_draw_w <= (gpu.power_limit_w or 2000)
        assert gpu.sm_clock_max_mhz and 500 < gpu.sm_clock_max_mhz < 4000
        assert gpu.clock_reasons_active is not None
        assert gpu.pcie_width_max in {8, 16} and gpu.pcie_gen_max in {3, 4, 5, 6}
    # Whatever it says, the verdict is one of the four states, never an exception.
    assert evaluate_node(report=report).state in State.ALL


@pytest.mark.parametrize("path", TOPOLOGIES, ids=_id)
def test_every_topology_parses(path: Path) -> None:
    topology = parse_topology(path.read_text())
    count = len(topology.gpus)
    # A one-GPU machine (the H200 recorded here) has a one-row matrix and no pairs.
    assert count >= 1
    assert len(topology.pairs) == count * (count - 1) // 2
    assert all(topology.nvlink_count(a, b) is not None for a, b in topology.pairs)


@pytest.mark.parametrize("path", NVLINKS, ids=_id)
def test_every_nvlink_status_parses(path: Path) -> None:
    links = parse_nvlink_status(path.read_text())
    assert links and all(link.link >= 0 for link in links)
    assert all(link.speed for link in links if link.active)


@pytest.mark.parametrize("path", KERNEL_LOGS, ids=_id)
def test_every_kernel_log_reads(path: Path) -> None:
    for event in parse_xid_lines(path.read_text()):
        assert event.code > 0 and event.message
