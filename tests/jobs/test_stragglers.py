"""Straggler evidence from the trainer's per-rank timings: a rank slower than its peers'
median by the margin, interval after interval, is named with its node; a malformed line
(the owner writes it) is no evidence either way, nor is one outside the job's allocation
(more ranks than its world size, a rank listed twice, a node Slurm did not give it). The
check costs a sort, not a median per rank."""

from __future__ import annotations

import json
import math
import random
import signal
import statistics
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs import stragglers as straggler_module
from jobs.stragglers import (
    MAX_RANKS,
    STRAGGLER_STREAK,
    peer_medians,
    slow_ranks,
    stragglers,
)

# The allocation the lines below are judged in: 4 ranks, two per node.
WORLD = 4
ALLOCATED = frozenset({"node-0", "node-1"})


def _ranks(forward: list[float], nodes: list[str] | None = None) -> list[list[Any]]:
    nodes = nodes or [f"node-{i // 2}" for i in range(len(forward))]
    return [[rank, nodes[rank], f, f * 3] for rank, f in enumerate(forward)]


def _slow(ranks: Any, world_size: int = WORLD, nodes: frozenset[str] = ALLOCATED) -> Any:
    return slow_ranks(ranks, world_size=world_size, allocated_nodes=nodes)


def rank_timing_update(
    state: Any, step: int, ranks: Any, world_size: int = WORLD, nodes: frozenset[str] = ALLOCATED
) -> Any:
    return straggler_module.rank_timing_update(
        state, step, ranks, world_size=world_size, allocated_nodes=nodes
    )


def test_a_rank_slower_than_its_peers_by_the_margin_is_slow() -> None:
    assert _slow(_ranks([0.010, 0.011, 0.010, 0.030])) == {3: ("node-1", 3.0)}
    # Within the margin, or only a hair slower in absolute terms: not slow.
    assert _slow(_ranks([0.010, 0.011, 0.010, 0.014])) == {}
    assert _slow(_ranks([0.0001, 0.0001, 0.0003, 0.0001])) == {}


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
    assert _slow(ranks) is None
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

    job = JobFactory(state="running", nodes=2, tasks_per_node=1, allocated_nodes="gpu-a,gpu-b")
    ranks = [[0, "gpu-a", 0.01, 0.05], [1, "gpu-b", 0.04, 0.05]]
    lines = b"".join(
        (json.dumps({"step": step, "time": 1.7e9, "loss": 2.0, "ranks": ranks}) + "\n").encode()
        for step in range(1, STRAGGLER_STREAK + 1)
    )
    metrics_ingest(job=job, data=lines, start_offset=0)
    job.refresh_from_db()
    [found] = stragglers(job.rank_timing)
    assert found["node"] == "gpu-b" and found["streak"] == STRAGGLER_STREAK


# ------------------------------------------------------------ within the allocation


def test_a_forged_straggler_on_a_node_outside_the_allocation_is_no_evidence() -> None:
    """The job names a node of the cluster that Slurm did not give it: nothing is slow,
    and the streak it had stays as it was (neither started nor ended)."""
    forged = _ranks([0.01, 0.01, 0.01, 0.05], ["node-0", "node-0", "node-1", "someone-elses"])
    assert _slow(forged) is None
    state = {"streaks": {"1": {"node": "node-0", "streak": 4, "since_step": 10}}}
    assert rank_timing_update(state, 50, forged) == state
    # The same timings on the job's own nodes are evidence.
    assert _slow(_ranks([0.01, 0.01, 0.01, 0.05])) == {3: ("node-1", 5.0)}


@pytest.mark.parametrize(
    ("ranks", "why"),
    [
        ([[0, "node-0", 0.01, 0.1], [4, "node-1", 0.05, 0.1]], "a rank at the world size"),
        ([[0, "node-0", 0.01, 0.1], [-1, "node-1", 0.05, 0.1]], "a negative rank"),
        (_ranks([0.01] * (WORLD + 1), ["node-0"] * (WORLD + 1)), "more entries than ranks"),
        ([[0, "node-0", 0.01, 0.1], [1, "node-1", 0.05, 0.1], [1, "node-1", 0.01, 0.1]], "dup"),
    ],
)
def test_a_line_beyond_the_world_size_or_with_a_duplicate_rank_is_no_evidence(
    ranks: Any, why: str
) -> None:
    assert _slow(ranks) is None, why
    state = {"streaks": {"1": {"node": "node-1", "streak": 4, "since_step": 10}}}
    assert rank_timing_update(state, 50, ranks) == state


def test_no_allocation_known_means_no_evidence() -> None:
    assert _slow(_ranks([0.01, 0.01, 0.01, 0.05]), nodes=frozenset()) is None


def test_the_cap_holds_whatever_the_world_size() -> None:
    line = _ranks([0.01] * (MAX_RANKS + 1), ["node-0"] * (MAX_RANKS + 1))
    assert _slow(line, world_size=MAX_RANKS + 10) is None


# ------------------------------------------------------------------- peers' median


@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=2, max_size=60))
@settings(max_examples=300, deadline=None)
def test_peer_medians_are_the_median_of_everyone_else(values: list[float]) -> None:
    """To the bit, the naive definition: ``statistics.median`` of all but one."""
    expected = [statistics.median(values[:i] + values[i + 1 :]) for i in range(len(values))]
    assert peer_medians(values) == expected


@given(st.lists(st.sampled_from([0.0, 0.01, 0.02, 0.5]), min_size=2, max_size=12))
def test_peer_medians_with_many_ties(values: list[float]) -> None:
    expected = [statistics.median(values[:i] + values[i + 1 :]) for i in range(len(values))]
    assert peer_medians(values) == expected


def _seconds(work: Any, repeat: int = 3) -> float:
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def test_a_line_of_fifty_thousand_ranks_costs_a_sort_not_a_median_per_rank() -> None:
    """Measured against its own baseline on this machine (never a clock budget): decoding
    the line and sorting its forward times. A median per rank (the old check) is
    quadratic and runs thousands of times that; the alarm set at a multiple of the
    baseline stops it rather than letting it hold the suite."""
    count = 50_000
    rng = random.Random(37)
    nodes = [f"n{rank // 8}" for rank in range(count)]
    forward = [0.01 + rng.random() * 0.001 for _ in range(count)]
    forward[123] = 0.5
    text = json.dumps(_ranks(forward, nodes))
    allocated = frozenset(nodes)

    def baseline() -> None:
        decoded = json.loads(text)
        sorted(row[2] for row in decoded)

    base = _seconds(baseline)
    ranks = json.loads(text)
    ratio_allowed = 40

    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, max(base * ratio_allowed * 5, 0.5))
    try:
        found: Any = None

        def judge() -> None:
            nonlocal found
            found = slow_ranks(ranks, world_size=count, allocated_nodes=allocated)

        took = _seconds(judge, repeat=1)
    except TimeoutError:
        pytest.fail(f"the check of {count} ranks ran past {ratio_allowed * 5}× its baseline")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert found == {
        123: ("n15", pytest.approx(0.5 / statistics.median(forward[:123] + forward[124:])))
    }
    assert took < ratio_allowed * base, (took, base)
