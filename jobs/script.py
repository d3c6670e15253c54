"""The sbatch script of a job, built from its row (``runs.runtime`` renders it).

The preview, the job page and the submit task all call ``job_script_spec``, so the script
a person reads is byte for byte the one that runs.
"""

from __future__ import annotations

import time

import trainer
from jobs.models import Job
from jobs.validation import environment_extra_allowed
from nodes.environment import default_allowed
from runs.runtime import EnvironmentRefused, ScriptSpec, render_sbatch, run_dir, trainer_dir


def _extra_allowed(job: Job) -> tuple[str, ...]:
    """The cluster's additions to the environment allow-list, read only when one of the
    job's names needs them (the job page declares what it reads: jobs.page_versions)."""
    environment = job.environment or {}
    if all(isinstance(name, str) and default_allowed(name) for name in environment):
        return ()
    return environment_extra_allowed(job.cluster)


def job_script_spec(job: Job, *, trainer_path: str, resume_path: str | None) -> ScriptSpec:
    directory = run_dir(job.cluster.workdir, str(job.id), job.run_as)
    args = ["train", "--config", f"{directory}/config.json", "--run-dir", directory]
    if resume_path:
        args += ["--resume", resume_path]
        checkpoint = job.resume_from if job.resume_from_id else None
        if checkpoint is not None and checkpoint.manifest_digest and checkpoint.path == resume_path:
            # The manifest Gantry registered (and proved): a rewritten one is refused.
            args += ["--resume-digest", checkpoint.manifest_digest]
    return ScriptSpec(
        job_id=str(job.id),
        job_name=job.name,
        run_dir=directory,
        trainer_dir=trainer_path,
        python=job.cluster.python,
        partition=job.partition,
        nodes=job.nodes,
        tasks_per_node=job.tasks_per_node,
        cpus_per_task=job.cpus_per_task,
        gpus_per_node=job.gpus_per_node,
        gpu_type=job.gpu_type,
        memory_mb=job.memory_mb,
        time_limit_minutes=job.time_limit_minutes,
        nodelist=job.nodelist_requested,
        switches=job.switches_requested,
        exclude=job.exclude_nodes,
        trainer_args=tuple(args),
        environment=tuple(sorted((job.environment or {}).items())),
        allowed_environment=_extra_allowed(job),
        rank_output=True,
    )


# The trainer's digest names its directory on the cluster. Hashing its files costs a
# millisecond (30 files read), on every job page: worked out again at most once a minute
# (the page says it shows the script as Gantry would submit it now).
_DIGEST_SECONDS = 60.0
_digest: tuple[float, str] | None = None


def _trainer_digest() -> str:
    global _digest
    now = time.monotonic()
    kept = _digest
    if kept is None or now - kept[0] >= _DIGEST_SECONDS:
        kept = (now, trainer.source_digest())
        _digest = kept
    return kept[1]


def job_script(job: Job) -> str:
    """The exact script this job runs (the trainer directory depends only on its version).
    A job whose environment the policy refuses (saved before it) has none: say why."""
    spec = job_script_spec(
        job,
        trainer_path=trainer_dir(job.cluster.workdir, _trainer_digest()),
        resume_path=job.resume_from.path if job.resume_from else None,
    )
    try:
        return render_sbatch(spec)
    except EnvironmentRefused as error:
        return f"# Gantry will not submit this job: {error}\n"
