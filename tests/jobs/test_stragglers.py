"""Straggler evidence from the trainer's per-rank timings: a rank slower than its peers'
median by the margin, interval after interval, is named with its node; a malformed line
(the owner writes it) is no evidence either way."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jobs.stragglers import (
    STRAGGLER_STREAK,
    rank_timing_update,
    slow_ranks,
    stragglers,
)


def _ranks(forward: list[float], nodes: list[str] | None = None) -> list[list[Any]]:
    nodes = nodes or [f"node-{i // 2}" for i in range(len(forward))]
    return [[rank, nodes[rank], f, f * 3] for rank, f in enumerate(forward)]


def test_a_rank_slower_than_its_peers_by_the_margin_is_slow() -> None:
    assert slow_ranks(_ranks([0.010, 0.011, 0.010, 0.030])) == {3: ("node-1", 3.0)}
    # Within the margin, or only a hair slower in absolute terms: not slow.
    assert slow_ranks(_ranks([0.010, 0.011, 0.010, 0.014])) == {}
    assert slow_ranks(_ranks([0.0001, 0.0001, 0.0003, 0.0001])) == {}


@pytest.mark.parametrize(
    "ranks",
    [
        None,
        "fast",
        [[0, "a", 0.1, 0.2]],
        [[0, "a", 0.1, 0.2], [0, "b", 0.3, 0.4]],
        [[0, "a", 0.1, 0.2], [1, "b", float("nan"), 0.4]],
        [[0, "a", 0.1, 0.2], [1, "b", -1, 0.4]],
        [[0, "a", 0.1, 0.2], [True, "b", 0.3, 0.4]],
        [[0, "a", 0.1, 0.2], [1, ["b"], 0.3, 0.4]],
        [[0, "a", 0.1], [1, "b", 0.3]],
        [[0, "a" * 200, 0.1, 0.2], [1, "b", 0.3, 0.4]],
    ],
)
def test_a_malformed_line_is_no_evidence(ranks: Any) -> None:
    assert slow_ranks(ranks) is None
    state = {"streaks": {"1": {"node": "b", "streak": 4, "since_step": 10}}}
    assert rank_timing_update(state, 50, ranks) == state


def test_a_rank_slow_interval_after_interval_becomes_a_straggler() -> None:
    state: dict[str, Any] | None = None
    for interval in range(STRAGGLER_STREAK - 1):
        state = rank_timing_update(state, 10 * interval, _ranks([0.01, 0.01, 0.03, 0.01]))
    assert stragglers(state) == []
    state = rank_timing_update(state, 1000, _ranks([0.01, 0.01, 0.03, 0.01]))
    [found] = stragglers(state)
    assert found["rank"] == 2 and found["node"] == "node-1"
    assert found["streak"] == STRAGGLER_STREAK and found["since_step"] == 0


def test_one_normal_interval_ends_a_streak() -> None:
    state: dict[str, Any] | None = None
    for interval in range(STRAGGLER_STREAK * 2):
        forward = [0.01, 0.01, 0.01, 0.01] if interval % 3 == 2 else [0.01, 0.01, 0.03, 0.01]
        state = rank_timing_update(state, interval, _ranks(forward))
    assert stragglers(state) == []


def test_ingest_keeps_the_state_on_the_job(db: Any) -> None:
    from factories import JobFactory
    from jobs.ingest import metrics_ingest

    job = JobFactory(state="running")
    ranks = [[0, "gpu-a", 0.01, 0.05], [1, "gpu-b", 0.04, 0.05]]
    lines = b"".join(
        (json.dumps({"step": step, "time": 1.7e9, "loss": 2.0, "ranks": ranks}) + "\n").encode()
        for step in range(1, STRAGGLER_STREAK + 1)
    )
    metrics_ingest(job=job, data=lines, start_offset=0)
    job.refresh_from_db()
    [found] = stragglers(job.rank_timing)
    assert found["node"] == "gpu-b" and found["streak"] == STRAGGLER_STREAK
