"""busbw thresholds per cluster/partition, level and op: operator-set, the best certified
record x fraction, theoretical x fraction, or none (inconclusive)."""

from __future__ import annotations

import pytest

from acceptance.thresholds import (
    FAILED,
    INCONCLUSIVE,
    LEAF,
    NODE,
    NONE,
    OPERATOR,
    PASSED,
    RECORD,
    SPINE,
    THEORETICAL,
    OperatorThreshold,
    Record,
    Scope,
    judge,
    level_of,
    threshold_for,
)

GPU_LEAF = Scope("c1", "gpu", LEAF)
RECORDS = [
    Record("c1", "gpu", LEAF, 40e9, certified=True, reference="certificate 7"),
    Record("c1", "gpu", LEAF, 45e9, certified=True, reference="certificate 9"),
    Record("c1", "gpu", LEAF, 90e9, certified=False),  # never certified: ignored
    Record("c1", "gpu", SPINE, 60e9, certified=True),  # another level
    Record("c1", "a100", LEAF, 80e9, certified=True),  # another partition
    Record("c2", "gpu", LEAF, 80e9, certified=True),  # another cluster
    Record("c1", "gpu", LEAF, 70e9, certified=True, op="all_gather"),  # another op
    Record("c1", "gpu", LEAF, float("inf"), certified=True),  # not a figure
]


def test_the_best_certified_record_of_exactly_this_scope_times_the_fraction() -> None:
    t = threshold_for(GPU_LEAF, records=RECORDS)
    assert t.source == RECORD and t.basis == 45e9 and t.fraction == 0.92
    assert t.busbw == pytest.approx(0.92 * 45e9)
    assert "certificate 9" in t.detail
    assert threshold_for(GPU_LEAF, records=RECORDS, fraction=0.8).busbw == pytest.approx(36e9)
    gather = threshold_for(Scope("c1", "gpu", LEAF, "all_gather"), records=RECORDS)
    assert gather.basis == 70e9


def test_an_operator_value_wins_partition_first_then_cluster_wide() -> None:
    operator = [
        OperatorThreshold("c1", None, LEAF, 30e9),
        OperatorThreshold("c1", "gpu", LEAF, 35e9),
        OperatorThreshold("c1", "gpu", SPINE, 20e9),
    ]
    t = threshold_for(GPU_LEAF, operator=operator, records=RECORDS)
    assert (t.source, t.busbw, t.basis) == (OPERATOR, 35e9, None)
    other = threshold_for(Scope("c1", "cpu", LEAF), operator=operator, records=RECORDS)
    assert (other.source, other.busbw) == (OPERATOR, 30e9) and "cluster-wide" in other.detail
    with pytest.raises(ValueError, match="positive"):
        threshold_for(GPU_LEAF, operator=[OperatorThreshold("c1", "gpu", LEAF, 0.0)])


def test_theoretical_then_none() -> None:
    scope = Scope("c1", "gpu", NODE)
    t = threshold_for(scope, records=RECORDS, theoretical=400e9)
    assert t.source == THEORETICAL and t.busbw == pytest.approx(368e9)
    none = threshold_for(scope, records=RECORDS)
    assert none.source == NONE and none.busbw is None
    assert judge(500e9, none).verdict == INCONCLUSIVE  # no threshold: never passes


def test_judging_a_measurement() -> None:
    t = threshold_for(GPU_LEAF, records=RECORDS)
    assert judge(0.92 * 45e9, t).verdict == PASSED
    low = judge(30e9, t)
    assert low.verdict == FAILED and low.threshold == pytest.approx(41.4e9)
    assert low.detail.startswith("72.5% of the threshold")
    assert judge(None, t).verdict == INCONCLUSIVE
    assert judge(float("nan"), t).verdict == FAILED
    assert judge(-1.0, t).verdict == FAILED


def test_levels_and_bad_input() -> None:
    assert level_of(["leaf1"], 1) == NODE
    assert level_of(["leaf1", "leaf1"], 2) == LEAF
    assert level_of(["leaf1", "leaf2"], 2) == SPINE
    assert level_of([None, None], 2) == SPINE  # an unknown leaf counts as crossing the spine
    with pytest.raises(ValueError):
        level_of([], 0)
    with pytest.raises(ValueError, match="level"):
        Scope("c1", "gpu", "rack")
    with pytest.raises(ValueError, match="fraction"):
        threshold_for(GPU_LEAF, fraction=1.5)
