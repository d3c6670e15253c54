"""Kinds of damage to a checkpoint, for the drill tests and the corruption-coverage suite.

File damage breaks what the manifest says (a truncated, missing or flipped file, a missing
or foreign manifest, a partial directory, the whole directory swapped for another complete
checkpoint of the run). State damage keeps every hash valid: the rank's state is loaded,
changed, written again in the trainer's format, and its sidecar and the manifest are
rewritten with the new sizes and sha256. After Gantry registered the checkpoint, that new
manifest is not the registered one (``not_as_registered``); a kind marked
``registered_as_written`` is damage from before registration (the trainer wrote bad state
with valid hashes, and Gantry registered that manifest), which only a comparison with the
state Gantry recorded at save time can catch: the tests register the damaged manifest
(``registered_digest``) before drilling it. Each kind names the verdict class a drill must
reach. Plain torch and the trainer's checkpoint module: no Django.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer import checkpoint as ck
from trainer.schema import manifest_digest


def _manifest(d: Path) -> dict[str, Any]:
    return json.loads((d / "manifest.json").read_text())


def registered_digest(d: Path) -> str:
    """The digest Gantry registers for the checkpoint in ``d`` (``jobs.ingest``), as the
    manifest there says now."""
    return manifest_digest(_manifest(d))


def _write_manifest(d: Path, manifest: dict[str, Any]) -> None:
    ck.atomic_write_json(str(d / "manifest.json"), manifest)


def rewrite_rank(d: Path, rank: int, mutate: Callable[[dict[str, Any]], None]) -> None:
    """Load ``rank``'s state, ``mutate`` it in place, write it back in the trainer's format
    and make the sidecar and the manifest agree (every size and sha256 valid)."""
    manifest = _manifest(d)
    state, _, _ = ck.load_rank(str(d), manifest, rank)
    mutate(state)
    for entry in [f for f in manifest["files"] if int(f["rank"]) == rank]:
        (d / entry["name"]).unlink(missing_ok=True)
    files = ck.save_rank(state, str(d), rank)
    keys = sorted(state.keys())
    sidecar = d / ck.sidecar_name(rank)
    if sidecar.exists():
        info = json.loads(sidecar.read_text())
        info.update(files=files, keys=keys)
        ck.atomic_write_json(str(sidecar), info)
    others = [f for f in manifest["files"] if int(f["rank"]) != rank]
    mine = [
        {
            "name": x["name"],
            "rank": rank,
            "role": x["role"],
            "size": x["size"],
            "sha256": x["sha256"],
            **({"keys": keys} if x["role"] == "index" else {}),
        }
        for x in files
    ]
    manifest["files"] = sorted(
        others + mine, key=lambda f: (int(f["rank"]), f["role"] != "index", f["name"])
    )
    manifest["total_bytes"] = sum(int(f["size"]) for f in manifest["files"])
    _write_manifest(d, manifest)


def _scale_weights(state: dict[str, Any]) -> None:
    for value in state["model"].values():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            value.mul_(1.01)


def _moments(state: dict[str, Any]) -> None:
    for entries in state["optimizer"]["state"].values():
        entries["exp_avg_sq"].mul_(1.5)


def _step_counts(state: dict[str, Any]) -> None:
    for entries in state["optimizer"]["state"].values():
        entries["step"].add_(7)


def _scheduler(state: dict[str, Any]) -> None:
    state["scheduler"]["last_epoch"] += 5
    state["scheduler"]["_step_count"] += 5


def _data_position(state: dict[str, Any]) -> None:
    state["data"]["samples_consumed"] += state["data"]["global_batch"]
    state["data"]["rank_next_sample"] += state["data"]["global_batch"]


def _rng(state: dict[str, Any]) -> None:
    state["rng"]["torch"] = torch.Generator().manual_seed(987654).get_state()


def _wrong_shape(state: dict[str, Any]) -> None:
    entries = next(iter(state["optimizer"]["state"].values()))
    entries["exp_avg"] = entries["exp_avg"].reshape(-1)[:-1].clone()


def _missing_key(state: dict[str, Any]) -> None:
    del state["optimizer"]


# ---------------------------------------------------------------- file damage


def _data_files(d: Path, rank: int = 0) -> list[Path]:
    return sorted(d.glob(f"rank-{rank:05d}-*.bin"))


def truncate(d: Path, other: Path) -> None:
    path = _data_files(d)[0]
    with open(path, "r+b") as fh:
        fh.truncate(max(0, path.stat().st_size // 2))


def missing_rank_file(d: Path, other: Path) -> None:
    manifest = _manifest(d)
    rank = max(int(f["rank"]) for f in manifest["files"])
    (d / ck.rank_file_name(rank)).unlink()


def missing_data_file(d: Path, other: Path) -> None:
    _data_files(d)[-1].unlink()


def flipped_byte(d: Path, other: Path) -> None:
    path = _data_files(d)[0]
    with open(path, "r+b") as fh:
        fh.seek(path.stat().st_size // 3)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0x10]))


def manifest_missing(d: Path, other: Path) -> None:
    (d / "manifest.json").unlink()


def foreign_manifest(d: Path, other: Path) -> None:
    shutil.copyfile(other / "manifest.json", d / "manifest.json")


def swapped_for_another_step(d: Path, other: Path) -> None:
    """The directory's files replaced by another step's checkpoint of the same run: complete
    and self-consistent (every file, size, sha256, sidecar and the manifest valid), only
    not the checkpoint Gantry registered at this step. The manifest goes in last, as the
    trainer writes it."""
    for path in d.iterdir():
        path.unlink()
    for path in sorted(other.iterdir(), key=lambda p: p.name == "manifest.json"):
        shutil.copyfile(path, d / path.name)


def partial_directory(d: Path, other: Path) -> None:
    """Half the files of a save: what a crash mid-write leaves, with a manifest that
    lists them all."""
    for path in _data_files(d)[::2]:
        path.unlink()
    for path in d.glob("rank-*.json"):
        path.unlink()


def other_step_rank_files(d: Path, other: Path) -> None:
    """Rank 0's files copied from another step, the manifest's hashes made to match."""
    manifest = _manifest(d)
    theirs = _manifest(other)
    for entry in [f for f in manifest["files"] if int(f["rank"]) == 0]:
        (d / entry["name"]).unlink()
    mine = [f for f in theirs["files"] if int(f["rank"]) == 0]
    for entry in mine:
        shutil.copyfile(other / entry["name"], d / entry["name"])
    manifest["files"] = mine + [f for f in manifest["files"] if int(f["rank"]) != 0]
    manifest["total_bytes"] = sum(int(f["size"]) for f in manifest["files"])
    _write_manifest(d, manifest)


# ---------------------------------------------------------------- sharded (FSDP) damage


def _last_rank(d: Path) -> int:
    return int(_manifest(d)["world_size"]) - 1


def shard_missing(d: Path, other: Path) -> None:
    """One rank's shard gone: the data files of the last rank deleted."""
    for path in _data_files(d, _last_rank(d)):
        path.unlink()


def _sharded_slot(state: dict[str, Any], key: str) -> tuple[dict[str, Any], str]:
    """The dict and key that hold the tensor ``key`` (``model/<p>``,
    ``optimizer/<p>/<entry>``) of an FSDP rank's state (optimizer state by name)."""
    kind, rest = key.split("/", 1)
    if kind == "model":
        return state["model"], rest
    name, entry = rest.rsplit("/", 1)
    return state["optimizer"]["state"][name], entry


def shards_swapped(d: Path, other: Path) -> None:
    """Rank 0 and rank 1 hold each other's slices of every sharded tensor; both ranks'
    files are written again, so every size, sha256, sidecar and the manifest are valid,
    and each rank's shard table still says it holds its own rows."""
    manifest = _manifest(d)
    states = {r: ck.load_rank(str(d), manifest, r)[0] for r in (0, 1)}

    def take_from(theirs: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
        def mutate(state: dict[str, Any]) -> None:
            for key, entry in state["shards"].items():
                if entry["placement"] != "shard0":
                    continue
                mine, slot = _sharded_slot(state, key)
                source, other_slot = _sharded_slot(theirs, key)
                assert mine[slot].shape == source[other_slot].shape, key
                mine[slot] = source[other_slot].clone()

        return mutate

    rewrite_rank(d, 0, take_from(states[1]))
    rewrite_rank(d, 1, take_from(states[0]))


def shard_of_another_step(d: Path, other: Path) -> None:
    """The last rank's data files (its shard) copied from another step of the same run,
    the manifest's sizes and sha256 made to match; its index is this step's."""
    rank = _last_rank(d)
    manifest = _manifest(d)
    by_name = {f["name"]: f for f in manifest["files"]}
    for path in _data_files(d, rank):
        shutil.copyfile(other / path.name, path)
        digest, size = ck.sha256_file(str(path))
        by_name[path.name].update(sha256=digest, size=size)
    manifest["total_bytes"] = sum(int(f["size"]) for f in manifest["files"])
    _write_manifest(d, manifest)


def _state(mutate: Callable[[dict[str, Any]], None]) -> Callable[[Path, Path], None]:
    def damage(d: Path, other: Path) -> None:
        rewrite_rank(d, 0, mutate)

    return damage


@contextlib.contextmanager
def as_owner(d: Path) -> Iterator[None]:
    """Whatever the block writes under ``d`` ends up owned by ``d``'s owner, as if the
    owner had done it (the tests run as root; a file root owns in a researcher's run
    directory is nothing the owner could make, and the owner's grants cannot cover it)."""
    owner = d.stat() if d.exists() else None
    yield
    if owner is None or not d.exists():
        return
    for path in [d, *d.rglob("*")]:
        with contextlib.suppress(FileNotFoundError):
            os.chown(path, owner.st_uid, owner.st_gid, follow_symlinks=False)


def _owned(apply: Callable[[Path, Path], None]) -> Callable[[Path, Path], None]:
    def damage(d: Path, other: Path) -> None:
        with as_owner(d):
            apply(d, other)

    return damage


@dataclass(frozen=True)
class Damage:
    name: str
    apply: Callable[[Path, Path], None]
    # The verdict a drill must reach, and the reason codes that are right for it.
    verdict: str
    codes: frozenset[str]
    # Applies to the checkpoint on the cluster (False: to Gantry's reference instead).
    on_files: bool = True
    # Needs a sharded (FSDP) checkpoint of at least 2 ranks.
    sharded: bool = False
    # The reason must contain one of these (it names the shard or the rank at fault).
    names: tuple[str, ...] = ()
    # Damage from before Gantry registered the checkpoint: drill it with the damaged
    # manifest registered (``registered_digest``), as Gantry would have registered it.
    registered_as_written: bool = False

    def named_in(self, reason: str | None) -> bool:
        return not self.names or any(name in (reason or "") for name in self.names)

    def __post_init__(self) -> None:
        object.__setattr__(self, "apply", _owned(self.apply))


def _codes(*codes: str) -> frozenset[str]:
    return frozenset(codes)


FILE = _codes(
    "integrity_hash_mismatch",
    "integrity_size_mismatch",
    "missing_file",
    "missing_manifest",
    "load_error",
)
STATE = _codes("state_mismatch", "inconsistent_state", "missing_state", "load_error", "step_error")
NOT_AS_REGISTERED = _codes("not_as_registered")


def _written(name: str, damage: Callable[[Path, Path], None], codes: frozenset[str]) -> Damage:
    """State damage the trainer wrote and Gantry registered: every hash valid."""
    return Damage(name, damage, "failed", codes, registered_as_written=True)


KINDS: list[Damage] = [
    Damage("truncated data file", truncate, "failed", FILE),
    Damage("missing rank file", missing_rank_file, "failed", FILE),
    Damage("missing data file", missing_data_file, "failed", FILE),
    Damage("flipped byte", flipped_byte, "failed", FILE),
    Damage("manifest missing", manifest_missing, "failed", FILE),
    Damage("manifest of another save", foreign_manifest, "failed", NOT_AS_REGISTERED),
    Damage("partial directory", partial_directory, "failed", FILE),
    Damage(
        "checkpoint swapped for another step (complete, hashes valid)",
        swapped_for_another_step,
        "failed",
        NOT_AS_REGISTERED,
    ),
    _written("weights altered 1% (hashes valid)", _state(_scale_weights), STATE),
    _written("optimizer moments altered (hashes valid)", _state(_moments), STATE),
    _written("optimizer step counts altered (hashes valid)", _state(_step_counts), STATE),
    _written("scheduler state altered (hashes valid)", _state(_scheduler), STATE),
    _written("data position altered (hashes valid)", _state(_data_position), STATE),
    _written("RNG altered (hashes valid)", _state(_rng), STATE),
    _written("rank files of another step (hashes valid)", other_step_rank_files, STATE),
    _written("a tensor of the wrong shape (hashes valid)", _state(_wrong_shape), STATE),
    _written("a missing key (hashes valid)", _state(_missing_key), STATE),
    Damage(
        "one rank's shard missing",
        shard_missing,
        "failed",
        _codes("missing_file"),
        sharded=True,
        names=("rank-00001-", "rank 1's shard"),
    ),
    Damage(
        "two ranks' shards swapped (hashes valid)",
        shards_swapped,
        "failed",
        _codes("state_mismatch"),
        sharded=True,
        names=("rank 0's slice", "rank 1's slice"),
        registered_as_written=True,
    ),
    Damage(
        "a shard of another step (hashes valid)",
        shard_of_another_step,
        "failed",
        _codes("state_mismatch", "inconsistent_state"),
        sharded=True,
        names=("rank 1's slice", "rank-00001-"),
        registered_as_written=True,
    ),
]
# The kinds that apply to any checkpoint, and those that need a sharded one.
REPLICATED_KINDS = [kind for kind in KINDS if not kind.sharded]
SHARDED_KINDS = [kind for kind in KINDS if kind.sharded]


def damage_by_name(name: str) -> Damage:
    return next(kind for kind in KINDS if kind.name == name)
