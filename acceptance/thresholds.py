"""busbw thresholds for acceptance: pure, no Django, no torch.

A threshold belongs to a scope: a cluster, a partition (partitions of one cluster may hold
different hardware), a level of the switch tree (``node``: the GPUs of one node; ``leaf``:
nodes under one leaf switch; ``spine``: nodes across leaves) and a collective (``op``, as
``python -m trainer collectives`` names them). Where it comes from, first match wins:

1. ``operator``: a value an operator set for the scope's partition, else for the whole
   cluster (partition None);
2. ``record``: the best certified measurement on record for exactly this scope (same
   cluster, partition, level and op; never another partition's), times ``fraction``
   (default 0.92: providers accept a fabric at ~92% of what it should do);
3. ``theoretical``: a stated theoretical busbw (e.g. from the switch's link speed) times
   ``fraction``;
4. ``none``: no threshold, and a measurement judged against it is ``inconclusive``: it
   neither passes nor fails anything (fail closed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

NODE, LEAF, SPINE = "node", "leaf", "spine"
LEVELS = (NODE, LEAF, SPINE)
DEFAULT_FRACTION = 0.92
OPERATOR, RECORD, THEORETICAL, NONE = "operator", "record", "theoretical", "none"
PASSED, FAILED, INCONCLUSIVE = "passed", "failed", "inconclusive"


@dataclass(frozen=True)
class Scope:
    cluster: str
    partition: str
    level: str
    op: str = "all_reduce"

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"level must be one of {', '.join(LEVELS)}, not {self.level!r}")


@dataclass(frozen=True)
class OperatorThreshold:
    """A busbw (bytes/s) an operator set; ``partition`` None applies to every partition."""

    cluster: str
    partition: str | None
    level: str
    busbw: float
    op: str = "all_reduce"


@dataclass(frozen=True)
class Record:
    """A measurement on record; only ``certified`` ones (from a passed certificate) count."""

    cluster: str
    partition: str
    level: str
    busbw: float
    certified: bool
    op: str = "all_reduce"
    reference: str = ""  # e.g. the certificate's id, shown as the threshold's basis


@dataclass(frozen=True)
class Threshold:
    busbw: float | None
    source: str  # operator | record | theoretical | none
    basis: float | None  # the record or theoretical figure the fraction was applied to
    fraction: float | None
    detail: str


@dataclass(frozen=True)
class Judgement:
    measured: float | None
    threshold: float | None
    verdict: str  # passed | failed | inconclusive
    source: str
    detail: str


def _positive(value: float) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def _operator_value(scope: Scope, values: Iterable[OperatorThreshold]) -> OperatorThreshold | None:
    matching = [
        v
        for v in values
        if v.cluster == scope.cluster and v.level == scope.level and v.op == scope.op
    ]
    for wanted in (scope.partition, None):
        for value in matching:
            if value.partition == wanted:
                if not _positive(value.busbw):
                    raise ValueError(f"operator threshold for {scope} is not a positive busbw")
                return value
    return None


def best_record(scope: Scope, records: Iterable[Record]) -> Record | None:
    """The highest certified busbw on record for exactly this scope."""
    usable = [
        r
        for r in records
        if r.certified
        and _positive(r.busbw)
        and (r.cluster, r.partition, r.level, r.op)
        == (scope.cluster, scope.partition, scope.level, scope.op)
    ]
    return max(usable, key=lambda r: r.busbw, default=None)


def threshold_for(
    scope: Scope,
    *,
    operator: Iterable[OperatorThreshold] = (),
    records: Iterable[Record] = (),
    theoretical: float | None = None,
    fraction: float = DEFAULT_FRACTION,
) -> Threshold:
    """The threshold of ``scope``: operator-set, else best certified record x fraction, else
    theoretical x fraction, else none."""
    if not 0 < fraction <= 1:
        raise ValueError("fraction must be in (0, 1]")
    where = f"{scope.cluster}/{scope.partition} {scope.level} {scope.op}"
    set_by_operator = _operator_value(scope, operator)
    if set_by_operator is not None:
        whole = " (cluster-wide)" if set_by_operator.partition is None else ""
        detail = f"set by an operator for {where}{whole}"
        return Threshold(set_by_operator.busbw, OPERATOR, None, None, detail)
    best = best_record(scope, records)
    if best is not None:
        detail = f"{fraction:g} x the best certified busbw on record for {where}"
        if best.reference:
            detail += f" ({best.reference})"
        return Threshold(best.busbw * fraction, RECORD, best.busbw, fraction, detail)
    if theoretical is not None and _positive(theoretical):
        detail = f"{fraction:g} x the theoretical busbw of {where}"
        return Threshold(theoretical * fraction, THEORETICAL, theoretical, fraction, detail)
    return Threshold(None, NONE, None, None, f"no threshold set or on record for {where}")


def judge(measured: float | None, threshold: Threshold) -> Judgement:
    """passed when measured >= threshold; failed below it, or when the figure is not a
    measurement (NaN, infinite, negative); inconclusive when nothing was measured or there
    is no threshold."""
    limit = threshold.busbw
    if measured is None:
        return Judgement(None, limit, INCONCLUSIVE, threshold.source, "nothing measured")
    if limit is None:
        return Judgement(measured, None, INCONCLUSIVE, threshold.source, threshold.detail)
    if not (isinstance(measured, int | float) and math.isfinite(measured) and measured >= 0):
        return Judgement(None, limit, FAILED, threshold.source, f"not a busbw: {measured!r}")
    verdict = PASSED if measured >= limit else FAILED
    detail = f"{measured / limit:.1%} of the threshold ({threshold.detail})"
    return Judgement(float(measured), limit, verdict, threshold.source, detail)


def level_of(leaves: Iterable[str | None], nodes: int) -> str:
    """The level a collective over ``nodes`` nodes with these leaf switches exercises:
    ``node`` for one node, ``leaf`` when every node hangs off one known leaf, else
    ``spine`` (an unknown leaf switch counts as crossing the spine)."""
    if nodes < 1:
        raise ValueError("a collective needs at least one node")
    if nodes == 1:
        return NODE
    distinct = set(leaves)
    return LEAF if len(distinct) == 1 and None not in distinct else SPINE
