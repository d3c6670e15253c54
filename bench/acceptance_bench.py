"""Acceptance against a genuinely slow node on the dev cluster (issue 26): convictions of the
slowed node (right, wrong, missed) and false convictions with nothing slowed, over N trials,
with the wall time and Slurm jobs per run.

The trials are ``tests/faults/test_acceptance_faults.py`` (one node's collective ranks held
to a 10% cgroup CPU quota; the threshold half the slower healthy node, measured in the same
trial); each run appends to ``test-artifacts/acceptance-trials.jsonl``. This script runs
them ``--trials`` times on ``--partition`` and prints the table; ``--summarize`` only
prints the table of what the file holds.

    .venv/bin/python bench/acceptance_bench.py --trials 10 --partition gpu   # ~1 h
    .venv/bin/python bench/acceptance_bench.py --summarize
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import _benchlib as lib

REPO = Path(__file__).resolve().parent.parent
TRIALS = REPO / "test-artifacts" / "acceptance-trials.jsonl"


def summarize(records: list[dict[str, Any]]) -> str:
    lines = [
        "| runs | trials | convicted the slowed node alone | wrong or extra node convicted | "
        "missed | false convictions | not passed (healthy) | wall time median (max) | "
        "Slurm jobs per run | runs again (cluster unreachable) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind in ("slowed", "healthy"):
        rows = [r for r in records if r.get("kind") == kind]
        if not rows:
            continue
        walls = [float(r["wall_s"]) for r in rows]
        jobs = sorted({int(r["jobs"]) for r in rows})
        if kind == "slowed":
            right = sum(r["convicted"] == r["expected"] for r in rows)
            wrong = sum(bool(set(r["convicted"]) - set(r["expected"])) for r in rows)
            missed = sum(not set(r["expected"]) <= set(r["convicted"]) for r in rows)
            cells = [f"{right}/{len(rows)}", str(wrong), str(missed), "—", "—"]
        else:
            false = sum(bool(r["convicted"]) for r in rows)
            failed = sum(r["verdict"] != "passed" for r in rows)
            cells = ["—", "—", "—", f"{false}/{len(rows)}", f"{failed}/{len(rows)}"]
        partitions = ", ".join(sorted({r.get("partition", "?") for r in rows}))
        lines.append(
            f"| {kind} ({partitions}) | {len(rows)} | "
            + " | ".join(cells)
            + f" | {statistics.median(walls):.0f} s ({max(walls):.0f} s) | "
            f"{', '.join(map(str, jobs))} | {sum(int(r.get('retried', 0)) for r in rows)} |"
        )
    for full in (r for r in records if r.get("kind") == "full"):
        times = ", ".join(
            f"{tier} {secs:.0f} s" for tier, secs in (full.get("tiers") or {}).items()
        )
        lines.append(
            f"\nA full certificate ({full.get('partition')}): {full['verdict']} in "
            f"{full['wall_s']:.0f} s, {full['jobs']} Slurm jobs; per tier: {times}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--partition", default="batch")
    parser.add_argument("--summarize", action="store_true")
    parser.add_argument("--fresh", action="store_true", help="start a new trials file")
    args = parser.parse_args()
    env = (
        None
        if args.summarize
        else {
            "GANTRY_ACCEPTANCE_TRIALS": str(args.trials),
            "GANTRY_ACCEPTANCE_PARTITION": args.partition,
        }
    )
    return lib.fault_trials(
        "tests/faults/test_acceptance_faults.py", TRIALS, summarize, env=env, fresh=args.fresh
    )


if __name__ == "__main__":
    sys.exit(main())
