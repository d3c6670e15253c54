"""What state fingerprints cost, measured side by side in one run (issue 12, "Speed").

    .venv/bin/python bench/fingerprint_bench.py [--quick] [--dir DIR]

1. Checkpoint blocking time: a training loop (the trainer bench's 19.2M-parameter model,
   AdamW) saving asynchronously every few steps, with the fingerprint computed in the
   writer thread vs without; the blocking time is what ``CheckpointWriter.save`` returns
   (the trainer's ``checkpoint_blocking_time``). Reps alternate the two.
2. Drill load time: what a drill does before its first step — integrity check of every
   file, cold load (page cache dropped) — plus the bit-for-bit fingerprint of the loaded
   state, vs the same without the fingerprint. Reps alternate the two.

Goals: fingerprinting adds <= 5% to checkpoint blocking time and <= 10% to drill load
time. Also printed: the full fingerprint's time in the writer thread and per-step time.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import torch  # noqa: E402
from trainer_bench import drop_caches  # noqa: E402

from trainer import checkpoint as ck  # noqa: E402
from trainer import dist, fingerprint  # noqa: E402
from trainer.config import validate  # noqa: E402
from trainer.session import Session  # noqa: E402


def make_session(quick: bool) -> tuple[Session, dict[str, Any]]:
    d_model, layers = (256, 4) if quick else (512, 6)
    cfg = validate(
        {
            "vocab_size": 256,
            "d_model": d_model,
            "n_layers": layers,
            "n_heads": 8,
            "seq_len": 32,
            "batch_size": 2,
            "steps": 100000,
        }
    )
    session = Session(cfg, dist.DistEnv(), torch.device("cpu"))
    session.train_step()
    return session, cfg.to_dict()


def blocking_run(
    session: Session, config: dict[str, Any], root: Path, *, fingerprints: bool, saves: int
) -> dict[str, float]:
    """``saves`` async saves, one every ``EVERY`` steps; blocking per save and step time."""
    every = 10
    writer = ck.CheckpointWriter(
        str(root),
        0,
        1,
        "bench",
        True,
        2,
        fingerprint_fn=session.fingerprint_part if fingerprints else None,
    )
    blocked: list[float] = []
    steps: list[float] = []
    writer.save(0, session.snapshot, {"config": config})  # allocates the snapshot buffers
    writer.wait()
    for n in range(saves):
        for _ in range(every):
            t0 = time.perf_counter()
            session.train_step()
            steps.append(time.perf_counter() - t0)
        blocked.append(writer.save(n + 1, session.snapshot, {"config": config}))
    writer.wait()
    assert not writer.errors, writer.errors
    fingerprint_s = [c.get("fingerprint_s") or 0.0 for c in writer.completed[1:]]
    shutil.rmtree(root)
    return {
        "blocked_s": statistics.median(blocked),
        "step_s": statistics.median(steps),
        "fingerprint_s": statistics.median(fingerprint_s) if fingerprint_s else 0.0,
    }


def drill_load(session: Session, path: Path, *, fingerprints: bool) -> float:
    """A drill's restore path on a cold cache: integrity, load (and the exact fingerprint)."""
    manifest = ck.load_manifest(str(path))
    drop_caches([path])
    t0 = time.perf_counter()
    report = ck.verify(str(path), deep=False)
    assert report["ok"], report["reason"]
    session.load(str(path), manifest)
    if fingerprints:
        fingerprint.prepare().join()  # a drill builds the tables during the integrity check
        session.fingerprint_now(full=False)
    return time.perf_counter() - t0


def blocking_reps(
    session: Session, config: dict[str, Any], work: Path, reps: int, saves: int
) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """Blocking runs without and with fingerprints, alternating; (with, without)."""
    with_fp, without = [], []
    for i in range(reps):
        without.append(
            blocking_run(session, config, work / f"a{i}", fingerprints=False, saves=saves)
        )
        with_fp.append(
            blocking_run(session, config, work / f"b{i}", fingerprints=True, saves=saves)
        )
        print(
            f"  rep {i}: blocking {with_fp[-1]['blocked_s'] * 1e3:.1f} ms with vs "
            f"{without[-1]['blocked_s'] * 1e3:.1f} ms without; step "
            f"{with_fp[-1]['step_s'] * 1e3:.0f} vs {without[-1]['step_s'] * 1e3:.0f} ms; "
            f"fingerprint in the writer {with_fp[-1]['fingerprint_s'] * 1e3:.0f} ms",
            flush=True,
        )
    return with_fp, without


def load_reps(
    session: Session, config: dict[str, Any], work: Path, reps: int
) -> tuple[list[float], list[float]]:
    """One checkpoint loaded again and again, without and with fingerprints, alternating;
    (with, without)."""
    root = work / "load"
    writer = ck.CheckpointWriter(str(root), 0, 1, "bench", False, 5)
    writer.save(1, session.snapshot, {"config": config})
    path = root / "step-000001"
    nbytes = ck.load_manifest(str(path))["total_bytes"]
    loads_with, loads_without = [], []
    for i in range(reps):
        loads_without.append(drill_load(session, path, fingerprints=False))
        loads_with.append(drill_load(session, path, fingerprints=True))
        print(
            f"  rep {i}: drill load {loads_with[-1] * 1e3:.0f} ms with vs "
            f"{loads_without[-1] * 1e3:.0f} ms without ({nbytes / 1e6:.0f} MB)",
            flush=True,
        )
    return loads_with, loads_without


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dir", default=None, help="scratch dir (default: a temp dir)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fingerprint-bench-", dir=args.dir))
    reps = 3 if args.quick else 5
    saves = 3 if args.quick else 6
    t_all = time.perf_counter()
    try:
        session, config = make_session(args.quick)
        fingerprint.prepare().join()
        print(f"# fingerprint bench: {session.n_params / 1e6:.1f}M params, {reps} reps")
        with_fp, without = blocking_reps(session, config, work, reps, saves)
        loads_with, loads_without = load_reps(session, config, work, reps)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(with_fp, without, loads_with, loads_without)
    writer_s = statistics.median(r["fingerprint_s"] for r in with_fp)
    print(
        f"full fingerprint in the writer thread: {writer_s * 1e3:.0f} ms per save "
        f"(off the training thread); total {time.perf_counter() - t_all:.0f} s"
    )
    return 0


def report(
    with_fp: list[dict[str, float]],
    without: list[dict[str, float]],
    loads_with: list[float],
    loads_without: list[float],
) -> None:
    def ratio(a: list[float], b: list[float]) -> float:
        return statistics.median(x / y for x, y in zip(a, b, strict=True))

    blocking = ratio([r["blocked_s"] for r in with_fp], [r["blocked_s"] for r in without])
    steps = ratio([r["step_s"] for r in with_fp], [r["step_s"] for r in without])
    load = ratio(loads_with, loads_without)
    print()
    print(f"{'measure':34s} {'with':>9s} {'without':>9s} {'ratio':>7s}  goal")
    rows = [
        (
            "checkpoint blocking ms",
            statistics.median(r["blocked_s"] for r in with_fp) * 1e3,
            statistics.median(r["blocked_s"] for r in without) * 1e3,
            blocking,
            "<= 1.05",
            blocking <= 1.05,
        ),
        (
            "drill load ms (integrity+load)",
            statistics.median(loads_with) * 1e3,
            statistics.median(loads_without) * 1e3,
            load,
            "<= 1.10",
            load <= 1.10,
        ),
        (
            "training step ms (info)",
            statistics.median(r["step_s"] for r in with_fp) * 1e3,
            statistics.median(r["step_s"] for r in without) * 1e3,
            steps,
            "info",
            None,
        ),
    ]
    for name, a, b, r, goal, ok in rows:
        verdict = "" if ok is None else ("PASS" if ok else "FAIL")
        print(f"{name:34s} {a:9.1f} {b:9.1f} {r:7.3f}  {goal} {verdict}")


if __name__ == "__main__":
    raise SystemExit(main())
