"""The sustained-training tier through the real lifecycle and state machine: its one step
over every node (one rank per GPU), judged from the files a trainer run writes (read back
as the step's job left them), against the partition's record and the reference run of the
same configuration key; hostile files end inconclusive, never in a crash."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pytest
from acceptance_support import LoginNode, a100_cluster, end_step, finish_inventory
from django.test import Client
from django.utils import timezone

import trainer
from acceptance.lifecycle import METRICS_MAX_BYTES, step_directory, step_script_spec
from acceptance.models import AcceptanceRun, AcceptanceStep, Certificate
from acceptance.orchestrate import run_advance
from acceptance.services import RunRequest, acceptance_run_start
from acceptance.sustained import bf16_capable, sustained_plan
from acceptance.sustained_judge import (
    GPU_LOSS_TOLERANCE,
    Reference,
    compare_losses,
    losses_digest,
)
from acceptance.tiers import set_nodes
from health.models import NodeHealth
from nodes.models import Cluster, Node
from runs.runtime import render_sbatch
from trainer.schema import ACCEPTANCE_SCHEMA

pytestmark = pytest.mark.django_db
SECONDS = 180


@pytest.fixture
def cluster() -> Cluster:
    return a100_cluster()


def _start(operator: Any, cluster: Cluster, **options: Any) -> AcceptanceRun:
    request = RunRequest(
        cluster_id=cluster.pk,
        scope="partition",
        value="train",
        tiers=["inventory", "sustained"],
        options=options,
    )
    return acceptance_run_start(actor=operator, request=request)


def _loss(step: int) -> float:
    return 3.0 / (1.0 + step / 500.0)


def trainer_files(
    step: AcceptanceStep,
    *,
    tokens_per_s: float,
    loss: Callable[[int], float] = _loss,
    seconds: float = SECONDS,
    extra_lines: str = "",
) -> dict[str, bytes]:
    """metrics.jsonl and acceptance.json as the trainer writes them for this step's
    configuration: a step logged every ``log_every``, at ``tokens_per_s`` after a slow
    start (the warm-up the window leaves out)."""
    configuration = step.configuration or {}
    config = configuration["trainer_config"]
    world = configuration["world_size"]
    tokens_per_step = config["batch_size"] * world * config["seq_len"]
    steps_per_s = tokens_per_s / tokens_per_step
    lines = [json.dumps({"event": "start", "step": 0, "world_size": world, "time": 1.0})]
    step_no, elapsed, line = 0, 0.0, 0
    while elapsed < seconds:
        step_no += config["log_every"]
        line += 1
        # The first ten logged intervals take 2 s more each: compilation, allocator, data.
        elapsed = step_no / steps_per_s + 2.0 * min(line, 10)
        lines.append(
            json.dumps(
                {
                    "step": step_no,
                    "time": 1000.0 + elapsed,
                    "elapsed": elapsed,
                    "loss": loss(step_no),
                    "tokens_per_s": tokens_per_s,
                    "world_size": world,
                }
            )
        )
    lines.append(
        json.dumps(
            {"event": "done", "step": step_no, "final_loss": loss(step_no), "stopped_on_time": True}
        )
    )
    acceptance = {
        "schema": ACCEPTANCE_SCHEMA,
        "unique_nodes": list(step.nodes),
        "world_size": world,
        "config": config,
        "config_sha256": configuration["config_sha256"],
        "precision": configuration["precision"],
        "versions": {"trainer_digest": configuration["trainer_digest"], "torch": "2.4.0"},
        "ranks": [{"rank": r, "device": configuration["device"]} for r in range(world)],
        "flops_per_token": 1.5e6,
        "dataset": {"kind": "markov", "order": 2, "seed": 1234},
        "dataset_sha256": "d" * 64,
        "optimal_loss": 0.8,
    }
    directory = step_directory(step)
    return {
        f"{directory}/metrics.jsonl": ("\n".join(lines) + "\n" + extra_lines).encode(),
        f"{directory}/acceptance.json": json.dumps(acceptance).encode(),
    }


def run_sustained(
    operator: Any,
    cluster: Cluster,
    login_node: LoginNode,
    *,
    files: Callable[[AcceptanceStep], dict[str, bytes]] | None = None,
    tokens_per_s: float = 50_000.0,
    **options: Any,
) -> AcceptanceRun:
    """A run of the inventory and sustained tiers, its sustained step ended with ``files``
    (default: a healthy trainer run at ``tokens_per_s``)."""
    run = _start(operator, cluster, **options)
    finish_inventory(run, login_node)
    run.refresh_from_db()
    assert run.current_tier == "sustained", run.outcomes
    step = AcceptanceStep.objects.get(run=run, tier="sustained")
    written = files(step) if files else trainer_files(step, tokens_per_s=tokens_per_s)
    login_node.files.update(written)
    end_step(step, login_node)
    run_advance(run_id=run.id, now=timezone.now())
    run.refresh_from_db()
    assert not run.is_active
    return run


def _step(run: AcceptanceRun) -> AcceptanceStep:
    return AcceptanceStep.objects.get(run=run, tier="sustained")


def test_one_step_over_every_node_one_rank_per_gpu_in_the_fixed_configuration(
    operator: Any, cluster: Cluster, login_node: LoginNode
) -> None:
    run = _start(operator, cluster, sustained_minutes=5)
    finish_inventory(run, login_node)
    step = _step(run)
    assert step.nodes == ["n1", "n2", "n3", "n4"]
    assert (step.tasks_per_node, step.gpus_per_node) == (2, 2)
    configuration = step.configuration or {}
    # The probe saw no CUDA (the stack has no NCCL): CPU, tiny, fp32.
    assert configuration["device"] == "cpu" and configuration["precision"] == "fp32"
    assert configuration["world_size"] == 8 and configuration["seconds"] == 300
    assert configuration["trainer_config"]["preset"] == "tiny"
    assert configuration["trainer_config"]["data"]["kind"] == "markov"
    assert configuration["trainer_config"]["checkpoint_every"] == 0
    assert configuration["trainer_digest"] == trainer.source_digest()
    assert len(step.config_key) == 64 and step.threshold is None
    spec = step_script_spec(
        AcceptanceStep.objects.select_related("run", "cluster").get(pk=step.pk),
        trainer_path="/srv/t",
    )
    directory = step_directory(step)
    assert spec.trainer_args == (
        "train",
        "--config",
        f"{directory}/config.json",
        "--run-dir",
        directory,
        "--max-seconds",
        "300",
    )
    assert (spec.nodes, spec.tasks_per_node, spec.gpus_per_node) == (4, 2, 2)
    assert spec.nodelist == "n[1-4]" and spec.time_limit_minutes == 5 + 10
    assert spec.environment == (("TRAINER_NUM_THREADS", "1"),)
    assert "export TRAINER_NUM_THREADS=1" in render_sbatch(spec)
    # The judged nodes whole: nobody else's work shares them while they are measured.
    assert "#SBATCH --exclusive" in render_sbatch(spec).splitlines()


def test_the_first_run_of_a_configuration_is_inconclusive_and_becomes_the_record(
    operator: Any, cluster: Cluster, login_node: LoginNode
) -> None:
    first = run_sustained(operator, cluster, login_node, tokens_per_s=50_000.0)
    step = _step(first)
    assert (first.verdict, step.verdict) == ("inconclusive", "inconclusive")
    measured = step.measured or {}
    # The steady-state window leaves the slow first 10 s out: the rate is the sustained one.
    assert measured["tokens_per_s"] == pytest.approx(50_000.0, rel=1e-9)
    assert measured["throughput"]["verdict"] == "inconclusive"
    assert measured["loss"]["verdict"] == "inconclusive"
    assert "no reference run" in measured["loss"]["reason"]
    assert measured["baseline"] is True and first.outcomes["sustained"]["baseline"] is True
    assert measured["mfu"] is None and "not measured" in measured["mfu_note"]
    assert measured["model_flops_per_s"] == pytest.approx(50_000.0 * 1.5e6)
    sustained = Certificate.objects.get(run=first).document["sustained"]
    assert sustained["precision"] == "fp32" and sustained["scale"]["world_size"] == 8
    assert sustained["dataset"]["sha256"] == "d" * 64
    assert sustained["losses_digest"] == losses_digest(
        {int(s): v for s, v in sustained["losses"].items()}
    )
    assert sustained["mfu"]["value"] is None

    second = run_sustained(operator, cluster, login_node, tokens_per_s=49_000.0)
    step = _step(second)
    assert step.threshold_source == "record"
    assert step.threshold == pytest.approx(0.92 * 50_000.0)
    assert (step.configuration or {})["reference_run"] == str(first.id)
    measured = step.measured or {}
    assert measured["throughput"]["verdict"] == "passed"
    assert measured["loss"]["verdict"] == "passed" and measured["loss"]["mode"] == "exact"
    assert measured["loss"]["bit_exact"] == measured["loss"]["compared"] >= 5
    assert (second.verdict, step.verdict) == ("passed", "passed")
    assert set(Node.objects.filter(cluster=cluster).values_list("acceptance_state", flat=True)) == {
        "certified"
    }


def test_below_the_record_fails_and_a_failed_run_is_no_record(
    operator: Any, cluster: Cluster, login_node: LoginNode
) -> None:
    run_sustained(operator, cluster, login_node, tokens_per_s=50_000.0)
    slow = run_sustained(operator, cluster, login_node, tokens_per_s=30_000.0)
    step = _step(slow)
    assert (slow.verdict, step.verdict) == ("failed", "failed")
    assert "65.2% of the threshold" in step.reason
    # The record is still the first run's, not the slow one's.
    third = run_sustained(operator, cluster, login_node, tokens_per_s=50_000.0)
    assert _step(third).threshold == pytest.approx(0.92 * 50_000.0)


def test_an_operator_threshold_judges_the_first_run(
    operator: Any, cluster: Cluster, login_node: LoginNode
) -> None:
    run = run_sustained(
        operator, cluster, login_node, tokens_per_s=50_000.0, sustained_min_tokens_per_s=60_000
    )
    step = _step(run)
    assert (step.threshold, step.threshold_source) == (60_000.0, "operator")
    assert (step.measured or {})["throughput"]["verdict"] == "failed"
    assert run.verdict == "failed"


def test_a_loss_unlike_the_references_fails_and_a_nonfinite_loss_fails(
    operator: Any, cluster: Cluster, login_node: LoginNode
) -> None:
    run_sustained(operator, cluster, login_node)

    def drifted(step: AcceptanceStep) -> dict[str, bytes]:
        return trainer_files(
            step, tokens_per_s=50_000.0, loss=lambda s: _loss(s) + (1e-7 if s >= 100 else 0.0)
        )

    drift = run_sustained(operator, cluster, login_node, files=drifted)
    loss = (_step(drift).measured or {})["loss"]
    assert drift.verdict == "failed" and loss["verdict"] == "failed"
    assert loss["first_mismatch"]["step"] == 100 and "bit for bit" in loss["reason"]

    def diverged(step: AcceptanceStep) -> dict[str, bytes]:
        return trainer_files(
            step, tokens_per_s=50_000.0, loss=lambda s: math.nan if s >= 200 else _loss(s)
        )

    nan = run_sustained(operator, cluster, login_node, files=diverged)
    step = _step(nan)
    assert nan.verdict == "failed" and (step.measured or {})["nonfinite_step"] == 200
    assert "the loss at step 200 is nan" in step.reason
    # Stored as JSON every database takes: no NaN in the kept losses.
    assert all(math.isfinite(v) for v in (step.measured or {})["losses"].values())


def test_hostile_files_are_inconclusive_never_a_crash(
    operator: Any, cluster: Cluster, login_node: LoginNode
) -> None:
    def oversized(step: AcceptanceStep) -> dict[str, bytes]:
        found = trainer_files(step, tokens_per_s=50_000.0)
        found[f"{step_directory(step)}/metrics.jsonl"] = b"{}\n" * (METRICS_MAX_BYTES // 3 + 1)
        return found

    run = run_sustained(operator, cluster, login_node, files=oversized)
    assert _step(run).verdict == "inconclusive" and "metrics.jsonl refused" in _step(run).reason

    def other_nodes(step: AcceptanceStep) -> dict[str, bytes]:
        found = trainer_files(step, tokens_per_s=50_000.0)
        path = f"{step_directory(step)}/acceptance.json"
        doc = json.loads(found[path])
        doc["unique_nodes"] = ["n1", "x9"]
        found[path] = json.dumps(doc).encode()
        return found

    run = run_sustained(operator, cluster, login_node, files=other_nodes)
    assert _step(run).verdict == "inconclusive" and "x9" in _step(run).reason

    garbage = "\n".join(
        [
            "not json",
            "[1, 2]",
            json.dumps({"step": "12", "elapsed": 1.0, "loss": 1.0}),
            json.dumps({"step": True, "elapsed": 1.0, "loss": 1.0}),
            json.dumps({"step": 9_999_999, "elapsed": "Infinity", "loss": 1.0}),
            '{"step": 9999998, "elapsed": Infinity, "loss": 1.0}',
            json.dumps({"step": 9_999_997, "elapsed": 1.0, "loss": [1.0]}),
            "[" * 100_000,
            '{"step": 9999996, "elapsed": 1.0, "loss": 1.0',  # the last line, half written
        ]
    )

    def with_garbage(step: AcceptanceStep) -> dict[str, bytes]:
        return trainer_files(step, tokens_per_s=50_000.0, extra_lines=garbage)

    run = run_sustained(operator, cluster, login_node, files=with_garbage)
    measured = _step(run).measured or {}
    # Judged on the sound lines only; the others counted, none of them a step.
    assert measured["tokens_per_s"] == pytest.approx(50_000.0)
    assert measured["skipped_lines"] == 8 and measured["last_step"] < 9_999_996

    def too_short(step: AcceptanceStep) -> dict[str, bytes]:
        return trainer_files(step, tokens_per_s=50_000.0, seconds=30)

    run = run_sustained(operator, cluster, login_node, files=too_short)
    assert _step(run).verdict == "inconclusive"
    assert "of the 180 s asked for" in _step(run).reason

    def nothing(step: AcceptanceStep) -> dict[str, bytes]:
        return {}

    run = run_sustained(operator, cluster, login_node, files=nothing)
    assert _step(run).verdict == "inconclusive" and "without writing metrics" in _step(run).reason


def test_gpu_sets_run_bf16_where_the_family_has_it_and_need_a_probe(
    operator: Any, cluster: Cluster, login_node: LoginNode
) -> None:
    run = _start(operator, cluster, sustained_minutes=3)
    nodes = set_nodes(run)
    # No probe on record: Gantry cannot tell whether CUDA is there.
    assert "no probe of n1" in str(sustained_plan(run, nodes))
    for node in Node.objects.filter(cluster=cluster):
        NodeHealth.objects.update_or_create(
            node=node,
            defaults={"stack": {"torch": "2.4.0", "nccl": "2.21.5"}, "probed_at": timezone.now()},
        )
    plan = sustained_plan(run, nodes)
    assert not isinstance(plan, str)
    assert (plan.device, plan.precision, plan.world_size) == ("cuda", "bf16", 8)
    assert plan.trainer_config["preset"] == "small"
    assert bf16_capable(["H100 80GB HBM3"]) and bf16_capable(["a100"])
    assert not bf16_capable(["v100"]) and not bf16_capable(["t4"]) and not bf16_capable([])


def test_losses_on_gpus_compare_within_the_stated_tolerance() -> None:
    reference = Reference(label="run x", losses={s: 2.0 for s in range(1, 11)}, digest="")
    close = {s: 2.0 * (1 + GPU_LOSS_TOLERANCE / 2) for s in range(1, 11)}
    found = compare_losses(close, reference, "cuda")
    assert found["verdict"] == "passed" and found["bit_exact"] == 0
    assert found["mode"] == "tolerance"
    far = {**close, 7: 2.0 * (1 + 2 * GPU_LOSS_TOLERANCE)}
    assert compare_losses(far, reference, "cuda")["first_mismatch"]["step"] == 7
    # On CPUs the same losses must be the same bits.
    assert compare_losses(close, reference, "cpu")["verdict"] == "failed"
    assert compare_losses({1: 2.0}, reference, "cpu")["verdict"] == "inconclusive"


def test_the_run_page_and_the_api_show_the_sustained_figures(
    operator: Any, cluster: Cluster, login_node: LoginNode, operator_api: Any
) -> None:
    run = run_sustained(operator, cluster, login_node, tokens_per_s=50_000.0)
    client = Client()
    client.force_login(operator)
    html = client.get(f"/acceptance/{run.id}/").content.decode()
    section = html.split('id="acceptance-sustained"')[1].split("</dl>")[0]
    assert "50000 tokens/s" in section and "fp32" in section
    assert "not measured: no peak FLOP/s on record" in section
    assert "no reference run of this configuration" in section
    assert 'id="sustained-loss-chart"' in html and "<polyline" in html
    detail = operator_api.get(f"/api/v1/acceptance/runs/{run.id}/").json()
    assert detail["sustained"]["throughput"]["tokens_per_s"] == pytest.approx(50_000.0)
    assert detail["recovery"] is None
    # A bad number in the form is a 400 naming the option.
    refused = client.post(
        "/acceptance/start/",
        {"cluster": cluster.pk, "scope": "nodes", "value": "n[1-2]", "sustained_minutes": "x"},
    )
    assert refused.status_code == 400 and "sustained_minutes" in refused.content.decode()


def test_mfu_is_over_the_datasheet_peak_of_one_known_part_only() -> None:
    from acceptance.sustained_judge import _flops, peak_flops_per_gpu

    assert peak_flops_per_gpu(["NVIDIA H200"], "bf16") == 989e12
    assert peak_flops_per_gpu(["NVIDIA H100 80GB HBM3", "h100"], "bf16") == 989e12
    assert peak_flops_per_gpu(["NVIDIA H100 PCIe"], "bf16") == 756e12
    assert peak_flops_per_gpu(["NVIDIA A100-SXM4-80GB"], "fp32") == 19.5e12
    # Unknown, mixed or unlisted parts: no peak, so no MFU (never a guess).
    assert peak_flops_per_gpu(["NVIDIA H100 NVL"], "bf16") is None
    assert peak_flops_per_gpu(["NVIDIA L4"], "bf16") is None
    assert peak_flops_per_gpu(["NVIDIA H200", "NVIDIA A100-SXM4-80GB"], "bf16") is None
    assert peak_flops_per_gpu([], "bf16") is None
    # 8 ranks at 400k tokens/s of a 1e9 FLOP/token model: 5e13 FLOP/s per GPU.
    figures = _flops({"flops_per_token": 1e9}, 400_000.0, 8, 989e12)
    assert figures["model_flops_per_s_per_rank"] == pytest.approx(5e13)
    assert figures["mfu"] == pytest.approx(5e13 / 989e12, rel=1e-5)
    assert "989 TFLOP/s" in figures["mfu_note"]
    assert _flops({"flops_per_token": 1e9}, 400_000.0, 8, None)["mfu"] is None
    assert _flops({"flops_per_token": float("nan")}, 400_000.0, 8, 989e12)["mfu"] is None
