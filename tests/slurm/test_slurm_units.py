from __future__ import annotations

from datetime import UTC, datetime

import pytest

from slurm.units import (
    Gres,
    json_number,
    parse_duration_seconds,
    parse_gres,
    parse_memory,
    parse_slurm_time,
    parse_timestamp,
    parse_tres,
    tres_gpu_count,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu:a100:2(S:0)", [Gres("gpu", "a100", 2, (), (0,))]),
        ("gpu:h100:2(IDX:0-1)", [Gres("gpu", "h100", 2, (0, 1), ())]),
        ("gpu:a100:0(IDX:N/A)", [Gres("gpu", "a100", 0, (), ())]),
        ("gpu:2", [Gres("gpu", None, 2)]),
        ("gpu", [Gres("gpu", None, 1)]),
        ("gpu:a100", [Gres("gpu", "a100", 1)]),
        ("gres:gpu:1", [Gres("gpu", None, 1)]),
        ("gres:gpu:h100:2", [Gres("gpu", "h100", 2)]),
        ("gpu:a100:4(S:0-1)", [Gres("gpu", "a100", 4, (), (0, 1))]),
        (
            "gpu:a100:2(IDX:0,2),shard:8",
            [Gres("gpu", "a100", 2, (0, 2), ()), Gres("shard", None, 8)],
        ),
        ("(null)", []),
        ("", []),
        (None, []),
    ],
)
def test_parse_gres(text: str | None, expected: list[Gres]) -> None:
    assert parse_gres(text) == expected


def test_parse_gres_is_gpu_distinguishes_other_resources() -> None:
    entries = parse_gres("gpu:a100:2,mps:100")
    assert [entry.is_gpu for entry in entries] == [True, False]


@pytest.mark.parametrize("bad", ["gpu:a100:x", "gpu:a100:2(IDX:a-b)"])
def test_parse_gres_refuses_garbage(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_gres(bad)


def test_parse_tres_and_gpu_count() -> None:
    tres = parse_tres("cpu=2,mem=1000M,node=1,billing=2,gres/gpu=1")
    assert tres == {"cpu": "2", "mem": "1000M", "node": "1", "billing": "2", "gres/gpu": "1"}
    assert tres_gpu_count(tres) == 1
    # Typed entries only are summed; a total is not double counted with them.
    assert tres_gpu_count({"gres/gpu:a100": "2", "gres/gpu:h100": "1"}) == 3
    assert tres_gpu_count({"gres/gpu": "2", "gres/gpu:a100": "2"}) == 2
    assert parse_tres("") == {}
    assert parse_tres(None) == {}
    with pytest.raises(ValueError):
        parse_tres("cpu=2,garbage")


@pytest.mark.parametrize(
    ("text", "mb"),
    [
        ("4000", 4000),
        ("4000M", 4000),
        ("4G", 4096),
        ("1.5T", 1572864),
        ("512K", 1),
        ("0", 0),
        (4000, 4000),
        ("N/A", None),
        ("UNLIMITED", None),
        (None, None),
    ],
)
def test_parse_memory(text: str | int | None, mb: int | None) -> None:
    assert parse_memory(text) == mb


def test_parse_memory_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="memory"):
        parse_memory("lots")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1-02:03:04", 93784),
        ("02:03", 123),  # MM:SS, as Slurm reads and prints it
        ("1:00:00", 3600),
        ("5", 300),  # bare minutes
        ("2-12", 216000),  # days-hours
        ("2-12:30", 217800),  # days-hours:minutes
        ("00:00:01.234", 2),
        ("UNLIMITED", None),
        ("INFINITE", None),
        ("INVALID", None),
        ("Partition_Limit", None),
        ("NONE", None),
        ("", None),
    ],
)
def test_parse_duration_seconds(text: str, seconds: int | None) -> None:
    assert parse_duration_seconds(text) == seconds


def test_parse_slurm_time_gives_minutes_rounded_up() -> None:
    assert parse_slurm_time("1-02:03:04") == 1564
    assert parse_slurm_time("00:05:00") == 5
    assert parse_slurm_time("00:05:01") == 6
    assert parse_slurm_time("UNLIMITED") is None
    with pytest.raises(ValueError, match="Slurm time"):
        parse_slurm_time("soon")


def test_json_numbers_old_and_new_shapes() -> None:
    assert json_number(5) == 5
    assert json_number({"set": True, "infinite": False, "number": 5}) == 5
    assert json_number({"set": False, "infinite": False, "number": 0}) is None
    assert json_number({"set": True, "infinite": True, "number": 0}) is None
    assert json_number(4294967294) is None  # NO_VAL
    assert json_number(True) is None


def test_parse_timestamp() -> None:
    assert parse_timestamp(1796032113) == datetime(2026, 11, 30, 9, 48, 33, tzinfo=UTC)
    assert parse_timestamp("1796032113") == datetime(2026, 11, 30, 9, 48, 33, tzinfo=UTC)
    assert parse_timestamp({"set": True, "number": 1796032113}) == datetime(
        2026, 11, 30, 9, 48, 33, tzinfo=UTC
    )
    assert parse_timestamp("2026-11-30T09:48:33") == datetime(2026, 11, 30, 9, 48, 33, tzinfo=UTC)
    assert parse_timestamp(0) is None
    assert parse_timestamp("Unknown") is None
    assert parse_timestamp(None) is None
