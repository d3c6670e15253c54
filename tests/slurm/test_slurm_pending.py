"""The pending queue: ``squeue --start`` and ``scontrol hold/release``, against outputs
recorded from the dev cluster (``record_pending.sh``) and as argv."""

from __future__ import annotations

import shlex
from datetime import UTC, datetime
from typing import Any

import pytest

from slurm import commands
from slurm.client import SlurmClient
from slurm.errors import SlurmCommandError, SlurmParseError, command_error
from slurm.parsers import (
    SQUEUE_START_FORMAT,
    PendingStart,
    parse_squeue_start,
    queue_places,
)


def test_squeue_start_argv() -> None:
    argv = commands.squeue_start(["gpu", "batch", "gpu"])
    assert argv[:2] == ["env", "SLURM_TIME_FORMAT=%s"]
    assert argv[2:] == [
        "squeue",
        "--all",
        "--noheader",
        "--start",
        "--states=PENDING",
        "--partition=batch,gpu",
        "--format",
        SQUEUE_START_FORMAT,
    ]
    assert "--partition" not in " ".join(commands.squeue_start())


@pytest.mark.parametrize("bad", ["gpu;reboot", "a b", "", "-x", "gpu\n"])
def test_squeue_start_refuses_odd_partitions(bad: str) -> None:
    with pytest.raises(ValueError):
        commands.squeue_start([bad])


def test_squeue_start_needs_a_partition_when_given_a_list() -> None:
    with pytest.raises(ValueError, match="at least one"):
        commands.squeue_start([])


def test_hold_and_release_argv() -> None:
    assert commands.job_hold("123") == ["scontrol", "hold", "123"]
    assert commands.job_release(123) == ["scontrol", "release", "123"]
    for builder in (commands.job_hold, commands.job_release):
        for bad in ("1;reboot", "1 2", "$(id)", "", "12a"):
            with pytest.raises(ValueError):
                builder(bad)
    # Whatever reaches the remote shell is one literal argument.
    assert shlex.split(shlex.join(commands.job_hold("7_3"))) == ["scontrol", "hold", "7_3"]


def test_recorded_squeue_start(recorded: Any) -> None:
    jobs = parse_squeue_start(recorded.text("squeue_start.txt"))
    ids = recorded.folder.joinpath("jobs_pending.txt")
    if not ids.exists():
        pytest.skip("no jobs_pending.txt")
    named = dict(line.split("=", 1) for line in ids.read_text().split())
    by_id = {job.job_id: job for job in jobs}
    assert set(by_id) == {
        named[name]
        for name in (
            "rec-pend-resources",
            "rec-pend-priority",
            "rec-pend-held-user",
            "rec-pend-held-admin",
            "rec-pend-begin",
        )
    }
    waiting = by_id[named["rec-pend-resources"]]
    assert waiting.state == "PENDING"
    assert waiting.partition == "gpu"
    assert waiting.reason == "Resources"
    assert waiting.priority is not None and waiting.priority > 0
    # The backfill plan: a start time (epoch seconds, SLURM_TIME_FORMAT=%s) and its node.
    assert waiting.expected_start is not None and waiting.expected_start.tzinfo is UTC
    assert waiting.submit_time is not None and waiting.expected_start > waiting.submit_time
    assert waiting.scheduled_nodes == "n3"
    held = by_id[named["rec-pend-held-user"]]
    assert (held.reason, held.priority, held.expected_start, held.scheduled_nodes) == (
        "JobHeldUser",
        0,
        None,
        "",
    )
    assert by_id[named["rec-pend-held-admin"]].reason == "JobHeldAdmin"
    begin = by_id[named["rec-pend-begin"]]
    assert begin.partition == "batch" and begin.reason == "BeginTime"
    assert begin.expected_start is not None and begin.expected_start > waiting.expected_start


def test_recorded_queue_places_follow_priority(recorded: Any) -> None:
    jobs = parse_squeue_start(recorded.text("squeue_start.txt"))
    ids = recorded.folder.joinpath("jobs_pending.txt")
    if not ids.exists():
        pytest.skip("no jobs_pending.txt")
    named = dict(line.split("=", 1) for line in ids.read_text().split())
    places = queue_places(jobs)
    gpu = {name: places[named[name]] for name in named if named[name] in places}
    assert gpu["rec-pend-resources"].position == 1
    assert gpu["rec-pend-priority"].position == 2
    # Held jobs have priority 0: at the back of the queue.
    assert {gpu["rec-pend-held-user"].position, gpu["rec-pend-held-admin"].position} == {3, 4}
    assert {place.of for name, place in gpu.items() if place.partition == "gpu"} == {4}
    assert gpu["rec-pend-begin"].partition == "batch"
    assert (gpu["rec-pend-begin"].position, gpu["rec-pend-begin"].of) == (1, 1)


def test_recorded_hold_and_release_errors(recorded: Any) -> None:
    assert recorded.text("scontrol_hold.rc").strip() == "0"
    assert recorded.text("scontrol_hold.txt") == ""
    assert recorded.text("scontrol_release.rc").strip() == "0"
    for name in ("scontrol_hold_unknown", "scontrol_release_unknown"):
        assert recorded.text(f"{name}.rc").strip() == "1"
        assert "Invalid job id specified" in recorded.text(f"{name}.txt")


def test_ties_break_by_submit_time_then_id() -> None:
    early = datetime(2026, 1, 1, tzinfo=UTC)
    late = datetime(2026, 1, 2, tzinfo=UTC)

    def job(job_id: str, priority: int, submitted: datetime, partition: str = "p") -> PendingStart:
        return PendingStart(job_id, partition, "PENDING", priority, None, submitted, "", None)

    places = queue_places(
        [
            job("30", 5, late),
            job("20", 5, early),
            job("10", 5, early),
            job("40", 9, late),
            job("50", 1, early, partition="other"),
        ]
    )
    assert [places[i].position for i in ("40", "10", "20", "30")] == [1, 2, 3, 4]
    assert places["50"].position == 1 and places["50"].of == 1


@pytest.mark.parametrize(
    "line",
    [
        "abc|gpu|PENDING|1|N/A|N/A|(null)|Resources",
        "12|gpu|PENDING|1|N/A",
        "12|gpu|PENDING|many|N/A|N/A|(null)|Resources",
    ],
)
def test_bad_lines_are_parse_errors(line: str) -> None:
    with pytest.raises(SlurmParseError):
        parse_squeue_start(line + "\n")


def test_a_reason_with_the_separator_stays_whole() -> None:
    (job,) = parse_squeue_start("12|gpu|PENDING|1|N/A|N/A|(null)|odd|reason\n")
    assert job.reason == "odd|reason"


class Runner:
    def __init__(self, rc: int, stdout: str = "", stderr: str = "") -> None:
        self.rc, self.stdout, self.stderr = rc, stdout, stderr
        self.calls: list[list[str]] = []

    def exec(self, argv: Any, **_: Any) -> Any:
        self.calls.append(list(argv))
        if _.get("check", True) and self.rc != 0:
            raise command_error(list(argv), self.rc, self.stdout, self.stderr)
        return self


def test_client_pending_starts_is_one_command(recorded: Any) -> None:
    runner = Runner(0, recorded.text("squeue_start.txt"))
    jobs = SlurmClient(runner).pending_starts(["gpu", "batch"])
    assert len(runner.calls) == 1 and "--start" in runner.calls[0]
    assert len(jobs) == 5


def test_client_hold_of_an_unknown_job_raises(recorded: Any) -> None:
    runner = Runner(1, "", recorded.text("scontrol_hold_unknown.txt"))
    with pytest.raises(SlurmCommandError, match="Invalid job id"):
        SlurmClient(runner).hold("99999999")
    assert runner.calls == [["scontrol", "hold", "99999999"]]
