"""Inventory sync cost against the dev cluster: SSH connections and remote commands.

    flock /tmp/gantry-devcluster.lock .venv/bin/python bench/sync_bench.py [--cycles 100] \
        [--env var/devcluster/gantry.env]

Runs N inventory sync cycles (what the node-sync task does: SlurmClient.inventory())
through one pooled transport and prints connections opened per 100 cycles (goal: 1
while the link is healthy), remote commands per cycle (goal: constant) and the
cycle wall time median / p95. The dev cluster's ``gantry.env`` is read from
``$DEVCLUSTER_DIR`` when set (as the tests and ``scripts/devcluster`` do), else from
var/devcluster/.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from slurm.client import SlurmClient  # noqa: E402
from slurm.connect import SshConfig  # noqa: E402
from slurm.transport import close_all, get_transport  # noqa: E402


def read_env(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and not key.startswith("#"):
            env[key] = value
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=100)
    devcluster_dir = Path(os.environ.get("DEVCLUSTER_DIR") or REPO / "var" / "devcluster")
    parser.add_argument("--env", type=Path, default=devcluster_dir / "gantry.env")
    args = parser.parse_args()
    env = read_env(args.env)
    config = SshConfig(
        host=env["GANTRY_CLUSTER_HOST"],
        port=int(env["GANTRY_CLUSTER_PORT"]),
        user=env["GANTRY_CLUSTER_USER"],
        key_path=env["GANTRY_CLUSTER_KEY"],
        known_hosts_path=env["GANTRY_CLUSTER_KNOWN_HOSTS"],
        expected_fingerprint=env.get("GANTRY_CLUSTER_HOST_FINGERPRINT") or None,
    )
    transport = get_transport(config)
    commands_per_cycle: list[int] = []
    seconds: list[float] = []
    nodes = gpus = 0
    try:
        for _ in range(args.cycles):
            # Each cycle asks the pool again, as each Celery task run does.
            client = SlurmClient(get_transport(config))
            before = transport.commands_run
            started = time.perf_counter()
            inventory = client.inventory()
            seconds.append(time.perf_counter() - started)
            commands_per_cycle.append(transport.commands_run - before)
            nodes, gpus = len(inventory.nodes), inventory.gpu_count
    finally:
        close_all()
    cycles = len(seconds)
    ordered = sorted(seconds)
    p95 = ordered[max(0, min(cycles - 1, round(0.95 * cycles) - 1))]
    print(f"cycles: {cycles} (inventory: {nodes} nodes, {gpus} GPUs)")
    print(
        f"SSH connections opened per 100 cycles: "
        f"{transport.connections_opened * 100 / cycles:g} (goal: 1)"
    )
    print(
        f"remote commands per cycle: min {min(commands_per_cycle)} max {max(commands_per_cycle)} "
        "(goal: constant)"
    )
    print(
        f"cycle wall time: median {statistics.median(seconds) * 1000:.1f} ms, "
        f"p95 {p95 * 1000:.1f} ms"
    )
    print(f"bytes read per cycle: {transport.bytes_read / cycles:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
