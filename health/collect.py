"""Reading a cluster's probe files in ONE remote command, and checking the answer.

The health-check hook (``scripts/gantry-health-check``, Slurm's HealthCheckProgram) writes
``<health dir>/<node>.json`` as root on every node. Gantry reads them all at once on the
login node, as the cluster's service account: ``python -I -S -c <collect_program.py>`` (a
fixed program; the directory, the limits and the files already seen travel as JSON on
stdin, never in a shell), which answers every file's name, age and content (base64), or why
it was refused. Bounded: at most ``MAX_FILES`` files, ``MAX_FILE_BYTES`` each, and
``BUDGET_BYTES`` of content per answer (more waits for the next collection, ``deferred``);
files already recorded (same mtime and size) are answered ``unchanged`` without content.

The answer is checked defensively (``parse_answer``): its size, its shape, each name by the
node-name rule (an entry with another name is dropped and counted), each content no longer
than asked. Anything structurally wrong refuses the whole answer (``ProbeFilesError``).
Django-free.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from health.document import MAX_DOCUMENT_BYTES
from slurm.client import CommandRunner as ExecTransport
from slurm.errors import SlurmError

PROGRAM = (Path(__file__).resolve().parent / "collect_program.py").read_text()
# Files per collection (in name order), bytes per file, bytes of content per answer.
MAX_FILES = 4096
MAX_FILE_BYTES = MAX_DOCUMENT_BYTES
BUDGET_BYTES = 64 << 20
# What one entry's fixed part (name, times, error) may add to the answer.
ENTRY_SLACK_BYTES = 512
ANSWER_SLACK_BYTES = 4096
COMMAND_TIMEOUT_S = 60
# A node as the hook names its file: Slurm node names, conservatively (no path, no shell).
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_KEY = re.compile(r"[0-9]{1,24}:[0-9]{1,20}")
CODES = frozenset({"refused", "too_large"})
DIRECTORY_CODES = frozenset({"absent", "denied", "refused"})


class ProbeFilesError(SlurmError):
    """The collector's answer is not what its program writes, or the directory is unusable."""


@dataclass(frozen=True)
class ProbeFile:
    """One ``<node>.json``: its content (``data``), or ``unchanged``/``deferred``, or
    ``code`` and ``error`` (``refused``: a link, not a regular file, another owner;
    ``too_large``). ``age_s``: by the login node's clock."""

    node: str
    key: str = ""
    age_s: float | None = None
    data: bytes | None = None
    unchanged: bool = False
    deferred: bool = False
    code: str = ""
    error: str = ""


@dataclass
class ProbeFiles:
    files: dict[str, ProbeFile] = field(default_factory=dict)
    # Names that are not ``<node>.json`` (the program's count plus entries dropped here),
    # and files past ``MAX_FILES``.
    ignored: int = 0
    over_limit: int = 0
    answer_bytes: int = 0


def request_for(directory: str, known: Mapping[str, str]) -> dict[str, Any]:
    return {
        "directory": directory,
        "max_files": MAX_FILES,
        "max_bytes": MAX_FILE_BYTES,
        "budget": BUDGET_BYTES,
        "known": {name: key for name, key in known.items() if isinstance(key, str)},
    }


def answer_limit() -> int:
    return BUDGET_BYTES * 4 // 3 + ANSWER_SLACK_BYTES + ENTRY_SLACK_BYTES * MAX_FILES


def fetch_probe_files(
    transport: ExecTransport, *, python: str, directory: str, known: Mapping[str, str]
) -> ProbeFiles:
    """Run the program once over ``transport`` (the service account's login) and check its
    answer. Raises ``ProbeFilesError`` (or the transport's ``SlurmError``)."""
    request = json.dumps(request_for(directory, known)).encode()
    result = transport.exec(
        [python, "-I", "-S", "-c", PROGRAM], stdin=request, timeout=COMMAND_TIMEOUT_S
    )
    return parse_answer(result.stdout)


def _text(value: Any, limit: int = 300) -> str:
    if not isinstance(value, str):
        raise ProbeFilesError("a text in the collector's answer is not a string")
    return value[:limit]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def parse_answer(stdout: str) -> ProbeFiles:
    """The program's answer, checked (see the module's docstring)."""
    if len(stdout) > answer_limit():
        raise ProbeFilesError(f"the health collector answered {len(stdout)} bytes")
    try:
        document = json.loads(stdout)
    except (ValueError, RecursionError) as error:
        raise ProbeFilesError(f"the health collector's answer is not JSON: {error}") from None
    if not isinstance(document, dict) or document.get("v") != 1:
        raise ProbeFilesError("the health collector's answer has no version 1")
    if "error" in document:
        code = document.get("code")
        if code not in DIRECTORY_CODES:
            raise ProbeFilesError(f"unknown code {code!r} in the health collector's answer")
        raise ProbeFilesError(f"{code}: {_text(document['error'])}")
    now = _number(document.get("now"))
    entries = document.get("files")
    if now is None or not isinstance(entries, list) or len(entries) > MAX_FILES:
        raise ProbeFilesError("the health collector's answer has no clock or no file list")
    found = ProbeFiles(answer_bytes=len(stdout))
    for name in ("ignored", "over_limit"):
        count = document.get(name, 0)
        if type(count) is not int or count < 0:
            raise ProbeFilesError(f"the health collector's {name} is not a count")
        setattr(found, name, count)
    for entry in entries:
        if not isinstance(entry, dict):
            raise ProbeFilesError("a file in the health collector's answer is not an object")
        node = _node_of(entry.get("name"))
        if node is None or node in found.files:
            # Not a name the hook writes (or twice): never looked up, never recorded.
            found.ignored += 1
            continue
        found.files[node] = _one_file(node, entry, now)
    return found


def _node_of(name: Any) -> str | None:
    if not isinstance(name, str) or not name.endswith(".json"):
        return None
    node = name[: -len(".json")]
    return node if NODE_NAME.fullmatch(node) else None


def _one_file(node: str, entry: dict[str, Any], now: float) -> ProbeFile:
    mtime = _number(entry.get("mtime"))
    age = None if mtime is None else max(0.0, now - mtime)
    key = entry.get("key", "")
    key = key if isinstance(key, str) and _KEY.fullmatch(key) else ""
    if "error" in entry:
        code = entry.get("code")
        if code not in CODES:
            raise ProbeFilesError(f"unknown code {code!r} for {node}.json")
        return ProbeFile(node=node, key=key, age_s=age, code=str(code), error=_text(entry["error"]))
    if entry.get("unchanged") is True:
        return ProbeFile(node=node, key=key, age_s=age, unchanged=True)
    if entry.get("deferred") is True:
        return ProbeFile(node=node, key=key, age_s=age, deferred=True)
    encoded = entry.get("data")
    if not isinstance(encoded, str) or len(encoded) > (MAX_FILE_BYTES + 2) // 3 * 4:
        raise ProbeFilesError(f"the collector's data for {node}.json is longer than asked")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ProbeFilesError(f"the collector's data for {node}.json is not base64") from None
    if len(data) > MAX_FILE_BYTES:
        raise ProbeFilesError(f"the collector's data for {node}.json is longer than asked")
    return ProbeFile(node=node, key=key, age_s=age, data=data)
