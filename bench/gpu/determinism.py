"""GPU determinism checks of the bundled trainer (run by bench/gpu/device_checks.sh on a
machine with a GPU; plain torch and the trainer, no Django).

For each precision (bf16, fp32): the same deterministic config trained twice must log the
same losses bit for bit; a run resumed from its step-100 checkpoint must log the losses of
the uninterrupted run after step 100 bit for bit; the restore drill of that checkpoint must
pass, and the drill of a copy damaged with every hash valid (weights × 1.01, files and
manifest rewritten) must fail. Writes ``determinism.json`` to the output folder."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

STEPS = 300
EVERY = 100
# Where and what: the GPU and the small preset by default; CHECK_DEVICE=cpu
# CHECK_PRESET=tiny tries the script itself on a machine without a GPU.
DEVICE = os.environ.get("CHECK_DEVICE", "cuda")
PRESET = os.environ.get("CHECK_PRESET", "small")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainer", *args], capture_output=True, text=True, timeout=300
    )


def _losses(run_dir: Path) -> dict[int, float]:
    found: dict[int, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "step" in record and "loss" in record and "event" not in record:
            found[int(record["step"])] = float(record["loss"])
    return found


def _same(a: dict[int, float], b: dict[int, float]) -> bool:
    steps = sorted(set(a) & set(b))
    return bool(steps) and all(
        a[s] == b[s] or (math.isnan(a[s]) and math.isnan(b[s])) for s in steps
    )


def check(precision: str, root: Path) -> dict[str, Any]:
    config = {
        "preset": PRESET,
        "steps": STEPS,
        "precision": precision,
        "device": DEVICE,
        "deterministic": True,
        "checkpoint_every": EVERY,
        "checkpoint_keep": 5,
        "log_every": 1,
    }
    cfg = root / f"{precision}.json"
    cfg.write_text(json.dumps(config))
    result: dict[str, Any] = {"precision": precision}
    runs = {}
    for name in ("a", "b"):
        started = time.perf_counter()
        done = _run("train", "--config", str(cfg), "--run-dir", str(root / f"{precision}-{name}"))
        result[f"train_{name}_rc"] = done.returncode
        result[f"train_{name}_s"] = round(time.perf_counter() - started, 2)
        if done.returncode != 0:
            result[f"train_{name}_stderr"] = done.stderr[-2000:]
            return result
        runs[name] = _losses(root / f"{precision}-{name}")
    result["same_config_bit_exact"] = _same(runs["a"], runs["b"])
    result["final_loss"] = runs["a"][max(runs["a"])]
    checkpoint = root / f"{precision}-a" / "checkpoints" / f"step-{EVERY:06d}"
    resumed = root / f"{precision}-resumed"
    done = _run("train", "--run-dir", str(resumed), "--resume", str(checkpoint))
    result["resume_rc"] = done.returncode
    if done.returncode == 0:
        after = {s: v for s, v in _losses(resumed).items() if s > EVERY}
        result["resume_bit_exact"] = _same(after, runs["a"]) and len(after) > 0
    else:
        result["resume_stderr"] = done.stderr[-2000:]
    reference = str(root / f"{precision}-a" / "metrics.jsonl")
    clean = _run(
        "drill",
        "--checkpoint",
        str(checkpoint),
        "--reference",
        reference,
        "--steps",
        "50",
        "--out",
        str(root / f"{precision}-drill-clean.json"),
    )
    result["drill_clean_rc"] = clean.returncode
    damaged = root / f"{precision}-damaged" / f"step-{EVERY:06d}"
    shutil.copytree(checkpoint, damaged)
    from drill_damage import _scale_weights, rewrite_rank

    rewrite_rank(damaged, 0, _scale_weights)
    bad = _run(
        "drill",
        "--checkpoint",
        str(damaged),
        "--reference",
        reference,
        "--steps",
        "50",
        "--out",
        str(root / f"{precision}-drill-damaged.json"),
    )
    result["drill_damaged_rc"] = bad.returncode
    for kind in ("clean", "damaged"):
        path = root / f"{precision}-drill-{kind}.json"
        if path.exists():
            report = json.loads(path.read_text())
            result[f"drill_{kind}_verdict"] = report.get("verdict")
            result[f"drill_{kind}_reason"] = str(report.get("reason", ""))[:300]
    result["ok"] = bool(
        result.get("same_config_bit_exact")
        and result.get("resume_bit_exact")
        and result.get("drill_clean_verdict") == "passed"
        and result.get("drill_damaged_verdict") == "failed"
    )
    return result


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "var/gpu-checks")
    root = Path("/tmp/gantry-gpu-determinism")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    results = [check(precision, root) for precision in ("bf16", "fp32")]
    (out / "determinism.json").write_text(json.dumps(results, indent=2))
    for item in results:
        print(json.dumps(item))
    return 0 if all(item.get("ok") for item in results) else 1


if __name__ == "__main__":
    sys.exit(main())
