"""The checkpoint writer: snapshot inline, write (async) in a thread, manifest last."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ..faults import crash_point
from ..fingerprint import merge
from ..sharding import sharding_table
from ..statekeys import SHARDS
from .durable import atomic_write_json, fsync_dir
from .layout import FORMAT, MANIFEST, sidecar_name, step_dir_name
from .listing import apply_retention
from .rankfile import save_rank


class CheckpointWriter:
    """Saves per-rank state; async (snapshot inline, write in a thread) or synchronous."""

    def __init__(
        self,
        root: str,
        rank: int,
        world_size: int,
        save_id: str,
        async_save: bool,
        keep: int,
        on_complete: Callable[[dict[str, Any]], None] | None = None,
        sidecar_timeout_s: float = 1800.0,
        fingerprint_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self.root = root
        self.rank = rank
        self.world_size = world_size
        self.save_id = save_id
        self.async_save = async_save
        self.keep = keep
        self.on_complete = on_complete
        self.sidecar_timeout_s = sidecar_timeout_s
        # This rank's part of the state fingerprint, computed from the snapshot it writes
        # (in the writer thread, so training is not blocked by it).
        self.fingerprint_fn = fingerprint_fn
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []
        self.completed: list[dict[str, Any]] = []
        os.makedirs(root, exist_ok=True)

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def save(
        self,
        step: int,
        snapshot_fn: Callable[[bool], dict[str, Any]],
        manifest_extra: dict[str, Any],
    ) -> float:
        """Checkpoint ``step``; returns seconds the caller was blocked.

        ``snapshot_fn(copy)`` returns the state; with ``copy`` (async) every tensor is cloned
        to CPU so training can go on; a synchronous save writes the live tensors directly.
        """
        t0 = time.perf_counter()
        self.wait()  # one save in flight at a time
        state = snapshot_fn(self.async_save)
        if self.async_save:
            blocked = time.perf_counter() - t0
            self._thread = threading.Thread(
                target=self._write_guarded,
                args=(step, state, manifest_extra, blocked),
                name=f"ckpt-{step}",
                daemon=False,
            )
            self._thread.start()
            return blocked
        self._write_guarded(step, state, manifest_extra, None)
        return time.perf_counter() - t0

    def _write_guarded(
        self, step: int, state: dict[str, Any], extra: dict[str, Any], blocked: float | None
    ) -> None:
        try:
            self._write(step, state, extra, blocked)
        except Exception as exc:  # surfaced by the trainer as an event + warning
            self.errors.append(f"step {step}: {type(exc).__name__}: {exc}")

    def _write(
        self, step: int, state: dict[str, Any], extra: dict[str, Any], blocked: float | None
    ) -> None:
        t0 = time.perf_counter()
        d = os.path.join(self.root, step_dir_name(step))
        os.makedirs(d, exist_ok=True)
        files = save_rank(state, d, self.rank)
        t_fingerprint = time.perf_counter()
        part = self.fingerprint_fn(state) if self.fingerprint_fn is not None else None
        fingerprint_s = time.perf_counter() - t_fingerprint
        info = {
            "rank": self.rank,
            "files": files,
            "keys": sorted(state.keys()),
            "save_id": self.save_id,
            "fingerprint": part,
            "shards": state.get(SHARDS) or {},
        }
        del state
        atomic_write_json(os.path.join(d, sidecar_name(self.rank)), info)
        if self.rank != 0:
            return
        files = self._collect_sidecars(d)
        crash_point("crash_before_manifest", step)
        manifest = self._manifest(step, files, extra)
        parts = [f.get("fingerprint") for f in files]
        fingerprint = merge([p for p in parts if p]) if all(parts) else None
        if fingerprint is not None:
            manifest["fingerprint"] = fingerprint
        fsync_dir(self.root)
        atomic_write_json(os.path.join(d, MANIFEST), manifest)
        removed = apply_retention(self.root, self.keep)
        result = {
            "step": step,
            "path": d,
            "bytes": manifest["total_bytes"],
            "write_s": time.perf_counter() - t0,
            "blocking_s": blocked,
            "async": self.async_save,
            "removed": removed,
            "fingerprint": fingerprint,
            "fingerprint_s": fingerprint_s,
        }
        self.completed.append(result)
        if self.on_complete is not None:
            self.on_complete(result)

    def _manifest(
        self, step: int, sidecars: list[dict[str, Any]], extra: dict[str, Any]
    ) -> dict[str, Any]:
        """The manifest from every rank's sidecar: files, state keys, sharding table."""
        state_keys = sorted(
            {k for f in sidecars for k in f["keys"] if k not in ("rng", "data", "meta", SHARDS)}
            | {f"{k}/rank{f['rank']}" for f in sidecars for k in ("rng", "data")}
            | {"meta"}
        )
        return {
            "format": FORMAT,
            "step": step,
            "world_size": self.world_size,
            "files": [
                {
                    "name": x["name"],
                    "rank": f["rank"],
                    "role": x["role"],
                    "size": x["size"],
                    "sha256": x["sha256"],
                    **({"keys": f["keys"]} if x["role"] == "index" else {}),
                }
                for f in sidecars
                for x in f["files"]
            ],
            "state_keys": state_keys,
            "total_bytes": sum(x["size"] for f in sidecars for x in f["files"]),
            "created": time.time(),
            "async": self.async_save,
            "save_id": self.save_id,
            "strategy": extra.get("strategy", "ddp"),
            "sharding": sharding_table(sidecars),
            **extra,
        }

    def _collect_sidecars(self, d: str) -> list[dict[str, Any]]:
        deadline = time.monotonic() + self.sidecar_timeout_s
        files: dict[int, dict[str, Any]] = {}
        while True:
            for r in range(self.world_size):
                if r in files:
                    continue
                p = os.path.join(d, sidecar_name(r))
                try:
                    with open(p, encoding="utf-8") as fh:
                        info = json.load(fh)
                except (FileNotFoundError, json.JSONDecodeError):
                    continue
                if info.get("save_id") == self.save_id:
                    files[r] = info
            if len(files) == self.world_size:
                return [files[r] for r in range(self.world_size)]
            if time.monotonic() > deadline:
                missing = sorted(set(range(self.world_size)) - set(files))
                raise TimeoutError(f"no sidecar from rank(s) {missing}; manifest not written")
            time.sleep(0.02)
