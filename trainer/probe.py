"""``python -m trainer probe``: what a node's GPUs and software stack look like, as ONE
JSON document on stdout (``gantry-node-probe/1``, trainer/SCHEMA.md).

Collects raw outputs only, each bounded and each command with a timeout; Gantry parses
them (``health.parsers``), so a newer nvidia-smi needs no new trainer. Commands (at most
four per probe, each at most ``COMMAND_TIMEOUT_S``):

- ``nvidia-smi -q -x``, ``nvidia-smi topo -m``, ``nvidia-smi nvlink -s``;
- ``dmesg`` (kernel log), of which only the ``NVRM: Xid`` lines are kept; where the kernel
  refuses (``dmesg_restrict``), the refusal is recorded, the probe does not fail.

The nvidia-smi program is ``$GANTRY_NVIDIA_SMI`` when set (an absolute path: the dev
cluster points it at ``scripts/fake-nvidia-smi``, a stand-in that prints recorded outputs),
else ``nvidia-smi`` from PATH; likewise ``$GANTRY_DMESG`` for ``dmesg`` (the stand-in again,
through a link named ``dmesg``). Both are set by whoever starts the probe job (Gantry's
operator or the dev cluster), never by a researcher: ``nodes.environment`` refuses them
for jobs, as programs to run. Versions: Python, the kernel (``platform.release()``), and,
when importable, torch, the CUDA it was built with and NCCL (only with CUDA available).
Imports no Django; torch is optional. Exit code 0 whenever the document was printed.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

from .schema import PROBE_SCHEMA

COMMAND_TIMEOUT_S = 20
# Per command output kept (bytes of text); more is cut and marked ``truncated``.
MAX_OUTPUT = 3 * 1024 * 1024
MAX_STDERR = 4096
MAX_XID_LINES = 200
MAX_PACKAGES = 2000


def nvidia_smi_program() -> str:
    configured = os.environ.get("GANTRY_NVIDIA_SMI", "").strip()
    if configured:
        return configured
    return shutil.which("nvidia-smi") or "nvidia-smi"


def run_command(argv: list[str], *, timeout: float = COMMAND_TIMEOUT_S) -> dict[str, Any]:
    """Run ``argv`` (no shell), bounded; the result as the document records it."""
    started = time.monotonic()
    result: dict[str, Any] = {"argv": argv, "exit_code": None, "stdout": "", "stderr": ""}
    result.update({"seconds": 0.0, "error": None, "truncated": False})
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        result["error"] = f"{argv[0]} not found"
    except PermissionError:
        result["error"] = f"{argv[0]}: permission denied"
    except subprocess.TimeoutExpired:
        result["error"] = f"timed out after {timeout:g} s"
    except OSError as error:
        result["error"] = f"{argv[0]}: {error}"
    else:
        stdout = done.stdout.decode("utf-8", errors="replace")
        result["exit_code"] = done.returncode
        result["truncated"] = len(stdout) > MAX_OUTPUT
        result["stdout"] = stdout[:MAX_OUTPUT]
        result["stderr"] = done.stderr.decode("utf-8", errors="replace")[-MAX_STDERR:]
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def kernel_log() -> dict[str, Any]:
    """``dmesg``, keeping only the NVIDIA XID lines (the newest ``MAX_XID_LINES``)."""
    result = run_command([os.environ.get("GANTRY_DMESG", "").strip() or "dmesg"])
    lines = [line for line in result["stdout"].splitlines() if "NVRM: Xid" in line]
    result["stdout"] = "\n".join(lines[-MAX_XID_LINES:])
    result["truncated"] = False
    if result["exit_code"] not in (0, None):
        result["refused"] = True
    return result


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read(64).strip()
    except OSError:
        return ""


# Where the health-check hook lets the probe keep what importing torch found
# (``GANTRY_PROBE_TORCH_CACHE``: a file in its root-only health directory), and how long that
# stands while torch's files are unchanged. Importing torch costs a second or more of CPU
# (more with CUDA), every interval, on every node, however busy.
TORCH_CACHE_ENV = "GANTRY_PROBE_TORCH_CACHE"
TORCH_CACHE_SECONDS = 600
_TORCH_FILES = ("__init__.py", "version.py")


def _torch_files_key() -> list[Any] | None:
    """What identifies the torch that ``import torch`` would load, found without importing
    it: its package files' device, inode, size and modification time (None: no torch)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        return None
    key: list[Any] = [sys.executable, locations[0]]
    for name in _TORCH_FILES:
        try:
            found = os.stat(os.path.join(locations[0], name))
        except OSError:
            return None
        key.append([found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns])
    return key


def _cached_torch_versions(path: str, now: float) -> dict[str, Any]:
    """``_torch_versions``, imported again only when torch's files changed or the kept
    answer is ``TORCH_CACHE_SECONDS`` old. The file is the probe's own (root's, in the
    health directory); one that does not parse, or holds another key, is not used."""
    key = _torch_files_key()
    try:
        with open(path, encoding="utf-8") as handle:
            kept = json.loads(handle.read(1 << 16))
        if (
            isinstance(kept, dict)
            and key is not None
            and kept.get("key") == key
            and isinstance(kept.get("at"), int | float)
            and 0 <= now - kept["at"] < TORCH_CACHE_SECONDS
            and isinstance(kept.get("found"), dict)
        ):
            return dict(kept["found"])
    except (OSError, ValueError, RecursionError):
        pass
    found = _torch_versions()
    if key is not None:
        temporary = f"{path}.{os.getpid()}.tmp"
        try:
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                json.dump({"key": key, "at": now, "found": found}, handle)
            os.replace(temporary, path)
        except OSError:
            pass
    return found


def _torch_versions() -> dict[str, Any]:
    try:
        import torch
    except Exception as error:
        return {"torch_error": f"{type(error).__name__}: {error}"[:300]}
    found: dict[str, Any] = {"torch": str(torch.__version__), "torch_cuda": torch.version.cuda}
    try:
        if torch.cuda.is_available():
            nccl = torch.cuda.nccl.version()
            found["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except Exception as error:
        found["nccl_error"] = f"{type(error).__name__}: {error}"[:300]
    return found


def _packages() -> dict[str, str]:
    from importlib import metadata

    packages: dict[str, str] = {}
    for distribution in metadata.distributions():
        name = distribution.name
        if name and len(packages) < MAX_PACKAGES:
            packages[str(name).lower()] = str(distribution.version)
    return dict(sorted(packages.items()))


def stack() -> dict[str, Any]:
    found: dict[str, Any] = {
        "python": platform.python_version(),
        "kernel": platform.release(),
        "platform": platform.platform(),
    }
    cache = os.environ.get(TORCH_CACHE_ENV, "")
    found.update(
        _cached_torch_versions(cache, time.time()) if os.path.isabs(cache) else _torch_versions()
    )
    found["packages"] = _packages()
    return found


def probe() -> dict[str, Any]:
    smi = nvidia_smi_program()
    return {
        "schema": PROBE_SCHEMA,
        "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
        "taken_at": time.time(),
        "boot_id": _boot_id(),
        "commands": {
            "nvidia_smi": run_command([smi, "-q", "-x"]),
            "topology": run_command([smi, "topo", "-m"]),
            "nvlink": run_command([smi, "nvlink", "-s"]),
            "kernel_log": kernel_log(),
        },
        "stack": stack(),
    }


def main() -> int:
    json.dump(probe(), sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    sys.stdout.flush()
    return 0
