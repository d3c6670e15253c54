"""``nvidia-smi -q -x`` (XML) and ``nvidia-smi -q`` (text) → per-GPU readings. Pure.

Both formats become one element tree (the text format's labels are turned into the XML
format's tag names where they differ), so one reader serves both; drivers rename fields
between releases (``clocks_throttle_reasons`` → ``clocks_event_reasons``, ``power_readings``
→ ``gpu_power_readings``, ``power_draw`` → ``instant_power_draw``), so every field is
looked up under each name it has had. Anything missing, ``N/A`` or malformed reads as None
(the evaluation then says "unknown", never "ok"). Input over ``MAX_INPUT_BYTES`` is refused.

XML safety: no DTD processing. nvidia-smi's own ``<!DOCTYPE nvidia_smi_log SYSTEM "...">``
line (no internal subset) is removed first; any other DOCTYPE or ENTITY declaration is
refused, so no entity can be declared (and expat never fetches an external DTD).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from health.parsers.common import (
    ProbeParseError,
    check_size,
    clean,
    integer,
    number,
    yes_no,
)

_OWN_DOCTYPE = re.compile(r"<!DOCTYPE\s+nvidia_smi_log\s+SYSTEM\s+\"[^\"<>\[\]]*\"\s*>")
_TEXT_HEADER = "==============NVSMI LOG=============="
_TEXT_GPU = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_TEXT_LINE = re.compile(r"^(\s*)([^:]+?)\s*(?::\s?(.*))?$")

# Text labels whose XML tag is not their lower_snake_case form.
_TEXT_TAGS = {
    "gpu_uuid": "uuid",
    "serial_number": "serial",
    "bus_id": "pci_bus_id",
    "gpu_current_temp": "gpu_temp",
    "gpu_slowdown_temp": "gpu_temp_slow_threshold",
    "gpu_link_info": "pci_gpu_link_info",
    "pcie_generation": "pcie_gen",
    "link_width": "link_widths",
    "ecc_mode": "ecc_mode",
    "sm": "sm_clock",
    "memory": "mem_clock",
    "graphics": "graphics_clock",
    "idle": "gpu_idle",
    "display_clock_setting": "display_clocks_setting",
    "single_bit_ecc": "single_bit_retired",
    "double_bit_ecc": "double_bit_retired",
    "pending_page_blacklist": "pending_blacklist",
    "correctable_error": "remapped_row_corr",
    "uncorrectable_error": "remapped_row_unc",
    "pending": "remapped_row_pending",
    "remapping_failure_occurred": "remapped_row_failure",
    # Newer drivers (seen on an H200, 580.x): "Instantaneous Power Draw" is the XML's
    # <instant_power_draw>.
    "instantaneous_power_draw": "instant_power_draw",
}
# Throttle ("clocks event") reasons that mean the GPU is held back by heat or power.
SLOWDOWN_REASONS = (
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
)


@dataclass(frozen=True)
class GpuReading:
    """One GPU as nvidia-smi reported it; None: not reported or not applicable."""

    index: int
    pci_bus_id: str | None = None
    model: str | None = None
    uuid: str | None = None
    serial: str | None = None
    vbios: str | None = None
    mig_mode: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    temperature_c: float | None = None
    temperature_slowdown_c: float | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    mem_clock_mhz: int | None = None
    mem_clock_max_mhz: int | None = None
    # None: nvidia-smi listed no reasons at all; () none active.
    clock_reasons_active: tuple[str, ...] | None = None
    ecc_mode: str | None = None
    ecc_volatile_corrected: int | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_corrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    retired_single_bit: int | None = None
    retired_double_bit: int | None = None
    retired_pending: bool | None = None
    remapped_correctable: int | None = None
    remapped_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    # The driver's recommended recovery (``gpu_recovery_action``), "None" when none.
    recovery_action: str | None = None
    reset_required: bool | None = None
    drain_and_reset_recommended: bool | None = None
    fabric_state: str | None = None
    fabric_status: str | None = None


@dataclass(frozen=True)
class SmiReport:
    driver_version: str | None
    cuda_version: str | None
    gpus: tuple[GpuReading, ...] = field(default_factory=tuple)


def parse_nvidia_smi(text: str) -> SmiReport:
    """Either format of ``nvidia-smi -q``; raises ``ProbeParseError`` when it is neither."""
    check_size(text, "nvidia-smi output")
    stripped = text.lstrip()
    if stripped.startswith(("<?xml", "<!DOCTYPE", "<nvidia_smi_log")):
        root = _xml_root(text)
    elif stripped.startswith(_TEXT_HEADER):
        root = _text_root(text)
    else:
        raise ProbeParseError("nvidia-smi output: neither the XML nor the text query format")
    gpus = tuple(_gpu(index, element) for index, element in enumerate(root.findall("gpu")))
    return SmiReport(
        driver_version=clean(root.findtext("driver_version")),
        cuda_version=clean(root.findtext("cuda_version")),
        gpus=gpus,
    )


def _xml_root(text: str) -> ET.Element:
    body = _OWN_DOCTYPE.sub("", text, count=1)
    if "<!DOCTYPE" in body or "<!ENTITY" in body:
        raise ProbeParseError("nvidia-smi XML: a DOCTYPE or ENTITY declaration is refused")
    try:
        # Without a DOCTYPE nothing can declare an entity; expat fetches no external DTD.
        root = ET.fromstring(body)  # noqa: S314 - DOCTYPE/ENTITY refused just above
    except ET.ParseError as error:
        raise ProbeParseError(f"nvidia-smi XML: {error}") from None
    if root.tag != "nvidia_smi_log":
        raise ProbeParseError(f"nvidia-smi XML: root is <{root.tag}>, not <nvidia_smi_log>")
    return root


def _tag_of(label: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "_", label.strip().lower()).strip("_")
    return _TEXT_TAGS.get(slug, slug) or "_"


def _text_root(text: str) -> ET.Element:
    """The indented ``Label : value`` text as an element tree with the XML tag names."""
    root = ET.Element("nvidia_smi_log")
    stack: list[tuple[int, ET.Element]] = [(-1, root)]
    for raw in text.splitlines():
        if not raw.strip() or raw.startswith("=="):
            continue
        gpu = _TEXT_GPU.match(raw)
        if gpu:
            element = ET.SubElement(root, "gpu", id=gpu.group(1))
            stack = [(-1, root), (0, element)]
            continue
        line = _TEXT_LINE.match(raw.rstrip())
        if not line:
            continue
        indent = len(line.group(1).expandtabs(4))
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        element = ET.SubElement(stack[-1][1], _tag_of(line.group(2)))
        element.text = line.group(3)
        stack.append((indent, element))
    return root


def _first(element: ET.Element, *paths: str) -> str | None:
    """The first of ``paths`` under ``element`` that has a value (not N/A)."""
    for path in paths:
        found = element.find(path)
        if found is not None and clean(found.text) is not None:
            return found.text
    return None


def _sum_counts(elements: Iterable[ET.Element], *, uncorrectable: bool) -> int | None:
    total: int | None = None
    for element in elements:
        tag = element.tag
        if tag.endswith("_sources") or "threshold" in tag:
            continue
        is_unc = "uncorrectable" in tag or tag in {"double_bit"}
        is_corr = ("correctable" in tag and "uncorrectable" not in tag) or tag == "single_bit"
        if (uncorrectable and not is_unc) or (not uncorrectable and not is_corr):
            continue
        value = integer(element.text) if len(element) == 0 else integer(element.findtext("total"))
        if value is not None:
            total = (total or 0) + value
    return total


def _ecc(gpu: ET.Element) -> dict[str, Any]:
    readings: dict[str, Any] = {}
    for scope in ("volatile", "aggregate"):
        counters = gpu.find(f"ecc_errors/{scope}")
        children = list(counters) if counters is not None else []
        readings[f"ecc_{scope}_corrected"] = _sum_counts(children, uncorrectable=False)
        readings[f"ecc_{scope}_uncorrected"] = _sum_counts(children, uncorrectable=True)
    return readings


def _clock_reasons(gpu: ET.Element) -> tuple[str, ...] | None:
    block = gpu.find("clocks_event_reasons")
    if block is None:
        block = gpu.find("clocks_throttle_reasons")
    if block is None:
        return None
    active: list[str] = []
    seen = False
    for element in block.iter():
        if element is block:
            continue
        state = yes_no(element.text)
        if state is None:
            continue
        seen = True
        name = re.sub(r"^clocks?_(event|throttle)_reasons?_", "", element.tag)
        if state and name not in active:
            active.append(name)
    return tuple(active) if seen else None


def _width(value: str | None) -> int | None:
    return integer((value or "").replace("x", "")) if value else None


def _pcie(gpu: ET.Element) -> dict[str, Any]:
    link = "pci/pci_gpu_link_info"
    return {
        "pcie_gen_current": integer(
            _first(gpu, f"{link}/pcie_gen/current_link_gen", f"{link}/pcie_gen/current")
        ),
        "pcie_gen_max": integer(
            _first(gpu, f"{link}/pcie_gen/max_link_gen", f"{link}/pcie_gen/max")
        ),
        "pcie_width_current": _width(
            _first(gpu, f"{link}/link_widths/current_link_width", f"{link}/link_widths/current")
        ),
        "pcie_width_max": _width(
            _first(gpu, f"{link}/link_widths/max_link_width", f"{link}/link_widths/max")
        ),
    }


def _retired_and_remapped(gpu: ET.Element) -> dict[str, Any]:
    pages = "retired_pages"
    return {
        "retired_single_bit": integer(
            _first(
                gpu,
                f"{pages}/multiple_single_bit_retirement/retired_count",
                f"{pages}/single_bit_retired",
            )
        ),
        "retired_double_bit": integer(
            _first(
                gpu, f"{pages}/double_bit_retirement/retired_count", f"{pages}/double_bit_retired"
            )
        ),
        "retired_pending": yes_no(
            _first(gpu, f"{pages}/pending_retirement", f"{pages}/pending_blacklist")
        ),
        "remapped_correctable": integer(_first(gpu, "remapped_rows/remapped_row_corr")),
        "remapped_uncorrectable": integer(_first(gpu, "remapped_rows/remapped_row_unc")),
        "remap_pending": yes_no(_first(gpu, "remapped_rows/remapped_row_pending")),
        "remap_failure": yes_no(_first(gpu, "remapped_rows/remapped_row_failure")),
    }


def _power(gpu: ET.Element) -> dict[str, Any]:
    blocks = ("gpu_power_readings", "power_readings")
    draw = [
        f"{b}/{name}"
        for b in blocks
        for name in ("power_draw", "instant_power_draw", "average_power_draw")
    ]
    limit = [
        f"{b}/{name}"
        for b in blocks
        for name in ("current_power_limit", "enforced_power_limit", "power_limit")
    ]
    return {
        "power_draw_w": number(_first(gpu, *draw)),
        "power_limit_w": number(_first(gpu, *limit)),
    }


def _gpu(index: int, gpu: ET.Element) -> GpuReading:
    recovery = gpu.findtext("gpu_recovery_action")
    return GpuReading(
        index=index,
        pci_bus_id=clean(gpu.get("id")) or clean(gpu.findtext("pci/pci_bus_id")),
        model=clean(gpu.findtext("product_name")),
        uuid=clean(gpu.findtext("uuid")),
        serial=clean(gpu.findtext("serial")),
        vbios=clean(gpu.findtext("vbios_version")),
        mig_mode=clean(_first(gpu, "mig_mode/current_mig", "mig_mode/current")),
        memory_total_mib=integer(_first(gpu, "fb_memory_usage/total")),
        memory_used_mib=integer(_first(gpu, "fb_memory_usage/used")),
        temperature_c=number(_first(gpu, "temperature/gpu_temp")),
        temperature_slowdown_c=number(_first(gpu, "temperature/gpu_temp_slow_threshold")),
        sm_clock_mhz=integer(_first(gpu, "clocks/sm_clock")),
        sm_clock_max_mhz=integer(_first(gpu, "max_clocks/sm_clock")),
        mem_clock_mhz=integer(_first(gpu, "clocks/mem_clock")),
        mem_clock_max_mhz=integer(_first(gpu, "max_clocks/mem_clock")),
        clock_reasons_active=_clock_reasons(gpu),
        ecc_mode=clean(_first(gpu, "ecc_mode/current_ecc", "ecc_mode/current")),
        recovery_action=recovery.strip() if recovery and recovery.strip() else None,
        reset_required=yes_no(_first(gpu, "gpu_reset_status/reset_required")),
        drain_and_reset_recommended=yes_no(
            _first(gpu, "gpu_reset_status/drain_and_reset_recommended")
        ),
        fabric_state=clean(_first(gpu, "fabric/state")),
        fabric_status=clean(_first(gpu, "fabric/status")),
        **_power(gpu),
        **_ecc(gpu),
        **_pcie(gpu),
        **_retired_and_remapped(gpu),
    )
