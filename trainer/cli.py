"""Command line: ``python -m trainer {train,drill,verify,collectives,describe,presets}``.

Exit codes: 0 ok; 1 failed (drill verdict failed, verify found a bad checkpoint, a checkpoint
save failed, a collective returned a wrong result); 5 a drill could not judge, or collectives
measured nothing (inconclusive); 2 invalid input (config, unusable
--resume checkpoint, bad arguments);
3 infrastructure error (distributed init, unexpected exception); 4 another live trainer
holds the run directory (a duplicate Slurm job: refused before writing anything).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from typing import Any

from .config import STRATEGIES

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_INFRA, EXIT_LOCKED = 0, 1, 2, 3, 4


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2
        self.exit(EXIT_INPUT, f"trainer: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m trainer", description="Gantry's bundled trainer")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    t = sub.add_parser("train", help="train (single process, torchrun or srun)")
    t.add_argument("--config", help="JSON config (optional with --resume: use the checkpoint's)")
    t.add_argument("--run-dir", required=True)
    t.add_argument("--resume", help="checkpoint directory or 'latest'")
    t.add_argument(
        "--resume-digest",
        help="the manifest digest Gantry registered for --resume (else refused: not_as_registered)",
    )
    t.add_argument(
        "--strategy",
        choices=list(STRATEGIES),
        help="override the config's strategy (e.g. resume an FSDP checkpoint with DDP)",
    )
    t.add_argument(
        "--max-seconds",
        type=float,
        help="stop at the first logged step after this many seconds of training (every rank "
        "at the same step), or at the config's step count, whichever comes first",
    )
    d = sub.add_parser("drill", help="restore drill: verify, load, run K steps, compare")
    d.add_argument("--checkpoint", required=True)
    d.add_argument(
        "--reference",
        required=True,
        help="Gantry's reference.json (or the original run's metrics.jsonl, standalone)",
    )
    d.add_argument("--steps", type=int, required=True)
    d.add_argument("--out", required=True, help="drill.json path")
    d.add_argument("--tolerance", type=float, default=1e-4, help="relative, per loss")
    d.add_argument(
        "--state-tolerance",
        type=float,
        default=1e-3,
        help="relative L2 per tensor after replay, tolerance mode",
    )
    d.add_argument("--mode", choices=["auto", "exact", "tolerance"], default="auto")
    d.add_argument(
        "--strategy",
        choices=list(STRATEGIES),
        help="restore with this strategy (default: the checkpoint's)",
    )
    v = sub.add_parser("verify", help="checkpoint integrity (manifest, sizes, hashes, keys)")
    v.add_argument("--checkpoint", required=True)
    v.add_argument("--json", action="store_true")
    v.add_argument("--shallow", action="store_true", help="skip loading files to check keys")
    v.add_argument(
        "--registered-step", type=int, help="the step Gantry registered (else not_as_registered)"
    )
    v.add_argument(
        "--registered-manifest-digest",
        help="the manifest digest Gantry registered (else not_as_registered)",
    )
    _add_collectives(sub)
    sub.add_parser("describe", help="versions, devices, backend (JSON)")
    sub.add_parser("presets", help="print the config presets and defaults (JSON)")
    sub.add_parser("probe", help="node health probe: nvidia-smi, topology, XIDs, stack (JSON)")
    c = sub.add_parser("check-config", help="validate a config file; print the full config")
    c.add_argument("config")
    return p


def _add_collectives(sub: Any) -> None:
    from .schema import COLLECTIVE_DTYPES, COLLECTIVE_OPS

    k = sub.add_parser(
        "collectives", help="all-reduce/all-gather/reduce-scatter/broadcast: busbw, checked"
    )
    k.add_argument("--ops", default=",".join(COLLECTIVE_OPS), help="comma-separated subset")
    k.add_argument("--min-bytes", default="1KiB", help="smallest size (e.g. 4096, 1KiB)")
    k.add_argument("--max-bytes", default="256MiB", help="largest size")
    k.add_argument("--factor", type=int, default=2, help="size multiplier between steps")
    k.add_argument("--warmup", type=int, default=5, help="untimed calls per op and size")
    k.add_argument("--iters", type=int, default=20, help="timed calls per op and size")
    k.add_argument("--dtype", choices=list(COLLECTIVE_DTYPES), default="float32")
    k.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    k.add_argument(
        "--max-memory", default="1GiB", help="per rank; sizes that need more are skipped"
    )
    k.add_argument("--timeout", type=float, default=300.0, help="seconds per collective")
    k.add_argument("--out", help="also write the JSON document here (rank 0, atomic)")


def _cmd_collectives(args: argparse.Namespace) -> tuple[int, bool]:
    """(exit code, distributed): rank 0 prints the one JSON document."""
    from .collectives import OptionError, options_from_args, run

    try:
        opts = options_from_args(args)
    except OptionError as exc:
        _err(str(exc))
        return EXIT_INPUT, False
    code, doc, world = run(opts)
    if doc is not None:
        if args.out:
            from .checkpoint import atomic_write_json

            atomic_write_json(args.out, doc)
        print(json.dumps(doc, indent=2), flush=True)
    return code, world > 1


def _err(msg: str) -> None:
    print(f"trainer: error: {msg}", file=sys.stderr, flush=True)


def _cmd_verify(args: argparse.Namespace) -> int:
    from .checkpoint import verify

    rep = verify(
        args.checkpoint,
        deep=not args.shallow,
        registered_step=args.registered_step,
        registered_digest=args.registered_manifest_digest,
    )
    if args.json:
        print(json.dumps(rep, indent=2, sort_keys=True))
    else:
        status = "OK" if rep["ok"] else "BAD"
        print(
            f"{status} {rep['path']}  step={rep['step']} world_size={rep['world_size_at_save']}"
            f" strategy={rep.get('strategy')} bytes={rep['bytes']} ({rep['time_s']:.2f}s)"
        )
        for f in rep["files"]:
            flag = (
                "ok"
                if f["exists"] and f["size_ok"] and f["sha256_ok"] and f["keys_ok"] is not False
                else "BAD"
            )
            print(f"  {flag:3} {f['name']} rank={f['rank']} size={f['size']}")
        if not rep["ok"]:
            print(f"reason [{rep['reason_code']}]: {rep['reason']}")
    return EXIT_OK if rep["ok"] else EXIT_FAILED


def _run_distributed(args: argparse.Namespace) -> tuple[int, bool]:
    """train/drill: returns (exit code, distributed-was-initialised)."""
    from . import config as cfgmod

    cfg = None
    if args.command == "train":
        if args.config is None and args.resume is None:
            _err("train needs --config (or --resume to use the checkpoint's config)")
            return EXIT_INPUT, False
        if args.config is not None:
            try:
                cfg = cfgmod.load_file(args.config)
            except cfgmod.ConfigError as exc:
                _err(f"invalid config: {exc.key}: {exc.why}")
                return EXIT_INPUT, False
        if args.max_seconds is not None and not 0 < args.max_seconds < float("inf"):
            _err("--max-seconds must be a positive number of seconds")
            return EXIT_INPUT, False
    elif args.steps < 0:  # 0: state-exact, no replay (files and loaded state only)
        _err("--steps must be >= 0")
        return EXIT_INPUT, False

    from . import dist

    env = dist.detect()
    dist.set_threads(env)
    want = cfg.device if cfg is not None else "auto"
    # A drill compares bit for bit where it can: always deterministic; a run when asked
    # (a resumed run without --config decides once it has read the checkpoint's config).
    deterministic = args.command == "drill" or (cfg is not None and cfg.deterministic)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    device = dist.pick_device(env, want)
    if deterministic:
        dist.set_deterministic(device)
    backend = dist.init(env, device)
    from .runlock import lock_run_directory, release

    directory = os.path.abspath(
        (args.run_dir if args.command == "train" else os.path.dirname(args.out)) or "."
    )
    try:
        refusal = lock_run_directory(directory, env)
        if refusal is not None:
            _err(refusal)
            return EXIT_LOCKED, backend is not None
        if args.command == "train":
            from .train import train

            code = train(
                cfg,
                args.run_dir,
                args.resume,
                env,
                device,
                backend,
                args.strategy,
                resume_digest=args.resume_digest,
                max_seconds=args.max_seconds,
            )
        else:
            from .drill import run

            code = run(
                args.checkpoint,
                args.reference,
                args.steps,
                args.out,
                env,
                device,
                backend,
                tolerance=args.tolerance,
                mode=args.mode,
                state_tolerance=args.state_tolerance,
                strategy=args.strategy,
            )
    finally:
        release(directory)
        dist.teardown()
    return code, backend is not None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "probe":
        from .probe import main as probe_main

        return probe_main()
    if args.command == "presets":
        from .config import DEFAULTS, PRESETS

        print(json.dumps({"presets": PRESETS, "defaults": DEFAULTS}, indent=2))
        return EXIT_OK
    if args.command == "check-config":
        from .config import ConfigError, load_file

        try:
            print(json.dumps(load_file(args.config).to_dict(), indent=2))
        except ConfigError as exc:
            _err(f"invalid config: {exc.key}: {exc.why}")
            return EXIT_INPUT
        return EXIT_OK
    if args.command == "describe":
        from .dist import describe

        print(json.dumps(describe(), indent=2))
        return EXIT_OK
    if args.command == "verify":
        return _cmd_verify(args)
    distributed = False
    try:
        if args.command == "collectives":
            code, distributed = _cmd_collectives(args)
        else:
            code, distributed = _run_distributed(args)
    except Exception as exc:
        traceback.print_exc()
        _err(f"{type(exc).__name__}: {exc}")
        if args.command == "drill":
            _write_infra_drill(args, exc)
        code = EXIT_INFRA
    if distributed or os.environ.get("TRAINER_HARD_EXIT") == "1":
        # Work is durable (metrics closed, checkpoints waited for). Skip interpreter teardown,
        # where a peer's gloo/NCCL abort could otherwise turn a finished run into a failure.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _write_infra_drill(args: argparse.Namespace, exc: BaseException) -> None:
    try:
        from .checkpoint import atomic_write_json
        from .schema import DRILL_SCHEMA, Reason

        rank = int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0")) or 0)
        if rank == 0:
            atomic_write_json(
                args.out,
                {
                    "schema": DRILL_SCHEMA,
                    "verdict": "error",
                    "reason_code": Reason.INFRASTRUCTURE_ERROR,
                    "reason": f"{type(exc).__name__}: {exc}",
                    "steps": [],
                    "ranks": [],
                    "first_divergence": None,
                },
            )
    except Exception as err:  # best effort: the exit code still says "infrastructure"
        print(f"trainer: could not write {args.out}: {err}", file=sys.stderr)
