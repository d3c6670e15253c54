"""``python -m trainer probe`` end to end without GPUs: the dev cluster's stand-in
(scripts/fake-nvidia-smi) answers for nvidia-smi and dmesg, and ``probe_record`` judges
what the probe printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from factories import GpuFactory, NodeFactory
from health.services import probe_record

REPO = Path(__file__).resolve().parents[2]
STAND_IN = REPO / "scripts" / "fake-nvidia-smi"
NOW = datetime(2030, 5, 6, 12, 0, tzinfo=UTC)


def run_probe(tmp_path: Path, **env: str) -> dict[str, Any]:
    dmesg = tmp_path / "dmesg"
    if not dmesg.exists():
        dmesg.symlink_to(STAND_IN)
    environment = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "GANTRY_NVIDIA_SMI": str(STAND_IN),
        "GANTRY_DMESG": str(dmesg),
        "SLURMD_NODENAME": "n3",
        **env,
    }
    done = subprocess.run(
        [sys.executable, "-m", "trainer", "probe"],
        cwd=REPO,
        env=environment,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def test_probe_document_shape(tmp_path: Path) -> None:
    document = run_probe(tmp_path, GANTRY_FAKE_GPU_PROFILE="a100")
    assert document["schema"] == "gantry-node-probe/1" and document["node"] == "n3"
    commands = document["commands"]
    assert set(commands) == {"nvidia_smi", "topology", "nvlink", "kernel_log"}
    assert commands["nvidia_smi"]["exit_code"] == 0
    assert commands["nvidia_smi"]["stdout"].lstrip().startswith("<?xml")
    assert commands["nvidia_smi"]["argv"] == [str(STAND_IN), "-q", "-x"]
    # Only the XID lines of the kernel log travel (none here).
    assert commands["kernel_log"]["stdout"] == ""
    stack = document["stack"]
    assert stack["python"].count(".") == 2 and stack["kernel"]
    assert isinstance(stack["packages"], dict) and "django" in stack["packages"]


@pytest.mark.django_db
def test_a_faulty_stand_in_node_is_marked_critical(tmp_path: Path) -> None:
    node = NodeFactory(name="n3")
    GpuFactory(node=node, index=0, gpu_type="h100")
    GpuFactory(node=node, index=1, gpu_type="h100")
    document = run_probe(tmp_path, GANTRY_FAKE_GPU_PROFILE="h100 xid79 nvlink-down")
    assert "Xid" in document["commands"]["kernel_log"]["stdout"]
    health = probe_record(node=node, document=document, now=NOW)
    assert (health.state, health.action) == ("critical", "reboot")
    text = " ".join(health.reasons)
    assert "XID 79: GPU has fallen off the bus" in text and "NVLink link(s) 3 inactive" in text
    node.refresh_from_db()
    assert node.health_state == "critical"


@pytest.mark.django_db
def test_missing_nvidia_smi_is_recorded_not_fatal(tmp_path: Path) -> None:
    node = NodeFactory(name="n3")
    document = run_probe(tmp_path, GANTRY_NVIDIA_SMI=str(tmp_path / "absent"))
    assert document["commands"]["nvidia_smi"]["error"].endswith("not found")
    health = probe_record(node=node, document=document, now=NOW)
    assert health.state == "unknown" and "not found" in health.reasons[0]
