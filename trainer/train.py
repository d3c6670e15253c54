"""The train command: resume (optionally), write the acceptance manifest, train with
checkpoints, log metrics, finish with a ``done`` event. Each step of a run is a function."""

from __future__ import annotations

import os
import shutil
import sys
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from . import checkpoint as ck
from . import dist, faults
from .config import Config, validate
from .heartbeat import Heartbeat
from .metrics import MetricsWriter
from .schema import ACCEPTANCE_SCHEMA, Event, manifest_digest
from .session import Session

EXIT_OK, EXIT_FAILED, EXIT_INPUT = 0, 1, 2


def log(msg: str, rank: int = 0) -> None:
    if rank == 0:
        print(f"trainer: {msg}", file=sys.stderr, flush=True)


def supersede_later(run_dir: str, step: int) -> list[str]:
    """Move checkpoints newer than ``step`` (an abandoned timeline) to checkpoints/.superseded."""
    root = os.path.join(run_dir, "checkpoints")
    moved = []
    for e in ck.list_checkpoints(root):
        if e.step > step:
            dest_root = os.path.join(root, ".superseded")
            os.makedirs(dest_root, exist_ok=True)
            dest = os.path.join(dest_root, f"{os.path.basename(e.path)}-{int(time.time())}")
            shutil.move(e.path, dest)
            moved.append(dest)
    return moved


def acceptance(
    session: Session, env: dist.DistEnv, backend: str | None, ranks: list[dict[str, Any]]
) -> dict[str, Any]:
    cfg = session.cfg
    return {
        "schema": ACCEPTANCE_SCHEMA,
        "created": time.time(),
        "nodes": [r["node"] for r in ranks],
        "unique_nodes": sorted({r["node"] for r in ranks}),
        "ranks": ranks,
        "world_size": env.world_size,
        "launch": env.source,
        "master_addr": env.master_addr,
        "master_port": env.master_port,
        "slurm_job_id": env.job_id,
        "backend": backend,
        "devices": dist.devices(),
        "versions": dist.versions(),
        "config": cfg.to_dict(),
        "config_sha256": cfg.sha256(),
        "dataset": session.source.describe()["definition"],
        "dataset_sha256": session.source.definition_sha256(),
        "optimal_loss": session.source.optimal_loss,
        "target_loss": session.source.optimal_loss + cfg.target_epsilon,
        "precision": cfg.precision,
        "strategy": cfg.strategy,
        "seed": cfg.seed,
        "model_params": session.n_params,
        "flops_per_token": session.flops_per_token(),
        "global_batch": session.global_batch,
        "tokens_per_step": session.global_batch * cfg.seq_len,
    }


def rank_info(session: Session, env: dist.DistEnv) -> dict[str, Any]:
    dev = session.device
    return {
        "rank": env.rank,
        "local_rank": env.local_rank,
        "node": env.node,
        "pid": os.getpid(),
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch_threads": torch.get_num_threads(),
    }


@dataclass
class ResumePoint:
    """The checkpoint a run resumes from (all ranks agree on it)."""

    path: str
    manifest: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def resolve_resume(
    run_dir: str, resume: str, env: dist.DistEnv, digest: str | None = None
) -> ResumePoint | str:
    """Rank 0 resolves ``--resume`` (a path, or ``latest``: the newest verified checkpoint)
    and tells the others; returns the resume point, or why resuming is impossible. With
    ``digest`` (``--resume-digest``: the manifest digest Gantry registered and proved), a
    checkpoint whose manifest is no longer that one is refused: rewritten after the proof,
    every hash in it may be valid and the state still not the one proven."""
    result: tuple[str | None, list[str], str | None] = (None, [], None)
    if env.rank == 0:
        try:
            path, notes = ck.resolve(run_dir, resume)
            result = (path, notes, None)
            if digest is not None and manifest_digest(ck.load_manifest(path)) != digest:
                result = (
                    None,
                    [],
                    "[not_as_registered] the checkpoint's manifest is not the one Gantry "
                    "registered (changed since)",
                )
        except ck.CheckpointError as exc:
            result = (None, [], f"[{exc.code}] {exc.reason}")
    path, notes, error = dist.broadcast_object(result)
    if error is not None:
        return str(error)
    assert path is not None
    return ResumePoint(path=path, manifest=ck.load_manifest(path), notes=list(notes))


def load_resume_point(
    session: Session, point: ResumePoint, env: dist.DistEnv
) -> dict[str, Any] | str:
    """Every rank loads its part; returns the load report, or the first rank's error."""
    error: str | None = None
    report: dict[str, Any] | None = None
    try:
        report = session.load(point.path, point.manifest)
    except ck.CheckpointError as exc:
        # A collective error names the rank at fault itself (every rank raised it).
        who = "" if exc.collective else f"rank {env.rank}: "
        error = f"[{exc.code}] {who}{exc.reason}"
    errors = [e for e in dist.all_gather_object(error, env) if e]
    if errors:
        return str(errors[0])
    assert report is not None
    return report


def _manifest_extra(session: Session, device: torch.device) -> dict[str, Any]:
    """What every checkpoint manifest of this run records besides its files."""
    cfg = session.cfg
    return {
        "config": cfg.to_dict(),
        "config_sha256": cfg.sha256(),
        "dataset_sha256": session.source.definition_sha256(),
        "versions": dist.versions(),
        "precision": cfg.precision,
        "strategy": cfg.strategy,
        "device_type": device.type,
        "torch_threads": torch.get_num_threads(),
        "deterministic": bool(cfg.deterministic or device.type == "cpu"),
    }


@dataclass
class TrainLoop:
    """The steps of a run after set-up: train, checkpoint, log, notice the quality target."""

    session: Session
    env: dist.DistEnv
    metrics: MetricsWriter
    writer: ck.CheckpointWriter
    manifest_extra: dict[str, Any]
    target: float
    reported_errors: int = 0
    # Whether this run started from a checkpoint (the NaN fault is transient: it fires
    # only in a run that did not resume, as a flipped bit would).
    resumed: bool = False
    reached: int | None = None
    # ``--max-seconds``: stop at the first logged step past it (None: the step count only).
    max_seconds: float | None = None
    stopped_on_time: bool = False
    loss: float = float("nan")
    last_saved: int = 0
    # This rank's forward and step seconds since the last logged step.
    rank_forward_s: float = 0.0
    rank_step_s: float = 0.0
    rank_steps: int = 0

    def rank_timings(self) -> list[list[Any]]:
        """Collective (every rank calls it at each logged step): each rank's mean forward
        and step seconds over the interval, with its node: ``[rank, node, forward_s,
        step_s]`` per rank (``trainer/SCHEMA.md``, ``ranks``)."""
        steps = max(1, self.rank_steps)
        mine = [
            self.env.rank,
            self.env.node,
            round(self.rank_forward_s / steps, 6),
            round(self.rank_step_s / steps, 6),
        ]
        self.rank_forward_s = self.rank_step_s = 0.0
        self.rank_steps = 0
        return [list(row) for row in dist.all_gather_object(mine, self.env)]

    def report_checkpoint_errors(self) -> None:
        for error in self.writer.errors[self.reported_errors :]:
            log(f"warning: checkpoint failed: {error}", self.env.rank)
            self.metrics.write(
                {"event": Event.CHECKPOINT_FAILED, "time": time.time(), "error": error}
            )
        self.reported_errors = len(self.writer.errors)

    def _maybe_checkpoint(self, step: int) -> float:
        cfg = self.session.cfg
        every = cfg.checkpoint_every
        if every <= 0 or not (step % every == 0 or step == cfg.steps):
            return 0.0
        self.last_saved = step
        return self.writer.save(step, self.session.snapshot, self.manifest_extra)

    def _maybe_target(self, window: deque[float], step: int, elapsed: float) -> None:
        window.append(self.loss)
        full = len(window) == window.maxlen
        if self.reached is None and full and sum(window) / len(window) <= self.target:
            self.reached = step
            self.metrics.write(
                {
                    "event": Event.TARGET_REACHED,
                    "step": step,
                    "elapsed": elapsed,
                    "time": time.time(),
                    "window_mean_loss": sum(window) / len(window),
                    "target_loss": self.target,
                }
            )

    def run(self) -> float:
        """Train to the configured step count; returns seconds since the loop started."""
        session, cfg = self.session, self.session.cfg
        tokens_per_step = session.global_batch * cfg.seq_len
        window: deque[float] = deque(maxlen=cfg.target_window)
        self.last_saved = session.step
        t_perf = time.perf_counter()
        while session.step < cfg.steps:
            t0 = time.perf_counter()
            result = session.train_step()
            self.loss = result["loss"]
            step = session.step
            faults.after_step(
                model=session.model,
                rank=self.env.rank,
                world_size=self.env.world_size,
                step=step,
                resumed=self.resumed,
            )
            blocking = self._maybe_checkpoint(step)
            if len(self.writer.errors) > self.reported_errors:
                self.report_checkpoint_errors()
            step_time = time.perf_counter() - t0
            elapsed = time.perf_counter() - t_perf
            self.rank_forward_s += result.get("forward_time", 0.0)
            self.rank_step_s += step_time
            self.rank_steps += 1
            self._maybe_target(window, step, elapsed)
            if step % cfg.log_every == 0 or step == cfg.steps:
                ranks = self.rank_timings()
                self.metrics.write(
                    {
                        "step": step,
                        "time": time.time(),
                        "elapsed": elapsed,
                        "loss": self.loss,
                        "lr": result["lr"],
                        "samples_per_s": session.global_batch / step_time,
                        "tokens_per_s": tokens_per_step / step_time,
                        "step_time": step_time,
                        "data_time": result["data_time"],
                        "checkpoint_blocking_time": blocking,
                        "world_size": self.env.world_size,
                        "global_batch": session.global_batch,
                        "ranks": ranks,
                    }
                )
                if self._out_of_time(elapsed):
                    self.stopped_on_time = True
                    break
        return time.perf_counter() - t_perf

    def _out_of_time(self, elapsed: float) -> bool:
        """Collective when ``max_seconds`` is set (every rank calls it at the same logged
        steps): rank 0's clock decides, so every rank stops after the same step."""
        if self.max_seconds is None:
            return False
        return bool(dist.broadcast_object(elapsed >= self.max_seconds))


def _start_events(
    session: Session,
    env: dist.DistEnv,
    metrics: MetricsWriter,
    point: ResumePoint | None,
    load_report: dict[str, Any] | None,
) -> None:
    opt = session.source.optimal_loss
    metrics.write(
        {
            "event": Event.START,
            "time": time.time(),
            "step": session.step,
            "world_size": env.world_size,
            "optimal_loss": opt,
            "target_loss": opt + session.cfg.target_epsilon,
            "global_batch": session.global_batch,
            "tokens_per_step": session.global_batch * session.cfg.seq_len,
            "steps": session.cfg.steps,
        }
    )
    if point is not None and load_report is not None:
        metrics.write(
            {
                "event": Event.RESUMED,
                "time": time.time(),
                "from": os.path.abspath(point.path),
                "step": session.step,
                "world_size_at_save": load_report["world_size_at_save"],
                "samples_consumed": session.samples_consumed,
                "notes": load_report["notes"],
            }
        )


def _prepare_run_dir(
    session: Session,
    env: dist.DistEnv,
    backend: str | None,
    run_dir: str,
    point: ResumePoint | None,
) -> None:
    """Create the run directory, move an abandoned timeline aside when resuming in the same
    run, and write the acceptance manifest (rank 0)."""
    os.makedirs(run_dir, exist_ok=True)
    if env.rank == 0 and point is not None:
        same_run = os.path.abspath(os.path.dirname(os.path.dirname(point.path))) == os.path.abspath(
            run_dir
        )
        if same_run:
            for moved in supersede_later(run_dir, session.step):
                log(f"moved newer checkpoint aside (abandoned timeline): {moved}")
    ranks = dist.all_gather_object(rank_info(session, env), env)
    if env.rank == 0:
        manifest = acceptance(session, env, backend, ranks)
        if point is not None:
            manifest["resumed_from"] = os.path.abspath(point.path)
            manifest["resumed_step"] = session.step
        ck.atomic_write_json(os.path.join(run_dir, "acceptance.json"), manifest)


def _finish(loop: TrainLoop, started: float, elapsed: float) -> int:
    """Wait for the last save, report it, write ``done`` (after every rank's save)."""
    session, env, metrics = loop.session, loop.env, loop.metrics
    t_wait = time.perf_counter()
    loop.writer.wait()
    final_wait = time.perf_counter() - t_wait
    loop.report_checkpoint_errors()
    # every rank's save finished before rank 0 reports done
    ok_all = all(dist.all_gather_object(not loop.writer.errors, env))
    opt = session.source.optimal_loss
    metrics.write(
        {
            "event": Event.DONE,
            "time": time.time(),
            "step": session.step,
            "elapsed": elapsed + final_wait,
            "wall_s": time.time() - started,
            "final_loss": loop.loss,
            "optimal_loss": opt,
            "target_loss": loop.target,
            "target_reached_step": loop.reached,
            "final_checkpoint_wait_s": final_wait,
            "last_checkpoint_step": loop.last_saved if session.cfg.checkpoint_every > 0 else None,
            "checkpoint_errors": not ok_all,
            "stopped_on_time": loop.stopped_on_time,
        }
    )
    metrics.close()
    log(
        f"done: step {session.step}, loss {loop.loss:.4f} (optimal {opt:.4f}); target "
        + (f"reached at step {loop.reached}" if loop.reached else "not reached"),
        env.rank,
    )
    return EXIT_OK if ok_all else EXIT_FAILED


def train(
    cfg: Config | None,
    run_dir: str,
    resume: str | None,
    env: dist.DistEnv,
    device: torch.device,
    backend: str | None,
    strategy: str | None = None,
    resume_digest: str | None = None,
    max_seconds: float | None = None,
) -> int:
    """Run training; returns the process exit code. ``strategy`` overrides the config's
    (e.g. resume an FSDP checkpoint as a DDP run); ``max_seconds`` stops it on time."""
    rank = env.rank
    point: ResumePoint | None = None
    if resume is not None:
        resolved = resolve_resume(run_dir, resume, env, resume_digest)
        if isinstance(resolved, str):
            log(f"error: cannot resume: {resolved}", rank)
            return EXIT_INPUT
        point = resolved
        for note in point.notes:
            log(f"resume latest: {note}", rank)
        cfg = cfg or validate(point.manifest["config"])
    assert cfg is not None
    if strategy is not None and strategy != cfg.strategy:
        cfg = cfg.replace(strategy=strategy)
    if cfg.deterministic:
        dist.set_deterministic(device)
    session = Session(cfg, env, device)
    load_report: dict[str, Any] | None = None
    if point is not None:
        loaded = load_resume_point(session, point, env)
        if isinstance(loaded, str):
            log(f"error: cannot resume from {point.path}: {loaded}", rank)
            return EXIT_INPUT
        load_report = loaded
        for note in load_report["notes"]:
            log(note, rank)
    _prepare_run_dir(session, env, backend, run_dir, point)
    save_id = dist.broadcast_object(uuid.uuid4().hex if rank == 0 else None)
    session.save_id = save_id
    metrics = MetricsWriter(os.path.join(run_dir, "metrics.jsonl") if rank == 0 else None)

    def on_complete(res: dict[str, Any]) -> None:
        keys = ("step", "path", "bytes", "write_s", "blocking_s", "async", "fingerprint_s")
        metrics.write(
            {
                "event": Event.CHECKPOINT,
                "time": time.time(),
                **{k: res[k] for k in keys},
                "removed": res["removed"],
                "fingerprint": res["fingerprint"],
            }
        )

    writer = ck.CheckpointWriter(
        os.path.join(run_dir, "checkpoints"),
        rank,
        env.world_size,
        save_id,
        cfg.checkpoint_async,
        cfg.checkpoint_keep,
        on_complete if rank == 0 else None,
        fingerprint_fn=session.fingerprint_part,
    )
    target = session.source.optimal_loss + cfg.target_epsilon
    _start_events(session, env, metrics, point, load_report)
    log(
        f"rank {rank}/{env.world_size} on {env.node} ({device}, {backend or 'no backend'}); "
        f"optimal loss {session.source.optimal_loss:.4f}, target {target:.4f}; "
        f"steps {session.step}->{cfg.steps}",
        rank,
    )
    loop = TrainLoop(session, env, metrics, writer, _manifest_extra(session, device), target)
    loop.resumed = point is not None
    loop.max_seconds = max_seconds
    return _run_beating(loop, run_dir)


def _run_beating(loop: TrainLoop, run_dir: str) -> int:
    """The loop, with this rank's heartbeat going while it runs."""
    started = time.time()
    session = loop.session
    heartbeat = Heartbeat(run_dir, loop.env.rank, loop.env.node, lambda: session.step)
    heartbeat.start()
    try:
        elapsed = loop.run()
    finally:
        heartbeat.stop()
    return _finish(loop, started, elapsed)
