"""A diverged run's state fingerprint (sums that are NaN or infinite) is kept: JSON has no
such numbers, so they are stored as strings and given back as numbers to the drill."""

from __future__ import annotations

import math

import pytest

from factories import JobFactory
from jobs.ingest import fingerprint_store, finite_json, nonfinite_restored
from jobs.models import StateFingerprint
from trainer.schema import FINGERPRINT_FORMAT

pytestmark = pytest.mark.django_db


def test_a_nan_fingerprint_is_stored_and_restored() -> None:
    job = JobFactory()
    data = {
        "format": FINGERPRINT_FORMAT,
        "step": 120,
        "tensors": {
            "model/w": {
                "shape": [2],
                "dtype": "float32",
                "lhash": 7,
                "sum": math.nan,
                "sumsq": math.inf,
                "sketch": [1.0, -math.inf],
            }
        },
    }
    assert fingerprint_store(job=job, step=120, data=data)
    stored = StateFingerprint.objects.get(job=job, step=120).data
    tensor = stored["tensors"]["model/w"]
    assert (tensor["sum"], tensor["sumsq"], tensor["sketch"]) == (
        "NaN",
        "Infinity",
        [1.0, "-Infinity"],
    )
    back = nonfinite_restored(stored)["tensors"]["model/w"]
    assert math.isnan(back["sum"]) and back["sumsq"] == math.inf
    assert back["sketch"] == [1.0, -math.inf] and back["lhash"] == 7


def test_strings_elsewhere_stay_strings() -> None:
    value = {"scalars": {"name": "NaN"}, "tensors": {}}
    assert nonfinite_restored(finite_json(value)) == value
