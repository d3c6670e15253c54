"""Placement advice cost on big synthetic clusters (pure Python, no cluster needed).

    .venv/bin/python bench/placement_bench.py [--repeat 5]

Clusters of 1,000 and 10,000 nodes: 20 nodes per leaf switch, 20 leaves per
aggregation switch, one spine; 8 GPUs per node; a seeded mix of idle, mixed,
allocated (with a known free time) and drained nodes. Prints the median wall
time of ``propose_placement`` per request shape and the switches it spans
(goal: well under a second at 10,000 nodes).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from nodes.placement import (  # noqa: E402
    NodeInfo,
    PlacementRequest,
    SwitchInfo,
    placement_quality,
    propose_placement,
)

NOON = datetime(2030, 5, 6, 12, 0, tzinfo=UTC)


def cluster(size: int, seed: int = 7) -> tuple[list[NodeInfo], list[SwitchInfo]]:
    rng = random.Random(seed)
    switches = [SwitchInfo("spine", None, 2)]
    nodes: list[NodeInfo] = []
    leaves = size // 20
    for leaf_index in range(leaves):
        aggregation = f"agg{leaf_index // 20:03d}"
        if leaf_index % 20 == 0:
            switches.append(SwitchInfo(aggregation, "spine", 1))
        leaf = f"leaf{leaf_index:04d}"
        switches.append(SwitchInfo(leaf, aggregation, 0))
        for i in range(20):
            state = rng.choices(["idle", "mixed", "allocated", "drained"], [5, 2, 3, 1])[0]
            free = {"idle": 8, "mixed": rng.randint(0, 7)}.get(state, 0)
            nodes.append(
                NodeInfo(
                    name=f"gpu{leaf_index * 20 + i:05d}",
                    state=state,
                    partitions=("gpu",),
                    leaf_switch=leaf,
                    gpu_type="h100",
                    gpus_total=8,
                    gpus_free=free,
                    cpus_total=128,
                    cpus_free=16 * free,
                    memory_mb=1_024_000,
                    memory_free_mb=128_000 * free,
                    intra_node_link=rng.choice(["nvlink", "nvlink", "pcie"]),
                    free_at=NOON + timedelta(minutes=rng.randint(1, 600))
                    if state in ("mixed", "allocated")
                    else None,
                )
            )
    return nodes, switches


REQUESTS = {
    "4 x 8": PlacementRequest(4, 8, "gpu"),
    "16 x 8": PlacementRequest(16, 8, "gpu"),
    "64 x 8": PlacementRequest(64, 8, "gpu", cpus_per_gpu=16),
    "25% x 8": None,
    "all idle+waits": None,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{'nodes':>6}  {'request':<16} {'median s':>9}  {'max s':>7}  switches  waits")
    for size in (1_000, 10_000):
        nodes, switches = cluster(size)
        usable = sum(1 for n in nodes if n.state in ("idle", "mixed") and n.gpus_free == 8)
        for label, request in REQUESTS.items():
            if label == "25% x 8":
                request = PlacementRequest(size // 4, 8, "gpu")
            elif request is None:
                # More nodes than are free now: the soonest-free fallback.
                request = PlacementRequest(usable + size // 10, 8, "gpu")
            times = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                placement = propose_placement(nodes, switches, request)
                times.append(time.perf_counter() - start)
            print(
                f"{size:>6}  {label:<16} {statistics.median(times):>9.4f}  {max(times):>7.4f}  "
                f"{len(placement.switches_spanned):>8}  {len(placement.waits_for):>5}"
            )
        start = time.perf_counter()
        check = placement_quality(
            [n.name for n in nodes[:: size // 16]][:16], nodes, switches, PlacementRequest(16, 8)
        )
        print(
            f"{size:>6}  {'quality (16)':<16} {time.perf_counter() - start:>9.4f}  {'':>7}  "
            f"{len(check.switches_spanned):>8}  optimum {check.optimal_switch_count}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
