"""Error classification, and SlurmClient over a fake runner that replays recorded outputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from slurm.client import SlurmClient
from slurm.errors import (
    TRANSIENT_ERRORS,
    HostKeyMismatch,
    HostKeyUnknown,
    SlurmCommandError,
    SlurmControllerUnavailable,
    SlurmError,
    SlurmNotFound,
    SlurmParseError,
    SshAuthenticationError,
    SshCommandTimeout,
    SshTransientError,
    command_error,
    is_transient,
)


def test_hierarchy_and_transience() -> None:
    assert issubclass(HostKeyMismatch, SlurmError) and issubclass(SlurmNotFound, SlurmCommandError)
    assert SshTransientError("x").transient
    assert SshCommandTimeout("x", argv=["sleep"], timeout=1).transient
    assert not SshAuthenticationError("x").transient
    assert not HostKeyUnknown(
        "x", host="h", port=22, key_type="ssh-ed25519", fingerprint_seen="SHA256:a"
    ).transient
    assert not SlurmParseError("sinfo", "junk").transient
    assert SshTransientError in TRANSIENT_ERRORS
    assert is_transient(SlurmControllerUnavailable("x", argv=["sinfo"], rc=1))
    assert not is_transient(ValueError("x"))


def test_command_error_classification() -> None:
    missing = command_error(
        ["sinfo", "--json"], 127, "", "bash: line 1: sinfo: command not found\n"
    )
    assert isinstance(missing, SlurmNotFound)
    assert "sinfo is not available" in str(missing)
    down = command_error(
        ["squeue"],
        1,
        "",
        "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n",
    )
    assert isinstance(down, SlurmControllerUnavailable) and down.transient
    rejected = command_error(
        ["sbatch", "--parsable"],
        1,
        "",
        "sbatch: error: Batch job submission failed: "
        "Requested node configuration is not available\n",
    )
    assert type(rejected) is SlurmCommandError and not rejected.transient
    assert rejected.rc == 1 and "Requested node configuration" in str(rejected)
    assert rejected.argv == ["sbatch", "--parsable"]
    wrapped = command_error(["env", "SLURM_TIME_FORMAT=%s", "sacct"], 1, "", "boom\n")
    assert str(wrapped).startswith("sacct failed (exit 1): boom")


def test_recorded_sbatch_rejections_are_permanent(recorded: Any) -> None:
    for name in ("sbatch_error_too_many_gpus", "sbatch_error_bad_partition"):
        rc = int(recorded.text(f"{name}.rc").strip())
        error = command_error(["sbatch"], rc, "", recorded.text(f"{name}.txt"))
        assert rc != 0
        assert type(error) is SlurmCommandError
        assert "Batch job submission failed" in error.stderr


@dataclass
class FakeResult:
    argv: list[str]
    rc: int
    stdout: str
    stderr: str = ""


@dataclass
class FakeRunner:
    """Answers by the program and first distinguishing argument; records every call."""

    answers: dict[str, tuple[int, str, str]]
    calls: list[list[str]] = field(default_factory=list)

    def exec(self, argv: Any, *, stdin: Any = None, timeout: Any = None, check: bool = True) -> Any:
        argv = list(argv)
        self.calls.append(argv)
        words = [word for word in argv if word not in ("env", "SLURM_TIME_FORMAT=%s")]
        key = " ".join(words[:2]) if words[0] != "scontrol" else " ".join(words[:4])
        if words[0] == "squeue" and "--noheader" in words:
            key = "squeue --noheader"  # the filtered text form
        for prefix, (rc, out, err) in self.answers.items():
            if key.startswith(prefix):
                if check and rc != 0:
                    raise command_error(argv, rc, out, err)
                return FakeResult(argv, rc, out, err)
        raise AssertionError(f"unexpected command {argv}")


def _answers(recorded: Any, sinfo: tuple[int, str, str] | None = None) -> dict[str, Any]:
    return {
        "sinfo --json": sinfo or (0, recorded.text("sinfo_drained.json"), ""),
        "scontrol --oneliner show node": (0, recorded.text("scontrol_show_node_oneliner.txt"), ""),
        "scontrol --oneliner show partition": (
            0,
            recorded.text("scontrol_show_partition_oneliner.txt"),
            "",
        ),
        "scontrol show topology": (0, recorded.text("scontrol_show_topology.txt"), ""),
        "squeue --all": (0, recorded.text("squeue.json"), ""),
        "squeue --noheader": (0, recorded.text("squeue.txt"), ""),
        "sacct --allusers": (0, recorded.text("sacct_allocations.txt"), ""),
        "sbatch --parsable": (0, "4242\n", ""),
    }


def test_inventory_is_three_commands_whatever_the_size(recorded: Any) -> None:
    runner = FakeRunner(_answers(recorded))
    client = SlurmClient(runner)
    inventory = client.inventory()
    assert len(runner.calls) == 3
    assert len(inventory.nodes) == 4 and inventory.gpu_count == 8
    assert [p.name for p in inventory.partitions] == ["batch", "gpu"]
    assert {s.name for s in inventory.switches} == {"leaf1", "leaf2", "spine"}
    drained = next(node for node in inventory.nodes if node.name == "n2")
    assert drained.state == "drained" and drained.reason == "maintenance test"
    assert client.json_supported is True
    client.inventory()
    assert len(runner.calls) == 6


def test_inventory_falls_back_to_text_once_and_remembers(recorded: Any) -> None:
    no_json = (1, "", "sinfo: unrecognized option '--json'\n")
    runner = FakeRunner(_answers(recorded, sinfo=no_json))
    client = SlurmClient(runner)
    inventory = client.inventory()
    assert [call[:2] for call in runner.calls][:2] == [
        ["sinfo", "--json"],
        ["scontrol", "--oneliner"],
    ]
    assert len(inventory.nodes) == 4 and inventory.gpu_count == 8
    assert client.json_supported is False
    assert "unrecognized option" in (client.json_unsupported_reason or "")
    runner.calls.clear()
    client.inventory()
    assert ["sinfo", "--json"] not in runner.calls and len(runner.calls) == 3


def test_slurm_missing_is_not_hidden_by_the_fallback(recorded: Any) -> None:
    missing = (127, "", "bash: sinfo: command not found\n")
    client = SlurmClient(FakeRunner(_answers(recorded, sinfo=missing)))
    with pytest.raises(SlurmNotFound):
        client.inventory()
    assert client.json_supported is None


def test_jobs_in_queue_and_accounting_are_one_command_each(recorded: Any) -> None:
    runner = FakeRunner(_answers(recorded))
    client = SlurmClient(runner)
    ids = recorded.job_ids()
    running, pending = ids["rec-running-2n"], ids["rec-pending-res"]
    queue = client.jobs_in_queue([running, pending, "999"])
    assert sorted(queue) == sorted([running, pending])
    assert queue[running].state == "RUNNING"
    assert queue[pending].state == "PENDING"
    accounting = client.jobs_accounting([ids["rec-failed"], ids["rec-completed"], "999"])
    assert accounting[ids["rec-failed"]].exit_code == 3
    assert accounting[ids["rec-completed"]].state == "COMPLETED"
    assert len(runner.calls) == 2
    assert client.jobs_in_queue([]) == {} and client.jobs_accounting([]) == {}
    assert len(runner.calls) == 2


def test_find_jobs_by_tag_merges_queue_and_accounting(recorded: Any) -> None:
    runner = FakeRunner(_answers(recorded))
    client = SlurmClient(runner)
    found = client.find_jobs_by_tag("rec-failed")
    ids = recorded.job_ids()
    assert ids["rec-failed"] in [job.job_id for job in found]
    assert all(job.name == "rec-failed" for job in found)
    # One squeue and one sacct, both filtered by the tag on the cluster's side.
    programs = [
        next(word for word in call if "=" not in word and word != "env") for call in runner.calls
    ]
    assert programs == ["squeue", "sacct"]
    assert all("--name=rec-failed" in call for call in runner.calls)
    assert client.find_jobs_by_tag("gantry-nothing-like-this") == []


def test_tags_are_looked_up_together_and_absence_needs_accounting(recorded: Any) -> None:
    ids = recorded.job_ids()
    runner = FakeRunner(_answers(recorded))
    lookup = SlurmClient(runner).jobs_by_tags(["rec-failed", "rec-completed", "gantry-none"])
    assert len(runner.calls) == 2
    assert "--name=rec-failed,rec-completed,gantry-none" in runner.calls[0]
    assert [job.job_id for job in lookup.found["rec-failed"]] == [ids["rec-failed"]]
    assert lookup.proves_absent("gantry-none") and not lookup.proves_absent("rec-failed")
    answers = _answers(recorded)
    answers["sacct --allusers"] = (1, "", "sacct: error: Slurm accounting storage is disabled")
    broken = SlurmClient(FakeRunner(answers)).jobs_by_tags(["gantry-none"])
    assert not broken.accounting_ok and "disabled" in broken.accounting_error
    assert not broken.proves_absent("gantry-none")


def test_an_unreadable_sacct_answer_proves_no_absence_and_hides_not_the_queue(
    recorded: Any,
) -> None:
    # sacct exited 0 with text nobody can read (a truncated line): like accounting down,
    # the queue's answer stands and absence is not proven; before, the lookup failed.
    answers = _answers(recorded)
    answers["sacct --allusers"] = (0, "garbage\n", "")
    runner = FakeRunner(answers)
    lookup = SlurmClient(runner).jobs_by_tags(["gantry-none"])
    assert len(runner.calls) == 2 and lookup.found == {"gantry-none": []}
    assert not lookup.accounting_ok and "cannot parse sacct" in lookup.accounting_error
    assert not lookup.proves_absent("gantry-none")


def test_submit_returns_the_job_id(recorded: Any) -> None:
    runner = FakeRunner(_answers(recorded))
    client = SlurmClient(runner)
    assert client.submit("/w/job.sbatch", tag="gantry-abc", partition="batch") == "4242"
    assert runner.calls[-1][:4] == [
        "sbatch",
        "--parsable",
        "--job-name=gantry-abc",
        "--comment=gantry-abc",
    ]


def test_permission_refusal_is_its_own_permanent_error() -> None:
    from slurm.errors import SlurmPermissionDenied

    error = command_error(
        ["scontrol", "update", "NodeName=n2", "State=DRAIN", "Reason=x"],
        1,
        "",
        "slurm_update error: Invalid user id\n",
    )
    assert isinstance(error, SlurmPermissionDenied) and not error.transient
    assert "operator rights" in str(error)
