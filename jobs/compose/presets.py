"""The trainer's presets described for people: model size, and the step time past jobs
measured on a partition. The parameter count is computed from the config alone (the
shapes of ``trainer.model.TinyGPT``), without torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Avg

from jobs.goodput import ledger as goodput
from jobs.models import Job, MetricPoint
from nodes.models import Cluster
from trainer.config import PRESETS, Config, ConfigError
from trainer.config import validate as trainer_config_validate

# How many of the newest past jobs with the same preset a step-time estimate looks at.
STEP_TIME_JOBS = 20


def model_parameters(config: Config) -> int:
    """Trainable parameters of the trainer's model for ``config``: token and position
    embeddings; per block two LayerNorms, the attention (qkv and output projections, with
    biases) and the MLP; the final LayerNorm and the output head (no bias)."""
    d, ff, vocab = config.d_model, config.ff_dim, config.vocab_size
    block = 2 * (2 * d) + (d * 3 * d + 3 * d) + (d * d + d) + (d * ff + ff) + (ff * d + d)
    return vocab * d + config.seq_len * d + config.n_layers * block + 2 * d + d * vocab


def parameters_in_words(count: int) -> str:
    if count >= 1_000_000_000:
        return f"{count / 1e9:.2f} B parameters"
    if count >= 1_000_000:
        return f"{count / 1e6:.2f} M parameters"
    if count >= 1_000:
        return f"{count / 1e3:.1f} k parameters"
    return f"{count} parameters"


@dataclass(frozen=True)
class StepTime:
    """The step time past jobs measured: the median over jobs of each job's mean step
    time. ``seconds`` is None when no past job has measured one."""

    seconds: float | None
    jobs: int


def measured_step_time(job_ids: list[Any]) -> StepTime:
    """The median over these jobs of each one's mean step time: one query."""
    means = [
        float(row["mean"])
        for row in MetricPoint.objects.filter(job_id__in=job_ids, step_time_s__gt=0)
        .values("job_id")
        .annotate(mean=Avg("step_time_s"))
        .order_by()
        if row["mean"] is not None
    ]
    return StepTime(seconds=goodput.median(means), jobs=len(means))


def past_job_ids(*, cluster: Cluster, partition: str, preset: str | None) -> list[Any]:
    """The newest jobs that logged steps on the partition (with ``preset``, if given)."""
    jobs = Job.objects.filter(cluster=cluster, partition=partition, last_step__isnull=False)
    if preset:
        jobs = jobs.filter(config__preset=preset)
    return list(jobs.order_by("-created_at").values_list("id", flat=True)[:STEP_TIME_JOBS])


def preset_step_time(*, cluster: Cluster, partition: str, preset: str) -> StepTime:
    """Measured step time of jobs with ``preset`` on ``partition``: two queries."""
    job_ids = past_job_ids(cluster=cluster, partition=partition, preset=preset)
    return measured_step_time(job_ids) if job_ids else StepTime(seconds=None, jobs=0)


def preset_descriptions(
    *, cluster: Cluster | None, partition: str | None, config: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Every preset: its model size and shape, and the step time measured on the partition
    (None with ``jobs`` 0 when none was: the page then says unknown). ``config``: the
    form's other trainer keys, which change the size (an explicit ``d_model``, say)."""
    described = []
    overrides = {key: value for key, value in (config or {}).items() if key != "preset"}
    for name in PRESETS:
        try:
            resolved = trainer_config_validate({**overrides, "preset": name})
        except ConfigError:
            resolved = trainer_config_validate({"preset": name})
        parameters = model_parameters(resolved)
        step = (
            preset_step_time(cluster=cluster, partition=partition, preset=name)
            if cluster is not None and partition
            else StepTime(seconds=None, jobs=0)
        )
        described.append(
            {
                "name": name,
                "parameters": parameters,
                "size": parameters_in_words(parameters),
                "shape": (
                    f"d_model {resolved.d_model}, {resolved.n_layers} layers, "
                    f"{resolved.n_heads} heads, sequence {resolved.seq_len}, "
                    f"batch {resolved.batch_size} per rank"
                ),
                "partition": partition or "",
                "step_time_s": step.seconds,
                "step_time_jobs": step.jobs,
            }
        )
    return described
