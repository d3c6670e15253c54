"""Pure parsers for what the node probe carries (``trainer/probe.py``): nvidia-smi's query
output (XML or text), its topology matrix and NVLink status, and kernel-log XID lines.
No Django, no I/O; every input is bounded (``MAX_INPUT_BYTES``) and malformed or missing
fields read as None."""

from health.parsers.common import MAX_INPUT_BYTES, ProbeParseError
from health.parsers.links import (
    NvLinkState,
    Topology,
    XidEvent,
    parse_nvlink_status,
    parse_topology,
    parse_xid_lines,
    pci_key,
)
from health.parsers.smi import SLOWDOWN_REASONS, GpuReading, SmiReport, parse_nvidia_smi

__all__ = [
    "MAX_INPUT_BYTES",
    "SLOWDOWN_REASONS",
    "GpuReading",
    "NvLinkState",
    "ProbeParseError",
    "SmiReport",
    "Topology",
    "XidEvent",
    "parse_nvidia_smi",
    "parse_nvlink_status",
    "parse_topology",
    "parse_xid_lines",
    "pci_key",
]
