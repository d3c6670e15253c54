"""Recovery figures over real faults on the dev cluster (issue 25): time to detect (p50,
p95) against the calibrated budget, Gantry's share of detection → the resumed run's first
step, lost work against the steps since the checkpoint resumed from, false recoveries of
healthy jobs while Gantry's view fails, and whether the suspect named was the right node.

The faults themselves are the tests in ``tests/faults/test_recovery_faults.py`` (a rank
stopped with SIGSTOP, the trainer's NaN fault, a rank held to a cgroup CPU quota, the
newest checkpoint damaged with valid hashes, sacct down / squeue timing out / sshd gone);
each trial appends its figures to ``test-artifacts/recovery-trials.jsonl``. This script
runs them ``--trials`` times (``GANTRY_RECOVERY_TRIALS``) with ``--healthy`` healthy jobs,
then prints the table; ``--summarize`` only prints the table of what the file holds.

    .venv/bin/python bench/recovery_bench.py --trials 10 --healthy 20     # hours
    .venv/bin/python bench/recovery_bench.py --summarize
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import _benchlib as lib

REPO = Path(__file__).resolve().parent.parent
TRIALS = REPO / "test-artifacts" / "recovery-trials.jsonl"


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest rank (as the detection code's own figure)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(fraction * len(ordered))) - 1]


def _fmt(value: float | None, unit: str = " s") -> str:
    return "—" if value is None else f"{value:.1f}{unit}"


def summarize(records: list[dict[str, Any]]) -> str:
    lines = [
        "| fault | trials | recovered | detect p50 / p95 | budget (median) | Gantry share "
        "p50 / max | lost ≤ since checkpoint | right suspect |",
        "|---|---|---|---|---|---|---|---|",
    ]
    kinds = sorted({r["kind"] for r in records if "signal" in r})
    for kind in kinds:
        rows = [r for r in records if r.get("kind") == kind and "signal" in r]
        detect = [float(r["detect_s"]) for r in rows if r.get("detect_s") is not None]
        budgets = [float(r["budget_s"]) for r in rows if r.get("budget_s") is not None]
        shares = [float(r["gantry_share"]) for r in rows if r.get("gantry_share") is not None]
        lost_ok = [
            r["lost_steps"] <= r["steps_since_checkpoint"]
            for r in rows
            if r.get("lost_steps") is not None and r.get("steps_since_checkpoint") is not None
        ]
        suspects = [r["suspects"] == r["expected"] for r in rows if "expected" in r]
        lines.append(
            f"| {kind} | {len(rows)} | {sum(r['outcome'] == 'recovered' for r in rows)} | "
            f"{_fmt(percentile(detect, 0.5))} / {_fmt(percentile(detect, 0.95))} | "
            f"{_fmt(percentile(budgets, 0.5))} | "
            f"{_fmt(percentile([s * 100 for s in shares], 0.5), '%')} / "
            f"{_fmt(max(shares) * 100 if shares else None, '%')} | "
            f"{f'{sum(lost_ok)}/{len(lost_ok)}' if lost_ok else '—'} | "
            f"{f'{sum(suspects)}/{len(suspects)}' if suspects else '—'} |"
        )
    healthy = [r for r in records if r.get("kind") == "healthy under blindness"]
    if healthy:
        jobs = sum(int(r["jobs"]) for r in healthy)
        false = sum(int(r["incidents"]) for r in healthy)
        lines.append(
            f"| healthy jobs, sacct down + squeue timing out + sshd gone | {jobs} jobs in "
            f"{len(healthy)} trials | false recoveries: {false} | | | | | |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--healthy", type=int, default=4)
    parser.add_argument("--summarize", action="store_true")
    parser.add_argument("--fresh", action="store_true", help="start a new trials file")
    args = parser.parse_args()
    env = (
        None
        if args.summarize
        else {
            "GANTRY_RECOVERY_TRIALS": str(args.trials),
            "GANTRY_RECOVERY_HEALTHY_JOBS": str(args.healthy),
        }
    )
    return lib.fault_trials(
        "tests/faults/test_recovery_faults.py", TRIALS, summarize, env=env, fresh=args.fresh
    )


if __name__ == "__main__":
    sys.exit(main())
