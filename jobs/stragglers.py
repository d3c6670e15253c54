"""Straggler evidence from the trainer's per-rank timings (``ranks`` in a logged step:
``[rank, node, forward_s, step_s]`` per rank, means over the log interval). A rank is slow
in an interval when its forward time (its own work, before any collective) is more than
``STRAGGLER_MARGIN`` above the median of its peers' and at least ``STRAGGLER_MIN_S`` more;
one slow in ``STRAGGLER_STREAK`` consecutive intervals is a straggler, named with its node.

Pure: ingest keeps the running state on the job (``Job.rank_timing``), recovery reads it.
Everything in a line is the job owner's to write, so a line is evidence only within what
the job's own allocation makes plausible: at most ``world_size`` entries (and never more
than ``MAX_RANKS``), each rank below the world size and listed once, each node one Slurm
allocated to the job. A line that breaks any of this is no evidence (it neither starts
nor ends a streak), so a job cannot point its straggler at somebody else's node.

The check is O(n log n) in the line's entries: the peers' median of every rank comes from
one sort (``peer_medians``), never a fresh median per rank, so a line a hostile job fills
with tens of thousands of entries costs a sort, not the watcher's cycle.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

STRAGGLER_MARGIN = 0.5
STRAGGLER_MIN_S = 0.002
STRAGGLER_STREAK = 10
# The most entries a line may list, whatever the job's world size (more is not read).
MAX_RANKS = 65536
# The longest node name read (Slurm's own names are far shorter).
MAX_NODE_CHARS = 128


def _rows(
    ranks: Any, *, world_size: int, allocated_nodes: Collection[str]
) -> list[tuple[int, str, float]] | None:
    """(rank, node, forward_s) of a well-formed ``ranks`` value within the job's
    allocation, else None. The length is checked before anything is read."""
    limit = min(world_size, MAX_RANKS)
    if not isinstance(ranks, list) or not 2 <= len(ranks) <= limit:
        return None
    rows = []
    seen: set[int] = set()
    for row in ranks:
        if not (isinstance(row, list) and len(row) == 4):
            return None
        rank, node, forward, _step = row
        if type(rank) is not int or not 0 <= rank < world_size or rank in seen:
            return None
        if not isinstance(node, str) or len(node) > MAX_NODE_CHARS:
            return None
        if node not in allocated_nodes:
            return None
        if type(forward) not in (int, float) or not math.isfinite(forward) or forward < 0:
            return None
        seen.add(rank)
        rows.append((rank, node, float(forward)))
    return rows


def peer_medians(values: list[float]) -> list[float]:
    """For each position ``i``, the median of ``values`` without ``values[i]`` (what
    ``statistics.median`` of the others gives, to the bit), from one sort.

    Leaving out the element at sorted position ``p`` leaves ``r[j] = s[j]`` for ``j < p``
    and ``s[j + 1]`` after; the median of those ``n - 1`` is ``r[(n - 2) / 2]`` when
    ``n - 1`` is odd and the mean of ``r[n/2 - 1]`` and ``r[n/2]`` (n odd) otherwise: each
    one of the sorted list's two or three middle order statistics."""
    count = len(values)
    if count < 2:
        raise ValueError("a median of peers needs at least two values")
    order = sorted(range(count), key=values.__getitem__)
    ordered = [values[index] for index in order]
    medians = [0.0] * count
    peers = count - 1

    def left_out(j: int, position: int) -> float:
        return ordered[j] if j < position else ordered[j + 1]

    for position, index in enumerate(order):
        if peers % 2:
            medians[index] = left_out(peers // 2, position)
        else:
            middle = peers // 2
            medians[index] = (left_out(middle - 1, position) + left_out(middle, position)) / 2
    return medians


def slow_ranks(
    ranks: Any, *, world_size: int, allocated_nodes: Collection[str]
) -> dict[int, tuple[str, float]] | None:
    """rank -> (node, its forward time over its peers' median) for each slow rank of one
    interval; None when the line is no evidence (malformed, or outside the allocation:
    ``world_size`` ranks on ``allocated_nodes``)."""
    rows = _rows(ranks, world_size=world_size, allocated_nodes=allocated_nodes)
    if rows is None:
        return None
    medians = peer_medians([forward for _, _, forward in rows])
    slow = {}
    for (rank, node, forward), peers in zip(rows, medians, strict=True):
        if forward > (1 + STRAGGLER_MARGIN) * peers and forward - peers >= STRAGGLER_MIN_S:
            slow[rank] = (node, forward / peers if peers > 0 else math.inf)
    return slow


def rank_timing_update(
    state: dict[str, Any] | None,
    step: int,
    ranks: Any,
    *,
    world_size: int,
    allocated_nodes: Collection[str],
) -> dict[str, Any]:
    """The job's straggler state after one logged step's ``ranks``, judged within the
    job's allocation (``world_size`` ranks on ``allocated_nodes``, a set: looked up once
    per entry)."""
    state = dict(state or {})
    slow = slow_ranks(ranks, world_size=world_size, allocated_nodes=allocated_nodes)
    if slow is None:
        return state
    previous = state.get("streaks") or {}
    streaks: dict[str, dict[str, Any]] = {}
    for rank, (node, ratio) in slow.items():
        before = previous.get(str(rank)) or {}
        streak = int(before.get("streak", 0)) + 1 if before.get("node") == node else 1
        streaks[str(rank)] = {
            "node": node,
            "streak": streak,
            "ratio": round(ratio, 3) if math.isfinite(ratio) else None,
            "since_step": before.get("since_step", step) if streak > 1 else step,
        }
    state["streaks"] = streaks
    state["at_step"] = step
    state["intervals"] = int(state.get("intervals", 0)) + 1
    return state


def stragglers(state: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The ranks slow for ``STRAGGLER_STREAK`` intervals in a row, with their evidence."""
    found = []
    for rank, item in ((state or {}).get("streaks") or {}).items():
        if isinstance(item, dict) and int(item.get("streak", 0)) >= STRAGGLER_STREAK:
            found.append({"rank": int(rank), **item})
    return sorted(found, key=lambda item: item["rank"])
