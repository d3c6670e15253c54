"""The sharding table of a checkpoint: which rank holds which slice of every tensor.
Plain JSON in, plain JSON out (no torch): Gantry's integrity panel uses it too.

Each rank's state carries ``shards`` {canonical key: {placement, global_shape, dtype,
start, rows, nbytes}} (``trainer.statekeys``); the writer copies it into the rank's sidecar and
rank 0 merges the sidecars into the manifest's ``sharding``:

    {key: {placement: "shard0"|"whole", global_shape, dtype,
           shards: [{rank, start, rows, nbytes}]}}

``shard0``: the ranks' dim-0 slices tile rows [0, global_shape[0]) exactly once;
``whole``: one rank holds the whole tensor (DDP's rank 0, FSDP's replicated step counts).
``sharding_problems`` checks a table and each rank's own copy against it.
"""

from __future__ import annotations

from typing import Any

from .statekeys import SHARD0, WHOLE


def sharding_table(sidecars: list[dict[str, Any]]) -> dict[str, Any]:
    """The manifest's sharding table from every rank's sidecar (ranks in order)."""
    table: dict[str, Any] = {}
    for info in sidecars:
        for key, entry in sorted((info.get("shards") or {}).items()):
            item = table.setdefault(
                key,
                {
                    "placement": entry["placement"],
                    "global_shape": list(entry["global_shape"]),
                    "dtype": entry["dtype"],
                    "shards": [],
                },
            )
            item["shards"].append(
                {
                    "rank": int(info["rank"]),
                    "start": int(entry.get("start", 0)),
                    "rows": entry.get("rows"),
                    "nbytes": int(entry.get("nbytes", 0)),
                }
            )
    return table


def _tiling_problem(key: str, item: dict[str, Any]) -> str | None:
    shards = item["shards"]
    if item["placement"] == WHOLE:
        if len(shards) != 1:
            return f"{key}: held whole by {len(shards)} ranks, expected exactly one"
        return None
    rows = int(item["global_shape"][0]) if item["global_shape"] else 0
    position = 0
    for shard in sorted(shards, key=lambda s: (int(s["start"]), int(s["rank"]))):
        if int(shard["rows"]) == 0:
            continue
        if int(shard["start"]) != position:
            how = "overlaps" if int(shard["start"]) < position else "leaves a gap before"
            return (
                f"{key}: rank {shard['rank']}'s slice (rows {shard['start']}.."
                f"{int(shard['start']) + int(shard['rows'])}) {how} row {position}"
            )
        position += int(shard["rows"])
    if position != rows:
        return f"{key}: the ranks' slices cover rows 0..{position} of {rows}"
    return None


def sharding_problems(manifest: dict[str, Any], own: dict[int, dict[str, Any]]) -> list[str]:
    """The manifest's table tiles every tensor, and each rank's own ``shards`` (``own``:
    rank → the table in its index) lists exactly the slices the manifest gives that rank."""
    table = manifest.get("sharding") or {}
    problems = [p for key, item in sorted(table.items()) if (p := _tiling_problem(key, item))]
    for rank, mine in sorted(own.items()):
        listed = {
            key: shard
            for key, item in table.items()
            for shard in item["shards"]
            if int(shard["rank"]) == rank
        }
        for key in sorted(set(listed) ^ set(mine)):
            where = "the manifest" if key in listed else f"rank {rank}'s index"
            problems.append(f"rank {rank}: {key} is listed only in {where}")
        for key in sorted(set(listed) & set(mine)):
            saved, held = listed[key], mine[key]
            if (
                list(held["global_shape"]) != list(table[key]["global_shape"])
                or int(held.get("start", 0)) != int(saved["start"])
                or held.get("rows") != saved["rows"]
            ):
                problems.append(
                    f"rank {rank}'s index holds {key} rows {held.get('start', 0)}+"
                    f"{held.get('rows')}, the manifest gives it rows {saved['start']}+"
                    f"{saved['rows']} (a shard of another rank or another layout)"
                )
    return problems


def rank_summary(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Per rank: how many slices and whole tensors it holds and their bytes, and its
    files' bytes (for the integrity panel and ``verify``)."""
    table = manifest.get("sharding") or {}
    ranks: dict[int, dict[str, Any]] = {}
    for f in manifest.get("files", []):
        item = ranks.setdefault(
            int(f["rank"]), {"rank": int(f["rank"]), "slices": 0, "whole": 0, "tensor_bytes": 0}
        )
        item["file_bytes"] = item.get("file_bytes", 0) + int(f["size"])
        item["files"] = item.get("files", 0) + 1
    for item in table.values():
        for shard in item["shards"]:
            entry = ranks.setdefault(
                int(shard["rank"]),
                {"rank": int(shard["rank"]), "slices": 0, "whole": 0, "tensor_bytes": 0},
            )
            entry["slices" if item["placement"] == SHARD0 else "whole"] += 1
            entry["tensor_bytes"] += int(shard["nbytes"])
    return [ranks[r] for r in sorted(ranks)]
