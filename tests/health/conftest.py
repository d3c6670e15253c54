"""Probe documents for the health tests, built from the recorded fixtures."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def read_fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def command(
    stdout: str = "", *, exit_code: int | None = 0, error: str | None = None
) -> dict[str, Any]:
    return {
        "argv": ["nvidia-smi"],
        "exit_code": exit_code,
        "stdout": stdout,
        "stderr": "",
        "seconds": 0.1,
        "error": error,
        "truncated": False,
    }


def probe_document(
    smi: str = "derived/a100-2gpu-healthy.xml",
    *,
    topology: str | None = None,
    nvlink: str | None = None,
    kernel_log: str | None = None,
    stack: dict[str, Any] | None = None,
    smi_command: dict[str, Any] | None = None,
) -> dict[str, Any]:
    commands = {
        "nvidia_smi": smi_command or command(read_fixture(smi)),
        "topology": command(read_fixture(topology)) if topology else command(""),
        "nvlink": command(read_fixture(nvlink)) if nvlink else command(""),
        "kernel_log": command(read_fixture(kernel_log)) if kernel_log else command(""),
    }
    return {
        "schema": "gantry-node-probe/1",
        "node": "n1",
        "taken_at": 1_900_000_000.0,
        "boot_id": "boot-1",
        "commands": commands,
        "stack": stack
        if stack is not None
        else {"python": "3.11.7", "kernel": "6.1.0", "torch": "2.4.0", "torch_cuda": "12.4"},
    }


@pytest.fixture
def document() -> Callable[..., dict[str, Any]]:
    return probe_document
