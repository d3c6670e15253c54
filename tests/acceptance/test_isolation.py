"""Bad-node isolation by group testing against a simulated bottleneck fabric."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import pytest
from isolation_support import HEALTHY_RATE, Bottleneck, fabric, thresholds

from acceptance.isolation import (
    BISECT,
    CONFIRM,
    CONVICTED,
    INCONCLUSIVE,
    LEAF,
    REPEAT,
    SCREEN,
    SPINE,
    Group,
    Isolation,
    isolate,
    thresholds_by_level,
)


def run(leaves: dict[str, list[str]], slow: dict[str, float], **kw: object) -> Isolation:
    model = Bottleneck(leaves, slow, **kw)  # type: ignore[arg-type]
    result = isolate(leaves, model.busbw, thresholds())
    _rounds_are_disjoint(result)
    return result


def _rounds_are_disjoint(result: Isolation) -> None:
    """Every round measures disjoint groups: they can run as parallel jobs."""
    by_round: dict[int, list[str]] = defaultdict(list)
    for m in result.measurements:
        by_round[m.round].extend(m.group)
    assert sorted(by_round) == list(range(1, result.rounds + 1))
    for nodes in by_round.values():
        assert len(nodes) == len(set(nodes))


def _evidence_convicts(result: Isolation, node: str) -> None:
    finding = next(f for f in result.findings if f.node == node)
    assert finding.verdict == CONVICTED and finding.evidence
    for m in finding.evidence:
        assert node in m.group and not m.passed and m.busbw < m.threshold
    confirm = [m for m in finding.evidence if m.purpose == CONFIRM]
    assert len(confirm) == 1 and len(confirm[0].group) == 2
    buddy = next(n for n in confirm[0].group if n != node)
    assert buddy in result.cleared


def _bound(leaves: int, leaf_size: int, bad: int) -> int:
    """Screening, then per bad node two measurements per bisection level and the
    confirmation of the last pair's two members."""
    return leaves + bad * 2 * math.ceil(math.log2(leaf_size))


@pytest.mark.parametrize(("nodes", "leaf_size"), [(8, 8), (64, 8), (256, 16), (1024, 16)])
def test_one_bad_node_is_convicted_with_its_evidence(nodes: int, leaf_size: int) -> None:
    leaves = fabric(nodes, leaf_size)
    bad = f"n{nodes * 5 // 7:04d}"
    result = run(leaves, {bad: 0.5})
    assert result.convicted == [bad] and result.inconclusive == []
    _evidence_convicts(result, bad)
    purposes = [m.purpose for m in next(f for f in result.findings).evidence]
    assert purposes[0] == SCREEN and BISECT in purposes and purposes[-1] == CONFIRM
    assert result.jobs <= _bound(len(leaves), leaf_size, 1)
    assert result.rounds <= 1 + math.ceil(math.log2(leaf_size))
    assert set(result.cleared) == {n for m in leaves.values() for n in m} - {bad}


def test_all_healthy_convicts_nobody_in_one_round() -> None:
    leaves = fabric(256, 16)
    result = run(leaves, {})
    assert result.findings == [] and result.rounds == 1 and result.jobs == 16
    assert all(m.purpose == SCREEN and m.level == LEAF for m in result.measurements)


def test_several_bad_nodes_in_one_leaf_and_across_leaves() -> None:
    leaves = fabric(128, 16)
    slow = {"n0003": 0.5, "n0012": 0.7, "n0040": 0.3, "n0100": 0.6, "n0101": 0.6}
    result = run(leaves, slow)
    assert result.convicted == sorted(slow)
    for node in slow:
        _evidence_convicts(result, node)
    assert result.jobs <= _bound(len(leaves), 16, len(slow))


def test_a_whole_bad_leaf_is_convicted_against_buddies_elsewhere() -> None:
    leaves = fabric(32, 8)
    slow = dict.fromkeys(leaves["leaf002"], 0.4)
    result = run(leaves, slow)
    assert result.convicted == leaves["leaf002"] and result.suspect_leaves == ["leaf002"]
    for node in slow:
        _evidence_convicts(result, node)
        confirm = next(f for f in result.findings if f.node == node).evidence[-1]
        assert confirm.level == SPINE and confirm.threshold == thresholds()[SPINE]


def test_a_leaf_of_one_node_is_confirmed_across_the_spine() -> None:
    leaves = {**fabric(16, 8), "lonely": ["solo"]}
    bad = run(leaves, {"solo": 0.5})
    assert bad.convicted == ["solo"] and bad.suspect_leaves == []
    finding = bad.findings[0]
    assert [m.purpose for m in finding.evidence] == [CONFIRM]
    assert finding.evidence[0].level == SPINE
    healthy = run(leaves, {})
    assert healthy.findings == [] and "solo" in healthy.cleared


def test_no_healthy_buddy_is_inconclusive_never_convicted() -> None:
    pair = {"leafA": ["a1", "a2"]}
    result = run(pair, {"a2": 0.5})
    assert result.convicted == [] and result.inconclusive == ["a1", "a2"]
    assert all("no known-healthy node" in f.reason for f in result.findings)
    everyone_bad = run(fabric(8, 8), dict.fromkeys(fabric(8, 8)["leaf000"], 0.5))
    assert everyone_bad.convicted == [] and len(everyone_bad.inconclusive) == 8
    alone = run({"l": ["only"]}, {"only": 0.5})
    assert alone.inconclusive == ["only"] and alone.jobs == 0


def test_noise_convicts_no_healthy_node_and_still_finds_the_bad_one() -> None:
    leaves = fabric(64, 8)
    false_convictions, jobs = 0, []
    for seed in range(200):
        result = run(leaves, {}, noise=0.02, seed=seed)
        false_convictions += len(result.convicted)
        jobs.append(result.jobs)
    assert false_convictions == 0
    assert max(jobs) > 8  # noise made some measurement borderline: it was repeated
    for seed in range(50):
        result = run(leaves, {"n0030": 0.5}, noise=0.02, seed=seed)
        assert result.convicted == ["n0030"], seed


def test_a_borderline_measurement_is_repeated_once_and_the_better_one_counts() -> None:
    limit = thresholds()[LEAF]
    values = iter([limit * 0.97, limit * 1.01])  # borderline fail, then a pass

    def measure(group: Group) -> float:
        return next(values)

    result = isolate({"l": ["a", "b"]}, measure, thresholds())
    assert result.findings == [] and result.cleared == ["a", "b"]
    assert [m.purpose for m in result.measurements] == [SCREEN, REPEAT]
    assert [m.passed for m in result.measurements] == [False, True] and result.rounds == 2
    clear_fail = isolate({"l": ["a", "b"]}, lambda g: limit * 0.5, thresholds())
    assert [m.purpose for m in clear_fail.measurements] == [SCREEN]  # not borderline


def test_a_group_failing_while_both_halves_pass_is_unexplained() -> None:
    leaves = fabric(8, 8)

    def measure(group: Group) -> float:
        return HEALTHY_RATE * (0.5 if len(group) == 8 else 1.0)  # e.g. the leaf's uplink

    result = isolate(leaves, measure, thresholds())
    assert result.findings == [] and len(result.unexplained) == 1
    assert result.unexplained[0][0].group == tuple(leaves["leaf000"])


def test_measure_round_gets_each_round_at_once() -> None:
    leaves = fabric(64, 8)
    model = Bottleneck(leaves, {"n0009": 0.5, "n0050": 0.5})
    batches: list[list[Group]] = []

    def measure_round(groups: list[Group]) -> Sequence[float]:
        batches.append(groups)
        return [model.busbw(g) for g in groups]

    result = isolate(leaves, None, thresholds(), measure_round=measure_round)
    assert result.convicted == ["n0009", "n0050"]
    assert len(batches) == result.rounds and sum(map(len, batches)) == result.jobs
    assert len(batches[0]) == 8


def test_jobs_grow_with_log_n_per_bad_node_not_n_squared() -> None:
    for nodes in (64, 256, 1024):
        leaves = fabric(nodes, 16)
        slow = {f"n{i:04d}": 0.5 for i in range(5, nodes, nodes // 4)}  # 4 bad, 4 leaves
        result = run(leaves, slow)
        assert result.convicted == sorted(slow)
        assert result.jobs <= _bound(len(leaves), 16, 4) < nodes * (nodes - 1) // 2
        assert result.jobs - len(leaves) <= 4 * 2 * math.log2(16)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="two leaves"):
        isolate({"a": ["x", "y"], "b": ["y"]}, lambda g: 1.0, 0.5)
    with pytest.raises(ValueError, match="spine"):
        thresholds_by_level({LEAF: 1.0})
    with pytest.raises(ValueError, match="positive"):
        thresholds_by_level(float("nan"))
    with pytest.raises(ValueError, match="exactly one"):
        isolate({"a": ["x", "y"]}, None, 0.5)
    with pytest.raises(ValueError, match="no nodes"):
        isolate({}, lambda g: 1.0, 0.5)


def test_a_crashed_measurement_counts_as_zero() -> None:
    result = isolate(
        {"a": ["x", "y", "z"], "b": ["w", "v"]},
        lambda g: float("nan") if "x" in g else HEALTHY_RATE,
        thresholds(),
    )
    assert result.convicted == ["x"]
    assert next(f for f in result.findings).evidence[0].busbw == 0.0
    assert INCONCLUSIVE not in {f.verdict for f in result.findings}
