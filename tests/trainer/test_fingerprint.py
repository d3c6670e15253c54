"""State fingerprints: exact digests that add up over shards, distances estimated from
sketches, comparisons that fail closed."""

from __future__ import annotations

import itertools

import pytest
import torch

from trainer import fingerprint as fp


def _parts(tensor: torch.Tensor, cuts: list[int], full: bool = True) -> list[dict]:
    flat = tensor.reshape(-1)
    bounds = [0, *cuts, flat.numel()]
    return [
        fp.tensor_part(flat[a:b], offset=a, global_shape=tensor.shape, full=full)
        for a, b in itertools.pairwise(bounds)
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64])
def test_shards_add_up_to_the_whole_tensor(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    # Crosses a table block boundary, with shards at odd offsets.
    tensor = (torch.randn(fp.BLOCK + 4099) * 100).to(dtype)
    whole = fp.tensor_part(tensor)
    combined = fp.combine(_parts(tensor, [1, 77_777, fp.BLOCK - 3, fp.BLOCK + 1000]))
    assert combined["lhash"] == whole["lhash"]
    assert combined["sumsq"] == pytest.approx(whole["sumsq"], rel=1e-6)
    assert combined["sketch"] == pytest.approx(whole["sketch"], rel=1e-4, abs=1e-3)
    # The sketch is float32 arithmetic: noise ~1e-6, far below any state tolerance.
    assert fp.relative_l2(combined, whole) < 1e-5


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.uint8, torch.bool]
)
def test_any_changed_element_changes_the_digest(dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    tensor = (torch.rand(5000) * 50).to(dtype)
    digest = fp.tensor_part(tensor, full=False)["lhash"]
    for position in (0, 1, 2499, 4999):
        changed = tensor.clone()
        raw = changed.view(torch.uint8)
        size = tensor.element_size()
        raw[position * size] ^= 1  # the lowest bit of that element
        assert fp.tensor_part(changed, full=False)["lhash"] != digest, (dtype, position)
    # Two elements swapped: same sum and norm, another digest.
    swapped = tensor.clone()
    swapped[[10, 20]] = tensor[[20, 10]]
    if not torch.equal(swapped, tensor):
        assert fp.tensor_part(swapped, full=False)["lhash"] != digest


def test_distance_is_estimated_from_the_sketch() -> None:
    torch.manual_seed(2)
    tensor = torch.randn(200_000)
    reference = fp.tensor_part(tensor)
    for scale in (1e-2, 1e-4):
        noisy = tensor + scale * torch.randn_like(tensor)
        estimate = fp.relative_l2(fp.tensor_part(noisy), reference)
        assert scale / 4 < estimate < scale * 4, (scale, estimate)
    # A permutation keeps sum and norm; the sketch still sees it.
    permuted = tensor[torch.randperm(tensor.numel())]
    assert fp.relative_l2(fp.tensor_part(permuted), reference) > 0.3


def _state(tensor: torch.Tensor, full: bool = True) -> dict:
    return {"tensors": {"model/w": fp.tensor_part(tensor, full=full)}, "scalars": {}, "data": {}}


def test_compare_exact_and_tolerance() -> None:
    torch.manual_seed(3)
    tensor = torch.randn(10_000)
    saved = _state(tensor)
    assert (
        fp.compare(_state(tensor, full=False), saved, exact=True, tolerance=0, compare_rng=True)
        == []
    )
    bumped = tensor.clone()
    bumped[7] = torch.nextafter(bumped[7], torch.tensor(10.0))
    problems = fp.compare(
        _state(bumped, full=False), saved, exact=True, tolerance=0, compare_rng=True
    )
    assert [p["key"] for p in problems] == ["model/w"] and problems[0]["kind"] == "bits"
    # Within tolerance: float noise; beyond: 1% on the weights.
    assert fp.compare(_state(bumped), saved, exact=False, tolerance=1e-3, compare_rng=False) == []
    problems = fp.compare(
        _state(tensor * 1.01), saved, exact=False, tolerance=1e-3, compare_rng=False
    )
    assert problems and problems[0]["kind"] == "distance"


def test_compare_fails_closed() -> None:
    tensor = torch.randn(100)
    saved = _state(tensor)
    # Without a sketch no distance can be judged: a problem, never a pass.
    problems = fp.compare(
        _state(tensor, full=False), saved, exact=False, tolerance=1.0, compare_rng=False
    )
    assert problems and problems[0]["kind"] == "distance"
    # A tensor the saved state has and the loaded one lacks, or the other way round.
    missing = fp.compare({"tensors": {}}, saved, exact=True, tolerance=0, compare_rng=False)
    assert [p["kind"] for p in missing] == ["missing"]
    extra = fp.compare(saved, {"tensors": {}}, exact=True, tolerance=0, compare_rng=False)
    assert [p["kind"] for p in extra] == ["unexpected"]
    shape = fp.compare(_state(tensor[:99]), saved, exact=False, tolerance=1.0, compare_rng=False)
    assert [p["kind"] for p in shape] == ["shape"]
