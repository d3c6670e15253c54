"""``trainer.schema`` (the names both sides import) agrees with ``trainer/SCHEMA.md``."""

from __future__ import annotations

import re
from pathlib import Path

from trainer.schema import (
    ACCEPTANCE_SCHEMA,
    CHECKPOINT_FORMAT,
    COLLECTIVES_SCHEMA,
    DRILL_REFERENCE_SCHEMA,
    DRILL_SCHEMA,
    FINGERPRINT_FORMAT,
    METRIC_KEYS,
    RANK_INDEX_FORMAT,
    Event,
    Reason,
    Verdict,
    verdict_for,
)

SCHEMA_MD = (Path(__file__).resolve().parents[2] / "trainer" / "SCHEMA.md").read_text()


def _section(title: str) -> str:
    start = SCHEMA_MD.index(title)
    following = SCHEMA_MD.find("\n## ", start + 1)
    return SCHEMA_MD[start : following if following > 0 else None]


def _first_column(text: str) -> set[str]:
    """Names in the first column of the tables of ``text`` (``| `name` |``)."""
    names = set()
    for row in re.findall(r"^\| ([^|]+) \|", text, re.MULTILINE):
        names.update(re.findall(r"`([a-z_0-9]+)`", row))
    return names


def test_reason_codes_are_the_documented_ones() -> None:
    row = next(line for line in SCHEMA_MD.splitlines() if line.startswith("| `reason_code` |"))
    documented = set(re.findall(r"`([a-z_]+)`", row)) - {"reason_code"}
    assert documented == set(Reason.ALL)
    assert Reason.INTEGRITY < Reason.ALL


def test_events_are_the_documented_ones() -> None:
    metrics = _section("## `<run-dir>/metrics.jsonl`")
    events = metrics[metrics.index("| event | keys |") :]
    assert _first_column(events) - {"event"} == set(Event.ALL)


def test_metric_keys_are_the_documented_ones() -> None:
    metrics = _section("## `<run-dir>/metrics.jsonl`")
    steps = metrics[: metrics.index("| event | keys |")]
    documented = _first_column(steps) - {"key"}
    assert documented == set(METRIC_KEYS)


def test_formats_are_documented() -> None:
    names = (
        CHECKPOINT_FORMAT,
        RANK_INDEX_FORMAT,
        DRILL_SCHEMA,
        DRILL_REFERENCE_SCHEMA,
        FINGERPRINT_FORMAT,
        ACCEPTANCE_SCHEMA,
        COLLECTIVES_SCHEMA,
    )
    for name in names:
        assert name in SCHEMA_MD, name


def test_every_reason_code_has_one_verdict_class() -> None:
    classes = (Reason.FAILED, Reason.INCONCLUSIVE, Reason.ERROR)
    for code in Reason.ALL:
        assert sum(code in c for c in classes) == 1, code
    assert verdict_for(None) == Verdict.PASSED
    assert verdict_for("loss_diverged") == Verdict.FAILED
    assert verdict_for("steps_short") == Verdict.INCONCLUSIVE
    # An unknown code never proves and never blocks: fail closed.
    assert verdict_for("something_new") == Verdict.ERROR
