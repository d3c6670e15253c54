"""Whether a resumed job runs on another software stack than the checkpoint it resumed from
was written on: the checkpoint's manifest and the job's acceptance manifest both carry the
trainer's ``versions`` (``trainer/SCHEMA.md``). A mismatched library once cost a 15%
regression; a resume across stacks is said, on the job page and in its timeline."""

from __future__ import annotations

from typing import Any

from jobs.models import Job

# What of ``versions`` is the stack (the platform string and the trainer digest vary with
# the host and the shipped copy; the trainer's version stays).
STACK_KEYS = ("python", "torch", "cuda", "cudnn", "nccl", "numpy", "trainer")


def _versions(document: Any) -> dict[str, Any] | None:
    if not isinstance(document, dict):
        return None
    versions = document.get("versions")
    return versions if isinstance(versions, dict) else None


def stack_changes(job: Job) -> list[str]:
    """``["torch 2.4.0 → 2.5.1", …]`` between the checkpoint the job resumed from and the
    job itself; empty when it did not resume, or either side is not known."""
    checkpoint = job.resume_from if job.resume_from_id else None
    if checkpoint is None:
        return []
    before, after = _versions(checkpoint.manifest), _versions(job.acceptance)
    if before is None or after is None:
        return []
    return [
        f"{key} {before.get(key) or '—'} → {after.get(key) or '—'}"
        for key in STACK_KEYS
        if key in before and key in after and before.get(key) != after.get(key)
    ]
