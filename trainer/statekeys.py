"""Canonical names of the tensors of a training state, the same for every strategy and
world size: ``model/<parameter>`` and ``optimizer/<parameter>/<entry>`` (``exp_avg``,
``exp_avg_sq``, ``step``). A DDP snapshot keys optimizer state by the parameter's index in
the optimizer (torch's own format), an FSDP snapshot by the parameter's name (the
``torch.distributed.checkpoint.state_dict`` format); both map to the same names here, so
fingerprints, the manifest's sharding table and resharding agree across strategies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# The table of a rank's slices in its checkpoint state (``state["shards"]``).
SHARDS = "shards"
# A tensor held in dim-0 slices by the ranks (FSDP2's ``Shard(0)``) or whole by one rank.
SHARD0 = "shard0"
WHOLE = "whole"


def model_key(name: str) -> str:
    return f"model/{name}"


def optimizer_key(name: str, entry: str) -> str:
    return f"optimizer/{name}/{entry}"


def param_name(index: Any, param_names: list[str]) -> str:
    """The parameter an optimizer-state key stands for: an index into ``param_names``
    (torch's optimizer format) or the parameter's name itself (the FQN-keyed format)."""
    if isinstance(index, int) or (isinstance(index, str) and index.isdigit()):
        position = int(index)
        return param_names[position] if position < len(param_names) else f"#{position}"
    return str(index)


def state_leaves(state: dict[str, Any], param_names: list[str]) -> Iterator[tuple[str, Any]]:
    """(canonical key, value) of every entry of ``model`` and ``optimizer.state`` in a
    rank's state (values may be tensors, tensor references of an index, or scalars)."""
    for name, value in (state.get("model") or {}).items():
        yield model_key(str(name)), value
    optimizer = state.get("optimizer") or {}
    for index, entries in (optimizer.get("state") or {}).items():
        name = param_name(index, param_names)
        for entry, value in entries.items():
            yield optimizer_key(name, str(entry)), value


def group_params(groups: list[dict[str, Any]], param_names: list[str]) -> list[dict[str, Any]]:
    """The optimizer's param groups with parameters named (either format)."""
    return [
        {
            **{k: v for k, v in group.items() if k != "params"},
            "params": [param_name(i, param_names) for i in group.get("params", [])],
        }
        for group in groups
    ]


def row_elements(global_shape: list[int]) -> int:
    """Elements per dim-0 row of a tensor of ``global_shape`` (1 for a vector)."""
    n = 1
    for size in global_shape[1:]:
        n *= int(size)
    return n
