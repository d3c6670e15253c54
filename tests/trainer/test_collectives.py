"""``python -m trainer collectives``: real gloo ranks on CPU, every result checked, busbw
recomputed here from the reported time and bytes, a corrupted result reported failed."""

from __future__ import annotations

import json
import random
import subprocess
from typing import Any

import pytest
import torch
from trainer_testlib import PY, REPO, free_port, launch_ranks, run_trainer, sub_env

from trainer import collectives as col
from trainer.schema import COLLECTIVES_SCHEMA

# The nccl-tests factors, written out again here rather than imported.
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}
SMALL = ["--min-bytes", "1KiB", "--max-bytes", "32KiB", "--warmup", "1", "--iters", "3"]


def _doc(procs: list[subprocess.CompletedProcess]) -> dict[str, Any]:
    """Rank 0 printed one JSON document; the other ranks print nothing on stdout."""
    assert all(p.stdout == "" for p in procs[1:])
    doc: dict[str, Any] = json.loads(procs[0].stdout)
    return doc


def _check_figures(doc: dict[str, Any], world: int, esize: int) -> None:
    assert doc["schema"] == COLLECTIVES_SCHEMA and doc["world_size"] == world
    ladder = [1 << k for k in range(10, 16)]  # 1 KiB .. 32 KiB
    assert [(r["op"], r["requested_bytes"]) for r in doc["results"]] == [
        (op, size) for op in col.OPS for size in ladder
    ]
    assert doc["skipped"] == []
    for r in doc["results"]:
        split = r["op"] in ("all_gather", "reduce_scatter")
        unit = esize * world if split else esize
        # Size convention: the whole buffer, rounded down to whole elements per rank.
        assert r["bytes"] == r["requested_bytes"] // unit * unit == r["elements"] * esize
        assert 0 < r["time_s_min"] <= r["time_s_mean"] <= r["time_s"]
        algbw = r["bytes"] / r["time_s"]
        assert r["algbw"] == pytest.approx(algbw, rel=1e-12)
        assert r["busbw"] == pytest.approx(algbw * BUS_FACTOR[r["op"]](world), rel=1e-12)
        assert r["correct"] and r["check"] == {
            "bad_ranks": [],
            "bad_elements": 0,
            "first_bad": None,
        }
    for op, peak in doc["peak"].items():
        assert peak["busbw"] == max(r["busbw"] for r in doc["results"] if r["op"] == op)


@pytest.mark.slow  # starts trainer processes: seconds each
@pytest.mark.parametrize(("world", "dtype", "esize"), [(2, "float32", 4), (3, "bfloat16", 2)])
def test_ranks_measure_and_check_every_result(world: int, dtype: str, esize: int) -> None:
    procs = launch_ranks(world, ["collectives", *SMALL, "--dtype", dtype], timeout=120)
    assert [p.returncode for p in procs] == [0] * world, procs[0].stderr[-2000:]
    doc = _doc(procs)
    assert doc["verdict"] == "passed" and doc["backend"] == "gloo" and doc["dtype"] == dtype
    assert doc["launch"] == "torchrun" and doc["device"] == "cpu"
    assert [r["rank"] for r in doc["ranks"]] == list(range(world))
    assert all(r["hostname"] and r["node"] for r in doc["ranks"])
    assert doc["versions"]["torch"] == torch.__version__
    _check_figures(doc, world, esize)


@pytest.mark.slow  # starts trainer processes: seconds each
def test_a_corrupted_result_fails_the_run() -> None:
    args = ["collectives", *SMALL, "--ops", "all_reduce,reduce-scatter"]
    procs = launch_ranks(2, args, timeout=120, TRAINER_FAULT="collective_corrupt@reduce_scatter")
    assert [p.returncode for p in procs] == [col.EXIT_FAILED] * 2
    doc = _doc(procs)
    assert doc["verdict"] == "failed"
    bad = [r for r in doc["results"] if not r["correct"]]
    assert {r["op"] for r in bad} == {"reduce_scatter"} and len(bad) == 6
    assert all(r["correct"] for r in doc["results"] if r["op"] == "all_reduce")
    first = bad[0]["check"]
    assert first["bad_ranks"] == [1] and first["bad_elements"] == 1
    assert first["first_bad"] == {
        "call": "first",
        "index": 0,
        "got": -1.0,
        "expected": first["first_bad"]["expected"],
        "rank": 1,
    }
    assert "reduce_scatter" not in doc["peak"] and "all_reduce" in doc["peak"]


@pytest.mark.slow  # starts trainer processes: seconds each
def test_slurm_launch_records_each_ranks_node() -> None:
    port, world, procs = str(free_port()), 2, []
    for rank in range(world):
        env = sub_env(
            SLURM_PROCID=str(rank),
            SLURM_NTASKS=str(world),
            SLURM_LOCALID="0",
            SLURM_JOB_ID="4242",
            SLURMD_NODENAME=f"gpu-node-{rank}",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            GLOO_SOCKET_IFNAME="lo",
        )
        cmd = [PY, "-m", "trainer", "collectives", *SMALL, "--ops", "broadcast"]
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=-1, stderr=-1, text=True))
    done = [subprocess.CompletedProcess(p.args, p.wait(120), *p.communicate()) for p in procs]
    assert [p.returncode for p in done] == [0, 0], done[0].stderr[-2000:]
    doc = _doc(done)
    assert doc["launch"] == "slurm" and doc["slurm_job_id"] == "4242"
    assert doc["nodes"] == ["gpu-node-0", "gpu-node-1"] == doc["unique_nodes"]
    assert all(r["busbw"] == pytest.approx(r["algbw"]) for r in doc["results"])


@pytest.mark.slow  # starts trainer processes: seconds each
def test_sizes_beyond_the_memory_bound_are_skipped() -> None:
    args = ["collectives", "--ops", "all_reduce", "--min-bytes", "4MiB", "--max-bytes", "16MiB"]
    done = run_trainer([*args, "--iters", "1", "--warmup", "0", "--max-memory", "40MiB"])
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    # 40 MiB less the check's 32 MiB of temporaries: 8 MiB of buffer at most.
    assert [r["bytes"] for r in doc["results"]] == [4 << 20, 8 << 20]
    assert [s["requested_bytes"] for s in doc["skipped"]] == [16 << 20]
    assert doc["options"]["memory_budget_bytes"] == 40 << 20
    assert doc["world_size"] == 1 and doc["results"][0]["busbw"] == 0.0


@pytest.mark.slow  # starts trainer processes: seconds each
@pytest.mark.parametrize(
    "bad",
    [
        ["--ops", "all_to_all"],
        ["--min-bytes", "2KiB", "--max-bytes", "1KiB"],
        ["--max-bytes", "12XB"],
        ["--iters", "0"],
        ["--factor", "1"],
    ],
)
def test_bad_options_are_refused_on_one_line(bad: list[str]) -> None:
    done = run_trainer(["collectives", *bad])
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("trainer: error:")


# ---------------------------------------------------------------- the expected values


def _simulate_sum(inputs: list[torch.Tensor], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A reduction in the collective's dtype, ranks added in a random order per chunk."""
    rng = random.Random(seed)
    out = torch.empty_like(inputs[0])
    for start in range(0, out.numel(), 7):
        order = list(range(len(inputs)))
        rng.shuffle(order)
        acc = torch.zeros(min(7, out.numel() - start), dtype=dtype)
        for r in order:
            acc = acc + inputs[r][start : start + 7]
        out[start : start + 7] = acc
    return out


@pytest.mark.parametrize(
    ("world", "dtype"),
    [(2, "bfloat16"), (5, "float32"), (9, "bfloat16"), (64, "bfloat16"), (300, "bfloat16")],
)
def test_sum_patterns_are_exact_in_any_order(world: int, dtype: str) -> None:
    torch_dtype, count = col.DTYPES[dtype], 1000
    modulus = col.sum_modulus(world, dtype)
    pats = [col.Pattern(world, r, torch_dtype, torch.device("cpu"), modulus) for r in range(world)]
    inputs = [p.sum_input(0, count) for p in pats]
    assert all(int(x.max()) > 0 for x in inputs[: min(world, count)])
    for seed in range(2):
        assert torch.equal(_simulate_sum(inputs, torch_dtype, seed), pats[0].sum_expected(0, count))
    if modulus is None:
        assert dtype == "bfloat16" and world > 256  # one-hot beyond 256 bf16 ranks
    else:
        assert (modulus - 1) * world <= col.EXACT_INTEGER_LIMIT[dtype]


def test_checks_catch_misplaced_blocks_and_missed_broadcasts() -> None:
    world, per_rank, cpu = 4, 64, torch.device("cpu")
    pats = [col.Pattern(world, r, torch.float32, cpu, None) for r in range(world)]
    gathered = torch.cat([pats[r].gather_block(r, 0, per_rank) for r in range(world)])
    expected = col._gathered(per_rank, pats[0])
    check = col.Check()
    col.compare(gathered, expected, check, "first")
    assert check.ok
    swapped = torch.cat([gathered[per_rank : 2 * per_rank], gathered[:per_rank], gathered[128:]])
    col.compare(swapped, expected, check, "first")
    assert not check.ok and check.bad_elements == 2 * per_rank
    missed = col.Check()
    col.compare(torch.zeros(100), pats[1].broadcast_values, missed, "last")
    assert missed.bad_elements == 100 and missed.first_bad == {
        "call": "last",
        "index": 0,
        "got": 0.0,
        "expected": 1.0,
    }
    nan = col.Check()
    col.compare(torch.full((3,), float("nan")), pats[1].broadcast_values, nan, "first")
    assert nan.bad_elements == 3 and nan.first_bad is not None and nan.first_bad["got"] == "nan"


def test_sizes_factors_and_units() -> None:
    assert col.parse_size("1KiB") == 1024 == col.parse_size("1k") == col.parse_size("1024")
    assert col.parse_size("256MiB") == 256 << 20 and col.parse_size("2GB") == 2 << 30
    ladder = col.size_ladder(1 << 10, 256 << 20, 2)
    assert len(ladder) == 19 and ladder[0] == 1024 and ladder[-1] == 256 << 20
    assert col.size_ladder(1000, 16000, 4) == [1000, 4000, 16000]
    assert col.busbw_factor("all_reduce", 8) == 1.75 and col.busbw_factor("broadcast", 8) == 1
    assert col.busbw_factor("all_gather", 4) == 0.75 == col.busbw_factor("reduce_scatter", 4)
    for text in ("", "KiB", "-1", "1.5G", "3 apples"):
        with pytest.raises(col.OptionError):
            col.parse_size(text)


# ---------------------------------------------------------------- NCCL (skipped without CUDA)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.slow
@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_nccl_on_one_gpu(dtype: str) -> None:
    args = ["collectives", "--device", "cuda", "--dtype", dtype, "--max-bytes", "64MiB"]
    done = run_trainer([*args, "--iters", "5"])
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert doc["backend"] == "nccl" and doc["device"] == "cuda" and doc["verdict"] == "passed"
    assert doc["versions"]["nccl"] and doc["device_name"] != "cpu"
    assert all(r["correct"] for r in doc["results"]) and len(doc["results"]) == 4 * 17
    assert doc["peak"]["broadcast"]["busbw"] > 0  # one rank: the others' factors are 0


@pytest.mark.slow
@pytest.mark.gpu
@needs_cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for NCCL ranks")
def test_nccl_ranks_measure_and_catch_a_corrupted_result() -> None:
    world = min(torch.cuda.device_count(), 8)
    args = ["collectives", "--device", "cuda", "--max-bytes", "64MiB", "--iters", "5"]
    procs = launch_ranks(world, args, timeout=300)
    assert [p.returncode for p in procs] == [0] * world, procs[0].stderr[-2000:]
    doc = _doc(procs)
    assert doc["backend"] == "nccl" and all(r["correct"] for r in doc["results"])
    for r in doc["results"]:
        assert r["busbw"] == pytest.approx(r["bytes"] / r["time_s"] * BUS_FACTOR[r["op"]](world))
    bad = launch_ranks(world, args, timeout=300, TRAINER_FAULT="collective_corrupt@all_reduce")
    assert [p.returncode for p in bad] == [col.EXIT_FAILED] * world
    assert {r["op"] for r in _doc(bad)["results"] if not r["correct"]} == {"all_reduce"}
