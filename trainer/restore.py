"""Loading a checkpoint into a session, at the world size and strategy of this run.

Two paths:

* **replicated** (DDP checkpoint into a DDP run): every rank reads rank 0's files whole
  (the weights straight into the parameters, hashed while read) and its own RNG state;
* **sharded** (an FSDP checkpoint, or a change of strategy): the session's own state dict
  (``get_state_dict``: DTensor shards for FSDP, full tensors for DDP) says which global
  rows each rank holds; each rank reads just those rows from the saved slices of every
  rank (``checkpoint.reshard``), checks every slice read against the digest recorded at
  save (``expected``, a state fingerprint: pieces read by several ranks are summed over
  them), and sets the state with ``set_state_dict``. No rank gathers the global state.

Both end with the data position and the per-rank batch (``apply_position``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor

from . import checkpoint as ck
from . import dist, fingerprint
from .checkpoint.reshard import Piece, RangeReader, ShardLayout
from .config import Config
from .rng import seed_all, set_rng_state
from .schema import Reason
from .statekeys import group_params, model_key, optimizer_key


class Session(Protocol):
    """What loading needs of a ``trainer.session.Session``."""

    cfg: Config
    env: dist.DistEnv
    device: torch.device
    rank: int
    world: int
    step: int
    samples_consumed: int
    per_rank_batch: int

    @property
    def model(self) -> torch.nn.Module: ...

    @property
    def opt(self) -> torch.optim.Optimizer: ...

    @property
    def sched(self) -> torch.optim.lr_scheduler.LRScheduler: ...

    @property
    def global_batch(self) -> int: ...

    def optimizer_param_names(self) -> list[str]: ...


_MASK32 = (1 << 32) - 1


def _fault(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def apply_position(session: Session, st0: dict[str, Any], w_save: int, report: dict) -> None:
    """Step, data position and per-rank batch from rank 0's saved state (any world size)."""
    d = st0["data"]
    session.step = int(st0["meta"]["step"])
    session.samples_consumed = int(d["samples_consumed"])
    g_save = int(d["global_batch"])
    if session.world == w_save:
        session.per_rank_batch = session.cfg.batch_size
    elif g_save % session.world == 0:
        session.per_rank_batch = g_save // session.world
        report["notes"].append(
            f"resharded {w_save} -> {session.world} ranks: per-rank batch "
            f"{session.per_rank_batch} keeps the global batch {g_save}"
        )
    else:
        session.per_rank_batch = session.cfg.batch_size
        report["notes"].append(
            f"resharded {w_save} -> {session.world} ranks: global batch {g_save} is not "
            f"divisible by {session.world}; global batch becomes {session.global_batch}"
        )
    report.update(
        step=session.step,
        samples_consumed=session.samples_consumed,
        world_size_at_save=w_save,
        per_rank_batch=session.per_rank_batch,
        global_batch=session.global_batch,
        global_batch_at_save=g_save,
    )


def _rng_or_seed(session: Session, rng: dict[str, Any] | None, step: int, w_save: int) -> str:
    if rng is not None:
        set_rng_state(rng, session.device)
        return ""
    seed_all(session.cfg.seed + step, session.rank)
    torch.manual_seed(session.cfg.seed + 7919 * session.rank + step)
    return (
        f"rank {session.rank} has no saved RNG state (world size at save {w_save}); "
        "seeded deterministically"
    )


def load_replicated(session: Session, path: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """A DDP checkpoint into a DDP run: rank 0's files whole, this rank's RNG state."""
    ranks = {int(f["rank"]) for f in manifest["files"] if f.get("role") == "index"}
    w_save = int(manifest["world_size"])
    report: dict[str, Any] = {"files_verified": [], "bytes": 0, "notes": [], "ranges": []}

    def read(rank: int, into: dict[str, Any] | None = None) -> dict[str, Any]:
        # sizes + sha256 of the index and every data file, checked while reading
        obj, names, nbytes = ck.load_rank(path, manifest, rank, into)
        report["bytes"] += nbytes
        report["files_verified"] += names
        missing = [k for k in ck.required_keys(rank) if k not in obj]
        if missing:
            raise ck.CheckpointError(
                Reason.MISSING_STATE, f"{names[0]}: required state {', '.join(missing)} missing"
            )
        return obj

    if 0 not in ranks:
        raise ck.CheckpointError(Reason.MISSING_FILE, "manifest lists no rank-0 index file")
    # the weights are read straight into the parameters (load_state_dict then checks
    # keys/shapes and copies nothing); on failure the session is unusable anyway
    with torch.no_grad():
        st0 = read(0, {"model": session.model.state_dict()})
    try:
        session.model.load_state_dict(st0["model"], strict=True)
        session.opt.load_state_dict(st0["optimizer"])
        session.sched.load_state_dict(st0["scheduler"])
    except (RuntimeError, ValueError, KeyError) as exc:
        raise ck.CheckpointError(
            Reason.LOAD_ERROR, f"state does not fit this config/model: {_fault(exc)}"
        ) from None
    mine = st0 if session.rank == 0 else (read(session.rank) if session.rank in ranks else None)
    note = _rng_or_seed(session, mine["rng"] if mine else None, int(st0["meta"]["step"]), w_save)
    if note:
        report["notes"].append(note)
    apply_position(session, st0, w_save, report)
    return report


# ---------------------------------------------------------------- the sharded path


@dataclass
class _Target:
    """One tensor of the session's state: the rows this rank holds, read into ``buffer``
    (CPU), then turned back into what the session holds (a DTensor shard or a tensor)."""

    key: str
    like: torch.Tensor
    buffer: torch.Tensor
    start: int

    @classmethod
    def of(cls, key: str, like: torch.Tensor) -> _Target:
        if isinstance(like, DTensor):
            local = like.to_local()
            chunks = like.__create_chunk_list__()  # the DCP protocol: this rank's offsets
            start = int(chunks[0].offsets[0]) if chunks and local.dim() else 0
            shape = local.shape
        else:
            start, shape = 0, like.shape
        return cls(key, like, torch.empty(shape, dtype=like.dtype, device="cpu"), start)

    def value(self) -> torch.Tensor:
        device = self.like.device
        data = self.buffer.to(device) if device.type != "cpu" else self.buffer
        if isinstance(self.like, DTensor):
            return DTensor.from_local(
                data,
                self.like.device_mesh,
                self.like.placements,
                run_check=False,
                shape=self.like.shape,
                stride=self.like.stride(),
            )
        return data


def _targets(session: Session) -> tuple[dict[str, Any], dict[str, Any], list[_Target]]:
    """The session's model and optimizer state dicts (FQN-keyed) with every tensor
    replaced by a target to read into."""
    model_sd, optim_state = get_state_dict(session.model, session.opt)
    optim_sd: dict[str, Any] = dict(optim_state)  # FQN-keyed: {state, param_groups}
    targets: list[_Target] = []

    def target(key: str, value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        t = _Target.of(key, value)
        targets.append(t)
        return t

    model = {name: target(model_key(name), v) for name, v in model_sd.items()}
    state = {
        name: {entry: target(optimizer_key(name, entry), v) for entry, v in entries.items()}
        for name, entries in optim_sd["state"].items()
    }
    return model, {"state": state, "param_groups": optim_sd["param_groups"]}, targets


def _fit(layout: ShardLayout, targets: list[_Target]) -> None:
    """The saved tensors are exactly this session's, with the same shapes and dtypes."""
    saved = set(layout.slices)
    wanted = {t.key for t in targets}
    if saved != wanted:
        missing, extra = sorted(wanted - saved), sorted(saved - wanted)
        raise ck.CheckpointError(
            Reason.LOAD_ERROR,
            "state does not fit this config/model: "
            + "; ".join(
                part
                for part in (
                    f"not saved: {', '.join(missing[:4])}" if missing else "",
                    f"not in this model: {', '.join(extra[:4])}" if extra else "",
                )
                if part
            ),
        )
    for t in targets:
        source = layout.slices[t.key][0]
        shape = list(t.like.shape)
        dtype = str(t.like.dtype).removeprefix("torch.")
        if list(source.global_shape) != shape or source.dtype != dtype:
            raise ck.CheckpointError(
                Reason.LOAD_ERROR,
                f"state does not fit this config/model: {t.key} saved as {source.dtype}"
                f"{list(source.global_shape)}, this model has {dtype}{shape}",
            )


def _expected_digests(expected: dict[str, Any] | None) -> dict[tuple[str, int], int] | None:
    """(key, rank) → the lhash of that rank's saved slice, from a state fingerprint."""
    if not expected:
        return None
    out: dict[tuple[str, int], int] = {}
    for key, entry in (expected.get("tensors") or {}).items():
        for shard in entry.get("shards") or []:
            out[(key, int(shard["rank"]))] = int(shard["lhash"])
        if not entry.get("shards"):
            out[(key, -1)] = int(entry["lhash"])  # whole: held by one rank
    return out


def _describe(layout: ShardLayout, piece: Piece) -> str:
    s = piece.source
    rows = (
        f"rows {s.start}..{s.start + s.rows} of {s.global_shape[0]}"
        if s.global_shape
        else "the scalar"
    )
    files = ", ".join(layout.files_of(s.rank, s.offset, s.nbytes))
    return f"rank {s.rank}'s slice of {s.key} ({rows}, in {files})"


def _check_pieces(
    layout: ShardLayout, pieces: list[Piece], digests: dict[tuple[str, int], int]
) -> tuple[list[str], dict[str, int], dict[str, str]]:
    """Complete slices are checked here; a slice read in part by several ranks gives a
    partial digest to sum over them. Returns (problems, partial digests, names)."""
    problems: list[str] = []
    partial: dict[str, int] = {}
    names: dict[str, str] = {}
    for piece in pieces:
        s = piece.source
        want = digests.get((s.key, s.rank), digests.get((s.key, -1)))
        if want is None:
            problems.append(f"{_describe(layout, piece)}: not in the saved fingerprint")
        elif piece.complete:
            if piece.lhash() != want:
                problems.append(f"{_describe(layout, piece)} differs from the state saved")
        else:
            slot = f"{s.key}@{s.rank}"
            partial[slot] = (partial.get(slot, 0) + piece.lhash()) & _MASK32
            names[slot] = _describe(layout, piece)
    return problems, partial, names


def _summed_problems(
    gathered: list[Any], pieces_digests: dict[tuple[str, int], int] | None
) -> list[str]:
    problems = [p for g in gathered for p in g[1]]
    if pieces_digests is None:
        return problems
    totals: dict[str, int] = {}
    names: dict[str, str] = {}
    for g in gathered:
        for slot, value in g[2].items():
            totals[slot] = (totals.get(slot, 0) + value) & _MASK32
        names.update(g[3])
    for slot, total in sorted(totals.items()):
        key, rank = slot.rsplit("@", 1)
        want = pieces_digests.get((key, int(rank)), pieces_digests.get((key, -1)))
        if want is not None and total != want:
            problems.append(f"{names[slot]} differs from the state saved")
    return problems


def _rng_problems(session: Session, plan: _Plan, expected: dict[str, Any] | None) -> list[str]:
    """This rank's RNG state read against its digest at save."""
    want = ((expected or {}).get("rng") or {}).get(str(session.rank))
    if plan.rng is None or want is None:
        return []
    if fingerprint.digest(plan.reader.tree(plan.rng)) == want:
        return []
    index = ck.rank_file_name(session.rank)
    return [f"rank {session.rank}'s RNG state ({index} and its data) differs from the state saved"]


@dataclass
class _Plan:
    layout: ShardLayout
    reader: RangeReader
    model: dict[str, Any]
    optimizer: dict[str, Any]
    targets: list[_Target]
    rng: int | None
    report: dict[str, Any]


def _plan(session: Session, path: str, manifest: dict[str, Any]) -> _Plan:
    layout = ShardLayout(path, manifest, session.optimizer_param_names())
    model, optimizer, targets = _targets(session)
    _fit(layout, targets)
    reader = RangeReader(layout)
    for t in targets:
        reader.want(t.key, t.buffer, t.start)
    w_save = int(manifest["world_size"])
    rng = (
        reader.want_tree(session.rank, layout.state(session.rank)["rng"])
        if (session.rank < w_save)
        else None
    )
    report = reader.run()
    indices = layout.index_entries()
    report["files_verified"] = [f["name"] for f in indices] + report["files_verified"]
    report["data_bytes"] = report["bytes"]
    report["bytes"] += sum(int(f["size"]) for f in indices)
    return _Plan(layout, reader, model, optimizer, targets, rng, report)


def _apply(session: Session, plan: _Plan) -> dict[str, Any]:
    """Set the read state into the session (every rank got this far)."""
    st0 = plan.layout.state(0)
    param_names = session.optimizer_param_names()
    groups = group_params(st0["optimizer"]["param_groups"], param_names)
    model = {name: t.value() if isinstance(t, _Target) else t for name, t in plan.model.items()}
    try:
        state = {
            name: {
                entry: t.value()
                if isinstance(t, _Target)
                else plan.layout.scalars[optimizer_key(name, entry)]
                for entry, t in entries.items()
            }
            for name, entries in plan.optimizer["state"].items()
        }
        optim: dict[str, Any] = {"state": state, "param_groups": groups}
        set_state_dict(
            session.model,
            session.opt,
            model_state_dict=model,
            optim_state_dict=optim,
            options=StateDictOptions(strict=True),
        )
        session.sched.load_state_dict(st0["scheduler"])
    except (RuntimeError, ValueError, KeyError) as exc:
        raise ck.CheckpointError(
            Reason.LOAD_ERROR, f"state does not fit this config/model: {_fault(exc)}", True
        ) from None
    report = {**plan.report, "notes": []}
    w_save = int(plan.layout.manifest["world_size"])
    rng = plan.reader.tree(plan.rng) if plan.rng is not None else None
    note = _rng_or_seed(session, rng, int(st0["meta"]["step"]), w_save)
    if note:
        report["notes"].append(note)
    return report


def load_sharded(
    session: Session,
    path: str,
    manifest: dict[str, Any],
    expected: dict[str, Any] | None,
    mismatch_code: str,
) -> dict[str, Any]:
    """Collective: every rank reads its rows, the slices read are checked against
    ``expected`` (digests summed over the ranks that read them), then the state is set.
    A rank's own failure is raised on that rank; a digest mismatch on every rank."""
    t0 = time.perf_counter()
    digests = _expected_digests(expected)
    error: tuple[str, str] | None = None
    plan: _Plan | None = None
    mine: tuple[list[str], dict[str, int], dict[str, str]] = ([], {}, {})
    try:
        plan = _plan(session, path, manifest)
        if digests is not None:
            mine = _check_pieces(plan.layout, plan.reader.pieces, digests)
            mine[0].extend(_rng_problems(session, plan, expected))
    except ck.CheckpointError as exc:
        error = (exc.code, exc.reason)
    except Exception as exc:  # every rank must reach the gather below, whatever happened
        error = (Reason.LOAD_ERROR, f"cannot be loaded: {type(exc).__name__}: {_fault(exc)}")
    gathered = dist.all_gather_object((error, *mine), session.env)
    if error is not None:
        raise ck.CheckpointError(*error)
    failed = [(rank, g[0]) for rank, g in enumerate(gathered) if g[0] is not None]
    if failed:
        rank, (code, reason) = failed[0]
        raise ck.CheckpointError(code, f"rank {rank} could not load: {reason}", True)
    problems = _summed_problems(gathered, digests)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ck.CheckpointError(mismatch_code, "; ".join(problems[:3]) + more, True)
    assert plan is not None
    report = _apply(session, plan)
    if digests is None:
        report["notes"].append("no fingerprint to check the slices read against")
    report["slices_checked"] = len(plan.reader.pieces) if digests is not None else 0
    apply_position(session, plan.layout.state(0), int(manifest["world_size"]), report)
    report["load_s"] = time.perf_counter() - t0
    return report
