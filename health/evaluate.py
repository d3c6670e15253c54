"""Health verdicts from parsed probe readings: per GPU and per node a state (ok, warning,
critical, unknown), the reasons in words and one action from the remediation ladder. Pure.

The ladder, mildest first: ``none`` → ``watch`` → ``drain`` → ``reset_gpu`` → ``reboot`` →
``service`` (RMA / vendor). A GPU's action is the strongest its findings ask for; a node's
is the strongest of its GPUs' and its own. States combine worst first: critical, unknown,
warning, ok. Fail closed: a GPU is "ok" only when the fields below were read and none fired;
a probe that failed, output that did not parse, or a missing field makes it "unknown".

| finding (per GPU)                                                 | state    | action    |
|-------------------------------------------------------------------|----------|-----------|
| XID 79 (fallen off the bus), 119/120 (GSP firmware)               | critical | reboot    |
| XID 48, 63, 74, 94, 95 (DBE, row remap event, NVLink, ECC)        | critical | reset_gpu |
| XID 64 (row remapping failure)                                    | critical | service   |
| XID 92 (high single-bit ECC rate), any other non-application XID  | warning  | watch     |
| XID 13, 31, 43, 45 (application faults)                           | ignored  |           |
| driver recovery action Reset, Drain and Reset                     | critical | reset_gpu |
| driver recovery action Reboot / Drain P2P                         | critical | reboot / drain |
| volatile uncorrectable ECC > 0                                    | critical | reset_gpu |
| aggregate uncorrectable ECC > 0 (volatile 0)                      | warning  | watch     |
| row remapping failure                                             | critical | service   |
| row remap pending / page retirement pending / reset required      | warning  | reset_gpu |
| retired double-bit pages > 0                                      | warning  | watch     |
| thermal or power-brake slowdown active, temp ≥ slowdown threshold | warning  | watch     |
| NVLink link inactive (``nvidia-smi nvlink -s``)                   | critical | reset_gpu |
| NVLink fabric registration not successful                         | critical | drain     |
| PCIe width below max; gen below max while the GPU is not idle     | warning  | watch     |
| ECC disabled                                                      | warning  | watch     |
| memory total < 95% of its same-model peers or the inventory       | critical | service   |
| uuid, memory, temperature or clock reasons not reported           | unknown  | watch     |

| finding (per node)                                                | state    | action    |
|-------------------------------------------------------------------|----------|-----------|
| nvidia-smi failed, timed out or its output did not parse          | unknown  | watch     |
| fewer GPUs than the inventory (Slurm) says                        | critical | reboot    |
| a GPU pair with fewer bonded NVLinks than the node's usual pair   | warning  | watch     |
| XID on a PCI address of no listed GPU                             | critical | reboot    |

XIDs are those in the kernel log of the current boot, so a GPU stays critical until the
node reboots (or an operator clears it by a reboot): a reset GPU that logged XID 79 is
still suspect. A software power cap (``sw_power_cap``) and idle clocks are normal and
not findings.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from health.parsers import (
    SLOWDOWN_REASONS,
    GpuReading,
    NvLinkState,
    SmiReport,
    Topology,
    XidEvent,
    pci_key,
)


class State:
    OK = "ok"
    WARNING = "warning"
    CRITICAL = "critical"
    UNKNOWN = "unknown"

    ALL = (OK, WARNING, CRITICAL, UNKNOWN)
    # Worst first, for combining.
    SEVERITY = {CRITICAL: 3, UNKNOWN: 2, WARNING: 1, OK: 0}


ACTIONS = ("none", "watch", "drain", "reset_gpu", "reboot", "service")
ACTION_WORDS = {
    "none": "nothing to do",
    "watch": "keep watching",
    "drain": "drain the node",
    "reset_gpu": "drain, then reset the GPU",
    "reboot": "drain, then reboot the node",
    "service": "drain and send for service (RMA)",
}

XID_REBOOT = {79: "GPU has fallen off the bus", 119: "GSP RPC timeout", 120: "GSP error"}
XID_RESET = {
    48: "double-bit ECC error",
    63: "row remapping event (ECC page retirement)",
    74: "NVLink error",
    94: "contained ECC error",
    95: "uncontained ECC error",
}
XID_SERVICE = {64: "row remapping failure"}
XID_APPLICATION = {13, 31, 43, 45}
RECOVERY_ACTIONS = {
    "none": None,
    "reset": ("reset_gpu", "the driver asks for a GPU reset"),
    "gpu reset": ("reset_gpu", "the driver asks for a GPU reset"),
    "drain and reset": ("reset_gpu", "the driver asks to drain and reset the GPU"),
    "reboot": ("reboot", "the driver asks for a node reboot"),
    "node reboot": ("reboot", "the driver asks for a node reboot"),
    "drain p2p": ("drain", "the driver asks to drain peer-to-peer traffic"),
}
MEMORY_SHORT_RATIO = 0.95
# What the pages show of a GPU besides the clock reasons and NVLinks.
READING_KEYS = (
    "pci_bus_id",
    "memory_total_mib",
    "memory_used_mib",
    "temperature_c",
    "power_draw_w",
    "power_limit_w",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "mem_clock_mhz",
    "ecc_mode",
    "ecc_volatile_corrected",
    "ecc_volatile_uncorrected",
    "ecc_aggregate_corrected",
    "ecc_aggregate_uncorrected",
    "retired_single_bit",
    "retired_double_bit",
    "retired_pending",
    "remapped_correctable",
    "remapped_uncorrectable",
    "remap_pending",
    "remap_failure",
    "pcie_gen_current",
    "pcie_gen_max",
    "pcie_width_current",
    "pcie_width_max",
    "recovery_action",
    "vbios",
    "serial",
    "mig_mode",
)


@dataclass(frozen=True)
class Finding:
    state: str
    reason: str
    action: str


@dataclass(frozen=True)
class GpuVerdict:
    index: int
    uuid: str | None
    model: str | None
    state: str
    reasons: tuple[str, ...]
    action: str
    readings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeVerdict:
    state: str
    reasons: tuple[str, ...]
    action: str
    gpus: tuple[GpuVerdict, ...] = ()


def worst_state(states: Sequence[str]) -> str:
    return max(states, key=lambda s: State.SEVERITY.get(s, 2), default=State.OK)


def strongest_action(actions: Sequence[str]) -> str:
    return max(actions, key=lambda a: ACTIONS.index(a) if a in ACTIONS else 1, default="none")


def _xid_findings(xids: Sequence[XidEvent]) -> list[Finding]:
    findings = []
    for code in sorted({event.code for event in xids}):
        count = sum(1 for event in xids if event.code == code)
        seen = f"XID {code}" + (f" ×{count}" if count > 1 else "")
        if code in XID_REBOOT:
            findings.append(Finding(State.CRITICAL, f"{seen}: {XID_REBOOT[code]}", "reboot"))
        elif code in XID_RESET:
            findings.append(Finding(State.CRITICAL, f"{seen}: {XID_RESET[code]}", "reset_gpu"))
        elif code in XID_SERVICE:
            findings.append(Finding(State.CRITICAL, f"{seen}: {XID_SERVICE[code]}", "service"))
        elif code not in XID_APPLICATION:
            findings.append(Finding(State.WARNING, f"{seen} in the kernel log", "watch"))
    return findings


def _recovery_finding(gpu: GpuReading) -> list[Finding]:
    if gpu.recovery_action is None:
        return []
    key = gpu.recovery_action.strip().lower()
    if key in RECOVERY_ACTIONS:
        known = RECOVERY_ACTIONS[key]
        return [] if known is None else [Finding(State.CRITICAL, known[1], known[0])]
    if key in {"n/a", "[n/a]", "[not supported]"}:
        return []
    return [Finding(State.WARNING, f"unrecognised driver recovery action {key!r}", "drain")]


def _memory_findings(gpu: GpuReading) -> list[Finding]:
    findings = []
    if gpu.ecc_mode is not None and gpu.ecc_mode.lower() == "disabled":
        findings.append(Finding(State.WARNING, "ECC is disabled", "watch"))
    if gpu.ecc_volatile_uncorrected:
        findings.append(
            Finding(
                State.CRITICAL,
                f"{gpu.ecc_volatile_uncorrected} uncorrectable ECC error(s) since the last reset",
                "reset_gpu",
            )
        )
    elif gpu.ecc_aggregate_uncorrected:
        findings.append(
            Finding(
                State.WARNING,
                f"{gpu.ecc_aggregate_uncorrected} uncorrectable ECC error(s) in its lifetime",
                "watch",
            )
        )
    if gpu.remap_failure:
        findings.append(Finding(State.CRITICAL, "row remapping failed", "service"))
    if gpu.remap_pending:
        findings.append(
            Finding(State.WARNING, "row remapping pending (reset to apply)", "reset_gpu")
        )
    if gpu.retired_pending:
        findings.append(
            Finding(State.WARNING, "page retirement pending (reset to apply)", "reset_gpu")
        )
    if gpu.retired_double_bit:
        findings.append(
            Finding(
                State.WARNING,
                f"{gpu.retired_double_bit} page(s) retired for double-bit ECC",
                "watch",
            )
        )
    if gpu.reset_required:
        findings.append(Finding(State.WARNING, "the driver says a reset is required", "reset_gpu"))
    return findings


def _thermal_and_link_findings(gpu: GpuReading, links: Sequence[NvLinkState]) -> list[Finding]:
    findings = []
    active = gpu.clock_reasons_active or ()
    slowdowns = [reason for reason in active if reason in SLOWDOWN_REASONS]
    if slowdowns:
        findings.append(
            Finding(
                State.WARNING,
                "clocks held back: " + ", ".join(slowdowns).replace("_", " "),
                "watch",
            )
        )
    if (
        gpu.temperature_c is not None
        and gpu.temperature_slowdown_c is not None
        and gpu.temperature_c >= gpu.temperature_slowdown_c
    ):
        findings.append(
            Finding(
                State.WARNING,
                f"{gpu.temperature_c:g} °C, at or above its slowdown temperature",
                "watch",
            )
        )
    down = sorted(link.link for link in links if not link.active)
    if down:
        findings.append(
            Finding(
                State.CRITICAL, f"NVLink link(s) {', '.join(map(str, down))} inactive", "reset_gpu"
            )
        )
    if gpu.fabric_state and gpu.fabric_state.lower() == "completed" and gpu.fabric_status:
        if gpu.fabric_status.lower() != "success":
            findings.append(
                Finding(State.CRITICAL, f"NVLink fabric registration: {gpu.fabric_status}", "drain")
            )
    if (
        gpu.pcie_width_current
        and gpu.pcie_width_max
        and gpu.pcie_width_current < gpu.pcie_width_max
    ):
        findings.append(
            Finding(
                State.WARNING,
                f"PCIe link x{gpu.pcie_width_current}, below its x{gpu.pcie_width_max}",
                "watch",
            )
        )
    idle = "gpu_idle" in active
    if (
        gpu.pcie_gen_current
        and gpu.pcie_gen_max
        and gpu.pcie_gen_current < gpu.pcie_gen_max
        and not idle
    ):
        findings.append(
            Finding(
                State.WARNING,
                f"PCIe gen {gpu.pcie_gen_current} under load, below its gen {gpu.pcie_gen_max}",
                "watch",
            )
        )
    return findings


def _missing_fields(gpu: GpuReading) -> list[Finding]:
    wanted = {
        "uuid": gpu.uuid,
        "memory total": gpu.memory_total_mib,
        "temperature": gpu.temperature_c,
        "clock reasons": gpu.clock_reasons_active,
    }
    if gpu.ecc_mode is not None and gpu.ecc_mode.lower() == "enabled":
        wanted["ECC counts"] = gpu.ecc_volatile_uncorrected
    missing = [name for name, value in wanted.items() if value is None]
    if not missing:
        return []
    return [Finding(State.UNKNOWN, "not reported: " + ", ".join(missing), "watch")]


def readings_of(gpu: GpuReading, links: Sequence[NvLinkState]) -> dict[str, Any]:
    """What the pages show of a GPU: the key readings, JSON-ready."""
    readings: dict[str, Any] = {key: getattr(gpu, key) for key in READING_KEYS}
    readings["clock_reasons_active"] = list(gpu.clock_reasons_active or ())
    readings["nvlinks"] = [
        {"link": link.link, "active": link.active, "speed": link.speed} for link in links
    ]
    return readings


def evaluate_gpu(
    gpu: GpuReading,
    *,
    xids: Sequence[XidEvent] = (),
    links: Sequence[NvLinkState] = (),
    memory_expected_mib: int | None = None,
) -> GpuVerdict:
    findings = [
        *_missing_fields(gpu),
        *_xid_findings(xids),
        *_recovery_finding(gpu),
        *_memory_findings(gpu),
        *_thermal_and_link_findings(gpu, links),
    ]
    if (
        memory_expected_mib
        and gpu.memory_total_mib is not None
        and gpu.memory_total_mib < MEMORY_SHORT_RATIO * memory_expected_mib
    ):
        findings.append(
            Finding(
                State.CRITICAL,
                f"{gpu.memory_total_mib} MiB memory, expected about {memory_expected_mib} MiB",
                "service",
            )
        )
    return GpuVerdict(
        index=gpu.index,
        uuid=gpu.uuid,
        model=gpu.model,
        state=worst_state([f.state for f in findings]),
        reasons=tuple(f.reason for f in findings),
        action=strongest_action([f.action for f in findings]),
        readings=readings_of(gpu, links),
    )


def _expected_memory(gpus: Sequence[GpuReading], inventory_mib: int | None) -> dict[int, int]:
    """Per GPU index: the memory its peers of the same model have (the most common)."""
    by_model: dict[str | None, Counter[int]] = {}
    for gpu in gpus:
        if gpu.memory_total_mib is not None:
            by_model.setdefault(gpu.model, Counter())[gpu.memory_total_mib] += 1
    expected = {}
    for gpu in gpus:
        usual = by_model.get(gpu.model)
        peers = max(usual, key=lambda m: (usual[m], m)) if usual else None
        expected[gpu.index] = max(filter(None, (peers, inventory_mib)), default=0)
    return expected


def _topology_findings(topology: Topology | None) -> list[Finding]:
    if topology is None or len(topology.gpus) < 2:
        return []
    counts = {
        pair: topology.nvlink_count(*pair) or 0
        for pair in topology.pairs
        if pair[0] in topology.gpus
    }
    nvlinked = [count for count in counts.values() if count > 0]
    if not nvlinked:
        return []
    usual = Counter(nvlinked).most_common(1)[0][0]
    short = sorted(f"{a}–{b} NV{count}" for (a, b), count in counts.items() if count < usual)
    if not short:
        return []
    return [
        Finding(
            State.WARNING,
            f"fewer bonded NVLinks than the usual NV{usual}: " + ", ".join(short[:8]),
            "watch",
        )
    ]


def evaluate_node(
    *,
    report: SmiReport | None,
    problems: Sequence[str] = (),
    xids: Sequence[XidEvent] = (),
    links: Sequence[NvLinkState] = (),
    topology: Topology | None = None,
    inventory_gpus: int | None = None,
    inventory_memory_mib: int | None = None,
) -> NodeVerdict:
    """The node's verdict. ``problems``: what went wrong collecting (probe failures, parse
    errors) in words; ``inventory_*``: what Slurm's inventory says the node holds."""
    findings = [Finding(State.UNKNOWN, problem, "watch") for problem in problems]
    if report is None:
        if not problems:
            findings.append(Finding(State.UNKNOWN, "no nvidia-smi report", "watch"))
        return _node(findings, ())
    expected = _expected_memory(report.gpus, inventory_memory_mib)
    by_pci = {pci_key(gpu.pci_bus_id): gpu.index for gpu in report.gpus}
    verdicts = []
    for gpu in report.gpus:
        key = pci_key(gpu.pci_bus_id)
        verdicts.append(
            evaluate_gpu(
                gpu,
                xids=[event for event in xids if key is not None and event.pci_key == key],
                links=[link for link in links if link.gpu_index == gpu.index],
                memory_expected_mib=expected.get(gpu.index) or None,
            )
        )
    orphans = [event for event in xids if event.pci_key not in by_pci]
    if orphans:
        codes = ", ".join(sorted({str(event.code) for event in orphans}))
        findings.append(
            Finding(State.CRITICAL, f"XID {codes} from a GPU nvidia-smi no longer lists", "reboot")
        )
    if inventory_gpus is not None and len(report.gpus) < inventory_gpus:
        findings.append(
            Finding(
                State.CRITICAL,
                f"{len(report.gpus)} GPU(s) visible, the inventory says {inventory_gpus}",
                "reboot",
            )
        )
    if not report.gpus and not inventory_gpus:
        findings.append(Finding(State.UNKNOWN, "nvidia-smi lists no GPU", "watch"))
    findings += _topology_findings(topology)
    return _node(findings, tuple(verdicts))


def _node(findings: list[Finding], gpus: tuple[GpuVerdict, ...]) -> NodeVerdict:
    states = [f.state for f in findings] + [gpu.state for gpu in gpus]
    reasons = [f.reason for f in findings] + [
        f"GPU {gpu.index}: {reason}" for gpu in gpus for reason in gpu.reasons
    ]
    actions = [f.action for f in findings] + [gpu.action for gpu in gpus]
    return NodeVerdict(
        state=worst_state(states),
        reasons=tuple(reasons),
        action=strongest_action(actions),
        gpus=gpus,
    )
