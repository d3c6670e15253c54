"""A resume's batch script holds the trainer to the manifest Gantry registered."""

from __future__ import annotations

from typing import Any

import pytest

from factories import CheckpointFactory, JobFactory
from jobs.script import job_script

pytestmark = pytest.mark.django_db


def test_a_resume_passes_the_registered_manifest_digest(researcher: Any) -> None:
    parent = JobFactory(owner=researcher)
    checkpoint = CheckpointFactory(job=parent, step=40, manifest_digest="ab" * 32)
    job = JobFactory(owner=researcher, parent=parent, resume_from=checkpoint)
    script = job_script(job)
    assert f"--resume {checkpoint.path}" in script or checkpoint.path in script
    assert f"--resume-digest {'ab' * 32}" in script


def test_a_checkpoint_registered_before_digests_resumes_without_one(researcher: Any) -> None:
    parent = JobFactory(owner=researcher)
    checkpoint = CheckpointFactory(job=parent, step=40, manifest_digest="")
    job = JobFactory(owner=researcher, parent=parent, resume_from=checkpoint)
    assert "--resume-digest" not in job_script(job)
