"""Bad-node isolation by group testing vs exhaustive pairs, simulated (pure Python).

    .venv/bin/python bench/isolation_bench.py [--trials 20] [--healthy-trials 200] [--record]

The fabric (``tests/isolation_support.py``): nodes in leaves of 8 or 16, a collective over a
group runs at its slowest member's link (50 GB/s healthy, the bad node at half of it) times
1.0 within a leaf and 0.8 across the spine; thresholds are 92% of those figures.

Time model: every measurement is a Slurm job of fixed start-up (``--startup``, 30 s: the
allocation, srun, Python and torch, the NCCL communicator) plus its messages, an all-reduce
sweep as ``python -m trainer collectives`` runs it by default (1 KiB .. 256 MiB, 26 calls per
size: 1 checked, 5 warm-up, 20 timed), each call taking bytes x 2(n-1)/n / busbw. Groups of
disjoint nodes run in parallel: a round lasts as long as its slowest job; rounds run one
after another. Exhaustive pairwise: n(n-1)/2 pairs in n-1 rounds of n/2 disjoint pairs (a
round-robin schedule; every round holds one pair with the bad node, the slowest job).

Prints per size and leaf: jobs, rounds and simulated wall time of both (the worst over
``--trials`` random positions of the bad node), whether the bad node (and only it) was
convicted in every trial, then with 2% Gaussian noise on every measurement: false
convictions over ``--healthy-trials`` healthy fabrics and the bad node found over as many
noisy trials. ``--record`` writes ``bench/results/isolation_<date>_<commit>.md``.
"""

from __future__ import annotations

import argparse
import datetime
import io
import random
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from _benchlib import table  # noqa: E402
from isolation_support import HEALTHY_RATE, Bottleneck, fabric, thresholds  # noqa: E402

from acceptance.isolation import Isolation, isolate  # noqa: E402

SHAPES = [(8, 8), (64, 8), (64, 16), (256, 8), (256, 16), (1024, 8), (1024, 16)]
SWEEP_BYTES = sum(1 << k for k in range(10, 29))  # 1 KiB .. 256 MiB
CALLS_PER_SIZE = 26
BAD_FRACTION = 0.5
NOISE = 0.02


def message_s(group_size: int, busbw: float) -> float:
    factor = 2 * (group_size - 1) / group_size
    return CALLS_PER_SIZE * SWEEP_BYTES * factor / busbw if busbw > 0 else float("inf")


def group_testing_wall(result: Isolation, startup: float) -> float:
    rounds: dict[int, float] = {}
    for m in result.measurements:
        t = startup + message_s(len(m.group), m.busbw)
        rounds[m.round] = max(rounds.get(m.round, 0.0), t)
    return sum(rounds.values())


def pairwise(nodes: int, startup: float) -> tuple[int, int, float]:
    """(jobs, rounds, wall): each round's slowest job is the bad node's pair (cross-spine
    at worst: its busbw is the bad link x the spine factor)."""
    worst_pair = startup + message_s(2, HEALTHY_RATE * BAD_FRACTION * 0.8)
    rounds = nodes - 1 if nodes % 2 == 0 else nodes
    return nodes * (nodes - 1) // 2, rounds, rounds * worst_pair


def one_shape(nodes: int, leaf: int, args: argparse.Namespace) -> list[object]:
    leaves = fabric(nodes, leaf)
    everyone = [n for members in leaves.values() for n in members]
    rng = random.Random(nodes * 100 + leaf)
    jobs, rounds, walls, right = [], [], [], 0
    for _ in range(args.trials):
        bad = rng.choice(everyone)
        model = Bottleneck(leaves, {bad: BAD_FRACTION})
        result = isolate(leaves, model.busbw, thresholds())
        right += result.convicted == [bad] and not result.inconclusive
        jobs.append(result.jobs)
        rounds.append(result.rounds)
        walls.append(group_testing_wall(result, args.startup))
    false_convictions, found = noisy(leaves, everyone, args.healthy_trials, rng)
    p_jobs, p_rounds, p_wall = pairwise(nodes, args.startup)
    return [
        nodes,
        leaf,
        max(jobs),
        max(rounds),
        f"{max(walls) / 60:.1f}",
        p_jobs,
        p_rounds,
        f"{p_wall / 3600:.1f}",
        f"{p_jobs / max(jobs):.0f}x",
        f"{p_wall / max(walls):.0f}x",
        f"{right}/{args.trials}",
        f"{false_convictions}/{args.healthy_trials}",
        f"{found}/{args.healthy_trials}",
    ]


def noisy(
    leaves: dict[str, list[str]], everyone: list[str], trials: int, rng: random.Random
) -> tuple[int, int]:
    """(nodes convicted over ``trials`` healthy noisy fabrics, noisy trials in which exactly
    the bad node was convicted)."""
    false_convictions = found = 0
    for t in range(trials):
        healthy = Bottleneck(leaves, noise=NOISE, seed=rng.randrange(1 << 30))
        false_convictions += len(isolate(leaves, healthy.busbw, thresholds()).convicted)
        bad = everyone[t % len(everyone)] if t % 2 else rng.choice(everyone)
        model = Bottleneck(leaves, {bad: BAD_FRACTION}, noise=NOISE, seed=rng.randrange(1 << 30))
        found += isolate(leaves, model.busbw, thresholds()).convicted == [bad]
    return false_convictions, found


HEADER = [
    "nodes",
    "leaf",
    "jobs",
    "rounds",
    "wall min",
    "pair jobs",
    "pair rounds",
    "pair wall h",
    "jobs ratio",
    "wall ratio",
    "convicted",
    "false (noise)",
    "found (noise)",
]


def run(args: argparse.Namespace) -> int:
    print(
        f"# isolation bench: {args.trials} trials per shape (worst shown), start-up "
        f"{args.startup:.0f} s per job, bad link {BAD_FRACTION:.0%} of {HEALTHY_RATE / 1e9:.0f} "
        f"GB/s, thresholds 92% (leaf) / 92% x 0.8 (spine), noise {NOISE:.0%} in the last two "
        f"columns over {args.healthy_trials} trials each"
    )
    rows = [one_shape(nodes, leaf, args) for nodes, leaf in SHAPES]
    print(table(rows, HEADER))
    failures = [r for r in rows if not str(r[10]).startswith(str(args.trials) + "/")]
    wrong = [r for r in rows if not str(r[11]).startswith("0/")]
    ok = not failures and not wrong
    verdict = "MET" if ok else "NOT MET"
    print(f"goal: the bad node and only it convicted, 0 false convictions: {verdict}")
    return 0 if ok else 1


def record(output: str) -> Path:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    today = datetime.date.today().isoformat()
    path = REPO / "bench" / "results" / f"isolation_{today}_{commit or 'unknown'}.md"
    paragraphs = (__doc__ or "").strip().split("\n\n")
    command, model = paragraphs[1].strip(), "\n\n".join(paragraphs[2:])
    path.write_text(
        "## Bad-node isolation by group testing vs exhaustive pairs (issue 26)\n\n"
        f"Command (repo root, pure Python, ~5 s):\n\n```\n{command}\n```\n\n{model}\n\n"
        f"Output ({today}, the working tree on top of {commit}; the figures are a simulation, "
        f"so they do not move with the machine's load):\n\n```\n{output.rstrip()}\n```\n"
    )
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--healthy-trials", type=int, default=200)
    parser.add_argument("--startup", type=float, default=30.0, help="seconds per job")
    parser.add_argument("--record", action="store_true", help="write bench/results/isolation_*.md")
    args = parser.parse_args()
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        code = run(args)
    print(buffer.getvalue(), end="")
    if args.record:
        print(f"# recorded in {record(buffer.getvalue()).relative_to(REPO)}")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
