"""``nvidia-smi topo -m``, ``nvidia-smi nvlink -s`` and kernel-log XID lines. Pure.

- ``topo -m``: the GPU rows of the matrix → for each GPU pair the connection (``NV18``,
  ``PIX``, ``SYS``, ...); NICs and the affinity columns are kept as far as they read.
- ``nvlink -s``: per GPU, each link's speed or ``<inactive>``.
- XID: ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.`` → the PCI
  address (domain, bus, device), the code and the message; other lines are skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from health.parsers.common import ProbeParseError, check_size

_GPU_NAME = re.compile(r"^GPU(\d+)$")
_NV = re.compile(r"^NV(\d+)$")
_NVLINK_GPU = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: (GPU-[0-9a-fA-F-]+)\))?\s*$")
_NVLINK_LINK = re.compile(r"^\s+Link (\d+): (.+?)\s*$")
_XID = re.compile(
    r"NVRM: Xid \(PCI:(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.\d)?\): "
    r"(\d+),\s*(.*)$"
)
_DMESG_TIME = re.compile(r"^\s*\[\s*([0-9.]+)\]")
MAX_XID_EVENTS = 500


@dataclass(frozen=True)
class Topology:
    gpus: tuple[str, ...]
    # (GPUa, GPUb) with a < b in GPU order → "NV18", "PIX", "SYS", ...
    pairs: dict[tuple[str, str], str] = field(default_factory=dict)
    nics: tuple[str, ...] = ()
    cpu_affinity: dict[str, str] = field(default_factory=dict)

    def nvlink_count(self, a: str, b: str) -> int | None:
        """Bonded NVLinks between two GPUs; 0 when they connect otherwise; None unknown."""
        key = (a, b) if (a, b) in self.pairs else (b, a)
        connection = self.pairs.get(key)
        if connection is None:
            return None
        match = _NV.match(connection)
        return int(match.group(1)) if match else 0


@dataclass(frozen=True)
class NvLinkState:
    gpu_index: int
    uuid: str | None
    link: int
    active: bool
    speed: str | None


@dataclass(frozen=True)
class XidEvent:
    pci_domain: int
    pci_bus: int
    pci_device: int
    code: int
    message: str
    # Seconds since boot from dmesg's ``[ 123.4]`` prefix, when the line had one.
    uptime_s: float | None = None

    @property
    def pci_key(self) -> tuple[int, int, int]:
        return (self.pci_domain, self.pci_bus, self.pci_device)


def parse_topology(text: str) -> Topology:
    """The matrix of ``nvidia-smi topo -m``; raises ``ProbeParseError`` without one."""
    check_size(text, "nvidia-smi topo -m output")
    lines = [line.rstrip("\n") for line in text.splitlines()]
    header_at = next(
        (
            i
            for i, line in enumerate(lines)
            if re.match(r"^\s*GPU0(\s|$)", line.replace("\x1b[4m", ""))
        ),
        None,
    )
    if header_at is None:
        raise ProbeParseError("nvidia-smi topo -m output: no GPU0 header")
    header = re.split(
        r"\t+|\s{2,}", lines[header_at].replace("\x1b[4m", "").replace("\x1b[0m", "").strip()
    )
    columns = [name for name in header if _GPU_NAME.match(name) or name.startswith(("NIC", "mlx"))]
    gpus = tuple(name for name in columns if _GPU_NAME.match(name))
    pairs: dict[tuple[str, str], str] = {}
    affinity: dict[str, str] = {}
    for line in lines[header_at + 1 :]:
        if not line.strip() or line.startswith("Legend"):
            break
        cells = [cell.strip() for cell in re.split(r"\t|\s{2,}", line.strip())]
        row = cells[0] if cells else ""
        if not _GPU_NAME.match(row):
            continue
        values = cells[1 : 1 + len(columns)]
        for column, value in zip(columns, values, strict=False):
            if column in gpus and column != row and value and value != "X":
                a, b = sorted((row, column), key=lambda name: int(name[3:]))
                pairs.setdefault((a, b), value)
        rest = [cell for cell in cells[1 + len(columns) :] if cell]
        if rest:
            affinity[row] = rest[0]
    return Topology(
        gpus=gpus,
        pairs=pairs,
        nics=tuple(name for name in columns if name not in gpus),
        cpu_affinity=affinity,
    )


def parse_nvlink_status(text: str) -> tuple[NvLinkState, ...]:
    """``nvidia-smi nvlink -s``: every link of every GPU, active or not."""
    check_size(text, "nvidia-smi nvlink -s output")
    links: list[NvLinkState] = []
    gpu: tuple[int, str | None] | None = None
    for line in text.splitlines():
        head = _NVLINK_GPU.match(line)
        if head:
            gpu = (int(head.group(1)), head.group(3))
            continue
        link = _NVLINK_LINK.match(line)
        if link and gpu is not None:
            value = link.group(2)
            inactive = "inactive" in value.lower() or "down" in value.lower()
            links.append(
                NvLinkState(
                    gpu_index=gpu[0],
                    uuid=gpu[1],
                    link=int(link.group(1)),
                    active=not inactive,
                    speed=None if inactive else value,
                )
            )
    return tuple(links)


def parse_xid_lines(text: str) -> tuple[XidEvent, ...]:
    """Every ``NVRM: Xid`` line of a kernel log excerpt (at most ``MAX_XID_EVENTS``)."""
    check_size(text, "kernel log")
    events: list[XidEvent] = []
    for line in text.splitlines():
        match = _XID.search(line)
        if not match:
            continue
        when = _DMESG_TIME.match(line)
        events.append(
            XidEvent(
                pci_domain=int(match.group(1) or "0", 16),
                pci_bus=int(match.group(2), 16),
                pci_device=int(match.group(3), 16),
                code=int(match.group(4)),
                message=match.group(5).strip()[:300],
                uptime_s=float(when.group(1)) if when else None,
            )
        )
        if len(events) >= MAX_XID_EVENTS:
            break
    return tuple(events)


def pci_key(bus_id: str | None) -> tuple[int, int, int] | None:
    """``"00000000:3B:00.0"`` → (0, 0x3b, 0); None when it does not read as one."""
    if not bus_id:
        return None
    match = re.match(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})", bus_id.strip())
    if not match:
        return None
    return (int(match.group(1) or "0", 16), int(match.group(2), 16), int(match.group(3), 16))
