"""The node slots that let cluster tests share the dev cluster (tests/lanes.py): plain
files and locks, no cluster."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import lanes


def slots(tmp_path: Path) -> lanes.NodeSlots:
    return lanes.NodeSlots({"batch": 2, "gpu": 2}, tmp_path)


def test_any_partition_goes_to_one_with_room_and_all_or_nothing(tmp_path: Path) -> None:
    with slots(tmp_path).held({}, any_of=2) as first, slots(tmp_path).held({}, any_of=2) as second:
        assert {first, second} == {"batch", "gpu"}
        # Nothing is left: a third waits, and takes no slot of a partition meanwhile.
        with pytest.raises(TimeoutError), slots(tmp_path).held({}, any_of=1, timeout=0.5):
            pass
    with slots(tmp_path).held({"batch": 2, "gpu": 2}) as everything:
        assert everything is None


def test_a_waiter_gets_the_slots_once_they_are_given_back(tmp_path: Path) -> None:
    got: list[float] = []

    def wait_for_batch() -> None:
        started = time.monotonic()
        with slots(tmp_path).held({"batch": 2}, timeout=10):
            got.append(time.monotonic() - started)

    with slots(tmp_path).held({"batch": 1}):
        waiter = threading.Thread(target=wait_for_batch)
        waiter.start()
        time.sleep(0.6)
        assert got == []
    waiter.join(timeout=10)
    assert got and got[0] >= 0.5


def test_a_need_larger_than_the_partition_is_refused(tmp_path: Path) -> None:
    with pytest.raises(pytest.UsageError), slots(tmp_path).held({"batch": 3}):
        pass
    with pytest.raises(pytest.UsageError), slots(tmp_path).held({"nope": 1}):
        pass


def test_nodes_zero_takes_nothing(tmp_path: Path) -> None:
    with slots(tmp_path).held({"batch": 2, "gpu": 2}), slots(tmp_path).held({"batch": 0}) as none:
        assert none is None
