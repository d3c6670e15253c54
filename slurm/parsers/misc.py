"""Small outputs: sbatch --parsable, versions, scontrol show config."""

from __future__ import annotations

import re

from slurm.errors import SlurmParseError

# ---------------------------------------------------------------- misc


_SBATCH_ID = re.compile(r"^(\d+)(?:;(\S+))?$")


def parse_sbatch_parsable(text: str) -> str:
    """``sbatch --parsable`` -> job id: ``"123"`` or ``"123;cluster"`` -> ``"123"``.

    sbatch may print warnings before the id; the id is the last non-empty line.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    match = _SBATCH_ID.match(lines[-1]) if lines else None
    if not match:
        raise SlurmParseError("sbatch --parsable output", text, "expected '<job id>[;<cluster>]'")
    return match.group(1)


def parse_version(text: str) -> str:
    """``sinfo -V`` -> ``"22.05.8"``."""
    match = re.search(r"(\d+\.\d+(?:\.\d+)?(?:-\S+)?)", text)
    if not match:
        raise SlurmParseError("sinfo -V output", text, "no version number")
    return match.group(1)


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config`` -> ``{"ClusterName": "dev", ...}`` (``Key = value`` lines)."""
    result: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            result[key.strip()] = value.strip()
    if not result:
        raise SlurmParseError("scontrol show config", text, "no 'Key = value' lines")
    return result
