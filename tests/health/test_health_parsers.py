"""The parsers against recorded outputs: the values a person can check in the files, and
what they do with hostile or broken input."""

from __future__ import annotations

from pathlib import Path

import pytest

from health.parsers import (
    MAX_INPUT_BYTES,
    ProbeParseError,
    parse_nvidia_smi,
    parse_nvlink_status,
    parse_topology,
    parse_xid_lines,
    pci_key,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def read_fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_a100_xml_readings() -> None:
    report = parse_nvidia_smi(read_fixture("a100/nvidia-smi-q-x.xml"))
    assert (report.driver_version, report.cuda_version) == ("535.54.03", "12.2")
    (gpu,) = report.gpus
    assert gpu.model == "NVIDIA A100-SXM4-80GB"
    assert gpu.uuid == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert (gpu.memory_total_mib, gpu.memory_used_mib) == (81920, 50)
    assert (gpu.temperature_c, gpu.temperature_slowdown_c) == (27, 89)
    assert (gpu.power_draw_w, gpu.power_limit_w) == (67.03, 500.0)
    assert (gpu.sm_clock_mhz, gpu.sm_clock_max_mhz, gpu.mem_clock_mhz) == (1275, 1410, 1593)
    assert gpu.clock_reasons_active == ()
    assert (gpu.ecc_volatile_uncorrected, gpu.ecc_aggregate_corrected) == (0, 0)
    # MIG is on: the row remapper is not reported, so it reads None rather than 0.
    assert gpu.remap_pending is None and gpu.remapped_uncorrectable is None
    assert (gpu.pcie_gen_current, gpu.pcie_gen_max, gpu.pcie_width_current) == (4, 4, 16)
    assert gpu.reset_required is False


def test_h100_text_readings() -> None:
    report = parse_nvidia_smi(read_fixture("h100/nvidia-smi-q.txt"))
    assert (report.driver_version, report.cuda_version) == ("545.23.08", "12.3")
    (gpu,) = report.gpus
    assert gpu.model == "NVIDIA H100 80GB HBM3" and gpu.pci_bus_id == "00000000:19:00.0"
    assert gpu.uuid == "GPU-10f35015-e921-bfab-2eb8-4e9b6664d5f1"
    assert gpu.memory_total_mib == 81559 and gpu.power_limit_w == 700.0
    assert gpu.clock_reasons_active == ("gpu_idle",)
    assert (gpu.remapped_uncorrectable, gpu.remap_pending, gpu.remap_failure) == (0, False, False)
    assert (gpu.pcie_gen_current, gpu.pcie_gen_max) == (5, 5)
    assert (gpu.fabric_state, gpu.fabric_status) == ("Completed", "Success")
    # "Pending" under MIG Mode is not mistaken for the row remapper's.
    assert gpu.mig_mode == "Disabled"


def test_older_text_names_still_read() -> None:
    """H800 on driver 525: "Clocks Throttle Reasons", "Power Readings", ECC disabled."""
    (gpu,) = parse_nvidia_smi(read_fixture("h800/nvidia-smi-q.txt")).gpus
    assert gpu.clock_reasons_active == ("gpu_idle",)
    assert (gpu.power_draw_w, gpu.power_limit_w) == (74.71, 700.0)
    assert gpu.ecc_mode == "Disabled" and gpu.ecc_volatile_uncorrected is None
    assert gpu.temperature_slowdown_c == 89


def test_missing_and_na_fields_read_as_none_never_crash() -> None:
    xml = (
        '<?xml version="1.0" ?><nvidia_smi_log><driver_version>N/A</driver_version>'
        '<gpu id="00000000:01:00.0"><product_name>NVIDIA H200</product_name>'
        "<fb_memory_usage><total>garbage</total></fb_memory_usage>"
        "<temperature><gpu_temp>N/A</gpu_temp></temperature>"
        "<gpu_recovery_action>[Not Supported]</gpu_recovery_action></gpu></nvidia_smi_log>"
    )
    report = parse_nvidia_smi(xml)
    assert report.driver_version is None
    (gpu,) = report.gpus
    assert gpu.model == "NVIDIA H200"
    assert gpu.uuid is None and gpu.memory_total_mib is None and gpu.temperature_c is None
    assert gpu.clock_reasons_active is None and gpu.ecc_volatile_uncorrected is None


def test_newer_driver_power_and_recovery_fields() -> None:
    xml = (
        '<nvidia_smi_log><gpu id="00000000:01:00.0"><gpu_recovery_action>Drain and Reset'
        "</gpu_recovery_action><gpu_power_readings><instant_power_draw>512.5 W"
        "</instant_power_draw><current_power_limit>700.00 W</current_power_limit>"
        "</gpu_power_readings><ecc_errors><volatile><sram_correctable>1</sram_correctable>"
        "<sram_uncorrectable_parity>2</sram_uncorrectable_parity>"
        "<sram_uncorrectable_secded>3</sram_uncorrectable_secded>"
        "<dram_correctable>4</dram_correctable><dram_uncorrectable>5</dram_uncorrectable>"
        "</volatile></ecc_errors></gpu></nvidia_smi_log>"
    )
    (gpu,) = parse_nvidia_smi(xml).gpus
    assert gpu.recovery_action == "Drain and Reset"
    assert (gpu.power_draw_w, gpu.power_limit_w) == (512.5, 700.0)
    assert (gpu.ecc_volatile_corrected, gpu.ecc_volatile_uncorrected) == (5, 10)


@pytest.mark.parametrize(
    "hostile",
    [
        '<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]>'
        "<nvidia_smi_log><driver_version>&e;</driver_version></nvidia_smi_log>",
        '<?xml version="1.0"?><!DOCTYPE nvidia_smi_log [<!ENTITY a "aaaa">]>'
        "<nvidia_smi_log>&a;</nvidia_smi_log>",
        "<nvidia_smi_log><gpu>",
        "<html>not nvidia-smi</html>",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
    ],
)
def test_hostile_or_broken_input_is_refused_with_a_clear_error(hostile: str) -> None:
    with pytest.raises(ProbeParseError):
        parse_nvidia_smi(hostile)


def test_input_over_the_bound_is_refused_before_parsing() -> None:
    huge = "<nvidia_smi_log>" + " " * MAX_INPUT_BYTES + "</nvidia_smi_log>"
    with pytest.raises(ProbeParseError, match="larger than"):
        parse_nvidia_smi(huge)
    with pytest.raises(ProbeParseError, match="larger than"):
        parse_xid_lines("x" * (MAX_INPUT_BYTES + 1))


def test_nvidia_smis_own_doctype_is_accepted() -> None:
    assert parse_nvidia_smi(read_fixture("a100/nvidia-smi-q-x.xml")).gpus


def test_topology_h100_all_nv18() -> None:
    topology = parse_topology(read_fixture("h100/topo-m.txt"))
    assert topology.gpus == tuple(f"GPU{i}" for i in range(8))
    assert topology.nics == tuple(f"NIC{i}" for i in range(6))
    assert {topology.nvlink_count(a, b) for a, b in topology.pairs} == {18}


def test_topology_h800_space_separated_and_pcie_only_pairs() -> None:
    topology = parse_topology(read_fixture("h800/topo-m.txt"))
    assert topology.nvlink_count("GPU7", "GPU0") == 8
    pcie = parse_topology("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSYS\t0-1\nGPU1\tSYS\t X \t0-1\n")
    assert pcie.nvlink_count("GPU0", "GPU1") == 0
    with pytest.raises(ProbeParseError):
        parse_topology("No devices were found")


def test_nvlink_status_active_and_inactive() -> None:
    healthy = parse_nvlink_status(read_fixture("h800/nvlink-status.txt"))
    assert len(healthy) == 24 and all(link.active for link in healthy)
    down = parse_nvlink_status(read_fixture("derived/h800-nvlink-down.txt"))
    assert [(link.gpu_index, link.link) for link in down if not link.active] == [(0, 3)]


def test_xid_lines() -> None:
    (event,) = parse_xid_lines(read_fixture("derived/dmesg-xid79.txt"))
    assert (event.code, event.pci_key, event.uptime_s) == (79, (0, 0x19, 0), 1234.56789)
    assert "fallen off the bus" in event.message
    newer = "NVRM: Xid (PCI:0000:9c:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error"
    (dbe,) = parse_xid_lines(newer + "\nunrelated line\n")
    assert (dbe.code, dbe.pci_key) == (48, (0, 0x9C, 0))
    assert pci_key("00000000:9C:00.0") == dbe.pci_key
