"""The manifest's sharding table (``trainer.sharding``, plain JSON): built from the ranks'
sidecars, checked for tiling, and each rank's own table against it."""

from __future__ import annotations

import copy
from typing import Any

from trainer.sharding import rank_summary, sharding_problems, sharding_table


def _slice(start: int, rows: int, total: int = 10) -> dict[str, Any]:
    return {
        "placement": "shard0",
        "global_shape": [total, 3],
        "dtype": "float32",
        "start": start,
        "rows": rows,
        "nbytes": rows * 12,
    }


STEP = {"placement": "whole", "global_shape": [], "dtype": "float32", "nbytes": 4}


def _manifest(*slices: tuple[int, dict[str, Any]]) -> tuple[dict[str, Any], dict[int, Any]]:
    own: dict[int, dict[str, Any]] = {}
    for rank, entry in slices:
        own.setdefault(rank, {})["model/w"] = entry
    own[0]["optimizer/w/step"] = STEP
    sidecars = [{"rank": r, "shards": own[r]} for r in sorted(own)]
    files = [
        {"name": f"rank-{r:05d}-0000.bin", "rank": r, "role": "data", "size": 100}
        for r in sorted(own)
    ]
    return {"sharding": sharding_table(sidecars), "files": files}, own


def test_a_tiling_table_has_no_problems_and_sums_per_rank():
    manifest, own = _manifest((0, _slice(0, 5)), (1, _slice(5, 5)))
    assert manifest["sharding"]["model/w"]["shards"] == [
        {"rank": 0, "start": 0, "rows": 5, "nbytes": 60},
        {"rank": 1, "start": 5, "rows": 5, "nbytes": 60},
    ]
    assert sharding_problems(manifest, own) == []
    summary = rank_summary(manifest)
    assert [(r["rank"], r["slices"], r["whole"], r["tensor_bytes"]) for r in summary] == [
        (0, 1, 1, 64),
        (1, 1, 0, 60),
    ]


def test_gaps_overlaps_and_short_tables_are_named():
    gap, own = _manifest((0, _slice(0, 4)), (1, _slice(5, 5)))
    assert sharding_problems(gap, own) == [
        "model/w: rank 1's slice (rows 5..10) leaves a gap before row 4"
    ]
    overlap, own = _manifest((0, _slice(0, 6)), (1, _slice(5, 5)))
    assert sharding_problems(overlap, own) == [
        "model/w: rank 1's slice (rows 5..10) overlaps row 6"
    ]
    short, own = _manifest((0, _slice(0, 5)), (1, _slice(5, 4)))
    assert sharding_problems(short, own) == ["model/w: the ranks' slices cover rows 0..9 of 10"]


def test_a_rank_holding_another_ranks_rows_is_named():
    manifest, own = _manifest((0, _slice(0, 5)), (1, _slice(5, 5)))
    swapped = copy.deepcopy(own)
    swapped[0]["model/w"], swapped[1]["model/w"] = own[1]["model/w"], own[0]["model/w"]
    problems = sharding_problems(manifest, swapped)
    assert len(problems) == 2
    assert problems[0].startswith("rank 0's index holds model/w rows 5+5, the manifest gives")
    del swapped[1]["model/w"]
    assert "rank 1: model/w is listed only in the manifest" in sharding_problems(manifest, swapped)
