"""Straggler evidence from the trainer's per-rank timings (``ranks`` in a logged step:
``[rank, node, forward_s, step_s]`` per rank, means over the log interval). A rank is slow
in an interval when its forward time (its own work, before any collective) is more than
``STRAGGLER_MARGIN`` above the median of its peers' and at least ``STRAGGLER_MIN_S`` more;
one slow in ``STRAGGLER_STREAK`` consecutive intervals is a straggler, named with its node.

Pure: ingest keeps the running state on the job (``Job.rank_timing``), recovery reads it.
Everything in a line is the job owner's to write: shapes are checked, sizes bounded, and a
line that does not parse is no evidence (it neither starts nor ends a streak).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

STRAGGLER_MARGIN = 0.5
STRAGGLER_MIN_S = 0.002
STRAGGLER_STREAK = 10
# The most ranks a line may list (more is not read).
MAX_RANKS = 65536


def _rows(ranks: Any) -> list[tuple[int, str, float]] | None:
    """(rank, node, forward_s) of a well-formed ``ranks`` value, else None."""
    if not isinstance(ranks, list) or not 2 <= len(ranks) <= MAX_RANKS:
        return None
    rows = []
    for row in ranks:
        if not (isinstance(row, list) and len(row) == 4):
            return None
        rank, node, forward, _step = row
        if type(rank) is not int or not isinstance(node, str) or len(node) > 128:
            return None
        if type(forward) not in (int, float) or not math.isfinite(forward) or forward < 0:
            return None
        rows.append((rank, node, float(forward)))
    if len({rank for rank, _, _ in rows}) != len(rows):
        return None
    return rows


def slow_ranks(ranks: Any) -> dict[int, tuple[str, float]] | None:
    """rank -> (node, its forward time over its peers' median) for each slow rank of one
    interval; None when the line is no evidence."""
    rows = _rows(ranks)
    if rows is None:
        return None
    slow = {}
    for rank, node, forward in rows:
        peers = statistics.median(f for r, _, f in rows if r != rank)
        if forward > (1 + STRAGGLER_MARGIN) * peers and forward - peers >= STRAGGLER_MIN_S:
            slow[rank] = (node, forward / peers if peers > 0 else math.inf)
    return slow


def rank_timing_update(state: dict[str, Any] | None, step: int, ranks: Any) -> dict[str, Any]:
    """The job's straggler state after one logged step's ``ranks``."""
    state = dict(state or {})
    slow = slow_ranks(ranks)
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
