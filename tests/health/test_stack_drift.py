"""Stack fingerprints are stable; drift names the nodes off the partition's majority."""

from __future__ import annotations

from health.stack import Difference, stack_drift, stack_fingerprint

BASE = {
    "driver": "550.54.15",
    "cuda": "12.4",
    "torch": "2.4.0",
    "python": "3.11.7",
    "kernel": "6.1.0",
}


def test_fingerprint_is_stable_and_order_free() -> None:
    reordered = dict(reversed(list(BASE.items())))
    assert stack_fingerprint(BASE) == stack_fingerprint(reordered)
    assert len(stack_fingerprint(BASE)) == 16
    assert stack_fingerprint({**BASE, "torch": "2.5.0"}) != stack_fingerprint(BASE)
    with_packages = {**BASE, "packages": {"numpy": "1.26.4", "Torch": "2.4.0"}}
    assert stack_fingerprint(with_packages) != stack_fingerprint(BASE)
    assert stack_fingerprint({}) == ""


def test_a_node_with_another_torch_is_drift() -> None:
    stacks = {
        "n1": BASE,
        "n2": BASE,
        "n3": {**BASE, "torch": "2.5.0", "packages": {"numpy": "2.0"}},
        "n4": {},  # never probed: not drift
    }
    assert stack_drift(stacks) == [
        Difference("n3", "pkg:numpy", "2.0", None),
        Difference("n3", "torch", "2.5.0", "2.4.0"),
    ]
    # Two nodes against one on the same item is a majority; one against one is not.


def test_a_split_has_no_majority() -> None:
    drift = stack_drift({"n1": BASE, "n2": {**BASE, "nccl": "2.21.5"}})
    assert drift == [
        Difference("n1", "nccl", None, None, split=True),
        Difference("n2", "nccl", "2.21.5", None, split=True),
    ]
    assert stack_drift({"n1": BASE, "n2": dict(BASE)}) == []
    assert stack_drift({"n1": BASE}) == []
