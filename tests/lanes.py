"""Lanes: what each test needs of the dev cluster, so tests that share it run at once.

Every test that uses the dev cluster says what it needs of it, with one of two markers:

- ``@pytest.mark.nodes(count, partition=None)``: it shares the cluster with other tests; its
  Slurm jobs occupy at most ``count`` nodes of ``partition`` at any one time (0: it only logs
  in, or its jobs are held and never run; a tuple: that many of each). Without a partition,
  the lane gives it whichever partition has ``count`` nodes free, and the test submits there
  (the ``lane_partition`` fixture; the submit helpers default to it): a test names a
  partition only when it asserts what that partition has (its nodes, GPU type, switch). Before it starts it takes that many of the partition's node
  slots (lock files shared by every pytest process on this machine), so tests running at
  once never queue behind each other's jobs; it waits for its own jobs only.
- ``@pytest.mark.exclusive``: it owns the whole cluster. It restarts or stops daemons,
  puts stand-ins (shims) in front of the login node's commands, kills processes that are
  not its own, changes the cluster's trust, node states or researchers' homes, or judges
  measured speed. ``make test`` runs these one after another, after the shared lane; each
  holds every node slot and starts on a quiet cluster, so even in one run with the others
  it runs alone.

A test that uses the cluster's fixtures without either marker is refused at collection: a
new cluster test says what it needs. Plain Python and pytest; no Django (the clean-up of a
test's Slurm jobs, which reads the test database, is in ``conftest.py``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
# The fixtures through which a test reaches the dev cluster (every other cluster fixture
# builds on one of them, so they are in its closure).
CLUSTER_FIXTURES = frozenset({"devcluster", "dev_cluster_registered"})
MARKERS = (
    "nodes(count, partition=None): shares the dev cluster; its jobs occupy at most count "
    "nodes of partition (default: the cluster's default) at a time",
    "exclusive: owns the whole dev cluster (daemons, shims, trust, node states, homes, "
    "measured speed); run alone, after the shared lane",
)


@dataclass(frozen=True)
class ClusterNeed:
    exclusive: bool
    count: int
    # None: any partition the lane gives it.
    partitions: tuple[str | None, ...]


def need_of(item: pytest.Item) -> ClusterNeed | None:
    """What ``item`` declared it needs of the cluster (None: it declared nothing)."""
    if item.get_closest_marker("exclusive") is not None:
        return ClusterNeed(exclusive=True, count=0, partitions=())
    marker = item.get_closest_marker("nodes")
    if marker is None:
        return None
    count = marker.args[0] if marker.args else marker.kwargs.get("count", 1)
    partition = marker.args[1] if len(marker.args) > 1 else marker.kwargs.get("partition")
    if not isinstance(count, int) or count < 0:
        raise pytest.UsageError(f"{item.nodeid}: nodes(count) needs a whole number >= 0")
    partitions = tuple(partition) if isinstance(partition, tuple | list) else (partition,)
    return ClusterNeed(exclusive=False, count=count, partitions=partitions)


def uses_cluster(item: pytest.Item) -> bool:
    return bool(CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())))


def check_declared(items: list[pytest.Item]) -> None:
    """Fail closed: a test that reaches the cluster must say what it needs of it; one that
    declares a need is an integration test."""
    undeclared = []
    for item in items:
        need = need_of(item)
        if need is None and uses_cluster(item):
            undeclared.append(item.nodeid)
        if need is not None:
            item.add_marker(pytest.mark.integration)
    if undeclared:
        listed = "\n  ".join(undeclared[:20])
        raise pytest.UsageError(
            "these tests use the dev cluster but declare neither @pytest.mark.nodes(count, "
            f"partition) nor @pytest.mark.exclusive (tests/lanes.py):\n  {listed}"
        )


def longest_first(items: list[pytest.Item]) -> None:
    """Under xdist, the tests marked slow go out first, those that need the most nodes
    first among them, so the last minutes of a lane are not one long test on one worker
    while the others wait, and a test that needs much does not wait behind many."""

    def key(item: pytest.Item) -> tuple[bool, int]:
        need = need_of(item)
        size = need.count * len(need.partitions) if need is not None else 0
        return item.get_closest_marker("slow") is None, -size

    items.sort(key=key)


# ------------------------------------------------------------------------ node slots

# The partition the running test was given (its marker named none), for the submit helpers.
_ASSIGNED: list[str] = []


def assigned_partition(default: str = "batch") -> str:
    """The partition the lane gave the running test, else ``default``."""
    return _ASSIGNED[-1] if _ASSIGNED else default


@contextlib.contextmanager
def assigned(partition: str | None) -> Iterator[None]:
    if partition is None:
        yield
        return
    _ASSIGNED.append(partition)
    try:
        yield
    finally:
        _ASSIGNED.pop()


def slots_dir() -> Path:
    path = Path(os.environ.get("GANTRY_TEST_LANES_DIR") or REPO / "var" / "test-lanes")
    path.mkdir(parents=True, exist_ok=True)
    return path


class NodeSlots:
    """Counting semaphores, one per partition, across processes: ``size`` lock files per
    partition; a test holds ``count`` of them (``flock``) for as long as it runs. One
    allocation lock makes taking several slots atomic, so two tests never each hold half of
    what the other needs."""

    def __init__(self, sizes: dict[str, int], directory: Path | None = None) -> None:
        self.sizes = sizes
        self.directory = directory or slots_dir()

    @contextlib.contextmanager
    def held(
        self, wants: dict[str, int], *, any_of: int = 0, timeout: float = 1800
    ) -> Iterator[str | None]:
        """Hold ``wants[partition]`` slots of each partition and, with ``any_of``, that many
        of whichever partition has them free first; yields the latter's name (or None)."""
        for partition, count in wants.items():
            size = self.sizes.get(partition)
            if size is None:
                raise pytest.UsageError(f"nodes(): no partition {partition!r} in {self.sizes}")
            if count > size:
                raise pytest.UsageError(f"nodes({count}, {partition!r}): it has {size} nodes")
        wants = {partition: count for partition, count in wants.items() if count}
        choices = [p for p, size in sorted(self.sizes.items()) if size >= any_of] if any_of else []
        if any_of and not choices:
            raise pytest.UsageError(f"nodes({any_of}): no partition has that many ({self.sizes})")
        held, chosen = (
            self._wait(wants, choices, any_of, timeout) if wants or choices else ([], None)
        )
        try:
            yield chosen
        finally:
            for handle in held:
                fcntl.flock(handle, fcntl.LOCK_UN)
                handle.close()

    def _wait(
        self, wants: dict[str, int], choices: list[str], any_of: int, timeout: float
    ) -> tuple[list[Any], str | None]:
        """Take the slots, first come, first served: one waiter at a time tries (holding the
        turnstile), so a test that needs much is not starved by many that need little."""
        started = time.monotonic()
        turnstile = self._turnstile(timeout)
        try:
            turn = 0
            while True:
                for option in choices[turn:] + choices[:turn] if choices else [None]:
                    want = dict(wants)
                    if option is not None:
                        want[option] = want.get(option, 0) + any_of
                    held = self._try(want)
                    if held:
                        return held, option
                if time.monotonic() - started > timeout:
                    raise TimeoutError(f"slots {wants} (+{any_of} of any) not free in {timeout}s")
                turn = (turn + 1) % max(1, len(choices))
                time.sleep(0.25)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
            turnstile.close()

    def _turnstile(self, timeout: float) -> Any:
        handle = open(self.directory / "turnstile.lock", "a+")  # noqa: SIM115
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return handle
            except BlockingIOError:
                if time.monotonic() > deadline:
                    handle.close()
                    raise TimeoutError(f"no turn for node slots in {timeout}s") from None
                time.sleep(0.25)

    def _try(self, wants: dict[str, int]) -> list[Any]:
        """Every wanted slot, or none (under the allocation lock, so all or nothing)."""
        with open(self.directory / "allocate.lock", "a+") as allocation:
            fcntl.flock(allocation, fcntl.LOCK_EX)
            taken: list[Any] = []
            try:
                for partition, count in wants.items():
                    got = 0
                    for index in range(self.sizes[partition]):
                        if got == count:
                            break
                        handle = open(self.directory / f"{partition}-{index}.lock", "a+")  # noqa: SIM115
                        try:
                            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        except BlockingIOError:
                            handle.close()
                            continue
                        taken.append(handle)
                        got += 1
                    if got < count:
                        for handle in taken:
                            fcntl.flock(handle, fcntl.LOCK_UN)
                            handle.close()
                        return []
                return taken
            finally:
                fcntl.flock(allocation, fcntl.LOCK_UN)


def wanted(need: ClusterNeed, sizes: dict[str, int]) -> tuple[dict[str, int], int]:
    """The slots ``need`` takes: of named partitions, and how many of any one partition.
    An exclusive test takes every slot of every partition."""
    if need.exclusive:
        return dict(sizes), 0
    named = {partition: need.count for partition in need.partitions if partition is not None}
    return named, need.count if None in need.partitions else 0


def record(
    nodeid: str, held: dict[str, int], *, asked: float, started: float, ended: float
) -> None:
    """One line per cluster test in ``GANTRY_TEST_LANES_LOG`` (set by ``make test``): the
    slots it held, how long it waited for them and ran, for the lanes' summary."""
    path = os.environ.get("GANTRY_TEST_LANES_LOG")
    if not path:
        return
    line = {"test": nodeid, "held": held, "asked": asked, "started": started, "ended": ended}
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")


def summary(path: str) -> list[str]:
    """The lanes' summary: per partition, how much of the run its slots were held; the
    tests that waited longest for theirs."""
    lines = [json.loads(text) for text in Path(path).read_text().splitlines() if text.strip()]
    if not lines:
        return []
    begin = min(line["asked"] for line in lines)
    end = max(line["ended"] for line in lines)
    held: dict[str, float] = {}
    for line in lines:
        for partition, count in line["held"].items():
            seconds = count * (line["ended"] - line["started"])
            held[partition] = held.get(partition, 0.0) + seconds
    out = [f"cluster tests: {len(lines)} over {end - begin:.0f} s"]
    for partition, seconds in sorted(held.items()):
        out.append(f"  {partition}: {seconds:.0f} node-seconds held")
    waits = sorted(lines, key=lambda line: line["started"] - line["asked"], reverse=True)[:5]
    for line in waits:
        out.append(f"  waited {line['started'] - line['asked']:.0f} s: {line['test']}")
    return out


def partition_sizes(devcluster: Any) -> tuple[dict[str, int], str]:
    """Each partition's node count and the default partition, as Slurm says."""
    out = devcluster.slurm(["sinfo", "-h", "-o", "%R %D %a"], check=True).stdout
    sizes: dict[str, int] = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[1].isdigit():
            sizes[fields[0].rstrip("*")] = sizes.get(fields[0].rstrip("*"), 0) + int(fields[1])
    default = devcluster.default_partition
    return sizes, default
