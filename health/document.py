"""The node probe's JSON document (``gantry-node-probe/1``, trainer/SCHEMA.md) → what the
evaluation needs. Pure. The document comes from a job on the node, so it is checked like
any other input: its shape, its sizes (each command's output at most
``MAX_INPUT_BYTES``), and every parse failure becomes a problem in words, never an
exception that loses the rest."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from health.parsers import (
    MAX_INPUT_BYTES,
    NvLinkState,
    ProbeParseError,
    SmiReport,
    Topology,
    XidEvent,
    parse_nvidia_smi,
    parse_nvlink_status,
    parse_topology,
    parse_xid_lines,
)
from trainer.schema import PROBE_SCHEMA

# The whole document as stored: its commands' outputs and a little more.
MAX_DOCUMENT_BYTES = 2 * MAX_INPUT_BYTES
STACK_FIELDS = ("python", "kernel", "torch", "torch_cuda", "nccl")


@dataclass
class ProbeContents:
    report: SmiReport | None = None
    topology: Topology | None = None
    links: tuple[NvLinkState, ...] = ()
    xids: tuple[XidEvent, ...] = ()
    stack: dict[str, Any] = field(default_factory=dict)
    boot_id: str = ""
    # What went wrong collecting or reading, in words (each makes the verdict unknown).
    problems: list[str] = field(default_factory=list)
    # What was missing but does not make the verdict unknown (no NVLink, dmesg refused).
    notes: list[str] = field(default_factory=list)


def document_problem(document: object) -> str | None:
    """Why the document cannot be read at all; None when its shape is right."""
    if not isinstance(document, Mapping):
        return "the probe document is not a JSON object"
    if document.get("schema") != PROBE_SCHEMA:
        return f"the probe document's schema is {document.get('schema')!r}, not {PROBE_SCHEMA}"
    try:
        size = len(json.dumps(document))
    except (TypeError, ValueError):
        return "the probe document is not plain JSON"
    if size > MAX_DOCUMENT_BYTES:
        return f"the probe document is larger than {MAX_DOCUMENT_BYTES} bytes"
    if not isinstance(document.get("commands"), Mapping):
        return "the probe document has no commands"
    return None


def _command(document: Mapping[str, Any], name: str) -> tuple[str | None, str | None]:
    """(stdout, problem): the command's output when it ran and succeeded."""
    command = document["commands"].get(name)
    if not isinstance(command, Mapping):
        return None, f"{name}: not run"
    error = command.get("error")
    if error:
        return None, f"{name}: {str(error)[:300]}"
    if command.get("exit_code") != 0:
        stderr = str(command.get("stderr") or "").strip().splitlines()
        tail = f": {stderr[-1][:200]}" if stderr else ""
        return None, f"{name}: exit code {command.get('exit_code')}{tail}"
    stdout = command.get("stdout")
    if not isinstance(stdout, str):
        return None, f"{name}: no output"
    if command.get("truncated"):
        return None, f"{name}: output cut at the probe's size limit"
    return stdout, None


def _stack(document: Mapping[str, Any], report: SmiReport | None) -> dict[str, Any]:
    raw = document.get("stack")
    raw = raw if isinstance(raw, Mapping) else {}
    stack: dict[str, Any] = {
        key: str(raw[key])[:128] for key in STACK_FIELDS if raw.get(key) not in (None, "")
    }
    if report is not None:
        if report.driver_version:
            stack["driver"] = report.driver_version
        if report.cuda_version:
            stack["cuda"] = report.cuda_version
    packages = raw.get("packages")
    if isinstance(packages, Mapping):
        stack["packages"] = {
            str(name)[:128]: str(version)[:64] for name, version in list(packages.items())[:2000]
        }
    return stack


def read_probe(document: object) -> ProbeContents:
    """Everything the evaluation needs from a probe document, and what went wrong."""
    contents = ProbeContents()
    problem = document_problem(document)
    if problem is not None:
        contents.problems.append(problem)
        return contents
    assert isinstance(document, Mapping)
    contents.boot_id = str(document.get("boot_id") or "")[:64]
    smi, problem = _command(document, "nvidia_smi")
    if problem:
        contents.problems.append(problem)
    elif smi is not None:
        try:
            contents.report = parse_nvidia_smi(smi)
        except ProbeParseError as error:
            contents.problems.append(str(error))
    _read_optional(document, contents)
    contents.stack = _stack(document, contents.report)
    return contents


def _read_optional(document: Mapping[str, Any], contents: ProbeContents) -> None:
    """Topology, NVLink and the kernel log: their absence is a note, not an unknown."""
    for name in ("topology", "nvlink", "kernel_log"):
        output, problem = _command(document, name)
        if output is None:
            if problem:
                contents.notes.append(
                    f"XIDs not read ({problem})" if name == "kernel_log" else problem
                )
            continue
        try:
            if name == "topology":
                contents.topology = parse_topology(output)
            elif name == "nvlink":
                contents.links = parse_nvlink_status(output)
            else:
                contents.xids = parse_xid_lines(output)
        except ProbeParseError as error:
            contents.notes.append(str(error))
