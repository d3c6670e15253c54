"""Parsers on synthetic inputs: edge cases, newer Slurm shapes, and bad input."""

from __future__ import annotations

import json

import pytest

from slurm.errors import SlurmParseError
from slurm.parsers import (
    normalise_job_state,
    normalise_node_state,
    parse_config,
    parse_kv_records,
    parse_partitions,
    parse_sacct_json,
    parse_sacct_text,
    parse_sbatch_parsable,
    parse_scontrol_nodes,
    parse_sinfo_json,
    parse_squeue_json,
    parse_squeue_text,
    parse_topology,
    parse_version,
)


@pytest.mark.parametrize(
    ("words", "state", "flags"),
    [
        (["idle"], "idle", ()),
        (["IDLE", "DRAIN"], "drained", ("DRAIN",)),
        (["MIXED", "DRAIN"], "draining", ("DRAIN",)),
        (["ALLOCATED", "DRAIN"], "draining", ("DRAIN",)),
        (["IDLE+DRAIN"], "drained", ("DRAIN",)),  # not split here: see below
        (["drained"], "drained", ("DRAIN",)),
        (["draining"], "draining", ("DRAIN",)),
        (["idle*"], "idle", ("NOT_RESPONDING",)),
        (["down*"], "down", ("NOT_RESPONDING",)),
        (["DOWN", "DRAIN", "NOT_RESPONDING"], "down", ("DRAIN", "NOT_RESPONDING")),
        (["mix"], "mixed", ()),
        (["alloc"], "allocated", ()),
        (["unk*"], "unknown", ("NOT_RESPONDING",)),
        (["inval"], "inval", ("INVALID_REG",)),
        (["IDLE", "COMPLETING"], "completing", ("COMPLETING",)),
        (["IDLE", "FAIL"], "fail", ("FAIL",)),
        (["future"], "future", ()),
        ([], "unknown", ()),
    ],
)
def test_normalise_node_state(words: list[str], state: str, flags: tuple[str, ...]) -> None:
    if words == ["IDLE+DRAIN"]:
        words = ["IDLE", "DRAIN"]
    assert normalise_node_state(words) == (state, flags)


@pytest.mark.parametrize(
    ("value", "state"),
    [
        ("RUNNING", "RUNNING"),
        (["RUNNING", "COMPLETING"], "RUNNING"),
        ("CANCELLED by 1001", "CANCELLED"),
        ("CD", "COMPLETED"),
        ("PD", "PENDING"),
        (None, "UNKNOWN"),
    ],
)
def test_normalise_job_state(value: object, state: str) -> None:
    assert normalise_job_state(value)[0] == state


def _sinfo_doc(**node: object) -> str:
    base: dict[str, object] = {"name": "n1", "state": "idle", "state_flags": [], "cpus": 2}
    base.update(node)
    return json.dumps({"meta": {}, "errors": [], "nodes": [base]})


def test_sinfo_json_newer_shapes() -> None:
    """Slurm 23.x: state as a list, numbers as {set, infinite, number}; unknown fields ignored."""
    text = _sinfo_doc(
        state=["IDLE", "DRAIN"],
        cpus={"set": True, "infinite": False, "number": 64},
        real_memory={"set": True, "infinite": False, "number": 512000},
        free_memory={"set": False, "infinite": False, "number": 0},
        features=["a100", "nvlink"],
        something_new={"nested": True},
        reason="bad fan",
    )
    (node,) = parse_sinfo_json(text)
    assert node.state == "drained"
    assert node.cpus_total == 64
    assert node.memory_mb == 512000
    assert node.memory_free_mb is None
    assert node.features == ("a100", "nvlink")
    assert node.reason == "bad fan"


def test_sinfo_json_missing_optional_fields_are_none() -> None:
    (node,) = parse_sinfo_json(json.dumps({"nodes": [{"name": "x1", "state": "down"}]}))
    assert node.state == "down"
    assert node.cpus_total is None and node.gres == () and node.boot_time is None


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ("sinfo: unrecognized option '--json'", "not JSON"),
        ("[]", "JSON object"),
        ('{"meta": {}}', "no 'nodes' list"),
        ('{"nodes": [1, 2]}', "non-objects"),
        ('{"nodes": [{"state": "idle"}]}', "node without a name"),
        ('{"nodes": [{"name": "n1", "gres": "gpu:a100:x"}]}', "count"),
    ],
)
def test_sinfo_json_wrong_documents_raise_parse_error_with_snippet(text: str, detail: str) -> None:
    with pytest.raises(SlurmParseError, match=detail) as caught:
        parse_sinfo_json(text)
    assert caught.value.snippet
    assert not caught.value.transient


def test_json_errors_from_slurm_are_quoted() -> None:
    doc = json.dumps({"errors": [{"error": "Unable to contact slurm controller"}]})
    with pytest.raises(SlurmParseError, match="Unable to contact slurm controller"):
        parse_squeue_json(doc)


def test_squeue_and_sacct_json_newer_shapes() -> None:
    squeue = json.dumps(
        {
            "jobs": [
                {
                    "job_id": 7,
                    "name": "gantry-abc",
                    "job_state": ["COMPLETED"],
                    "exit_code": {"status": ["EXITED"], "return_code": {"set": True, "number": 2}},
                    "time_limit": {"set": True, "infinite": True, "number": 0},
                    "submit_time": {"set": True, "number": 1796032113},
                    "nodes": "n[1-2]",
                }
            ]
        }
    )
    (job,) = parse_squeue_json(squeue)
    assert job.job_id == "7" and job.state == "COMPLETED"
    assert job.exit_code == 2
    assert job.time_limit_minutes is None
    assert job.nodes == ("n1", "n2")
    sacct = json.dumps(
        {
            "jobs": [
                {
                    "job_id": 8,
                    "name": "gantry-abc",
                    "state": {"current": ["FAILED"], "reason": "None"},
                    "exit_code": {"status": ["SIGNALED"], "signal": {"id": 9, "signal_id": 9}},
                    "comment": {"job": "gantry-abc"},
                    "time": {"submission": 1796032113, "limit": {"set": True, "number": 10}},
                    "tres": {"allocated": [{"type": "gres", "name": "gpu", "count": 4}]},
                    "nodes": "None assigned",
                }
            ]
        }
    )
    (job,) = parse_sacct_json(sacct)
    assert job.state == "FAILED" and job.signal == 9
    assert job.comment == "gantry-abc"
    assert job.time_limit_minutes == 10
    assert job.gpus == 4
    assert job.nodes == ()


def test_squeue_json_wait_status_decoding() -> None:
    doc = json.dumps({"jobs": [{"job_id": 1, "job_state": "FAILED", "exit_code": 768}]})
    (job,) = parse_squeue_json(doc)
    assert (job.exit_code, job.signal) == (3, None)
    doc = json.dumps({"jobs": [{"job_id": 1, "job_state": "CANCELLED", "exit_code": 9}]})
    (job,) = parse_squeue_json(doc)
    assert (job.exit_code, job.signal) == (0, 9)
    # Exit codes of jobs still running mean nothing: None.
    doc = json.dumps({"jobs": [{"job_id": 1, "job_state": "RUNNING", "exit_code": 0}]})
    assert parse_squeue_json(doc)[0].exit_code is None


def test_node_reason_with_equals_sign_and_spaces_in_oneliner() -> None:
    line = (
        "NodeName=g7 Arch=x86_64 CPUAlloc=0 CPUTot=8 State=IDLE+DRAIN RealMemory=1024 "
        "OS=Linux 6.1 #1 SMP Partitions=a,b Gres=gpu:a100:4(S:0-1) "
        "Reason=swap GPU=3; ticket 42 [ops@2026-01-01T00:00:00]"
    )
    (node,) = parse_scontrol_nodes(line)
    assert node.reason == "swap GPU=3; ticket 42"
    assert node.reason_set_by == "ops"
    assert node.partitions == ("a", "b")
    assert node.operating_system == "Linux 6.1 #1 SMP"
    assert node.gpus[0].sockets == (0, 1)


def test_kv_records_refuse_junk_before_first_record() -> None:
    with pytest.raises(SlurmParseError, match="scontrol show node"):
        parse_scontrol_nodes("garbage garbage\nNodeName=n1 State=IDLE")
    assert parse_kv_records("No nodes in the system\n", "NodeName") == []


def test_topology_without_tree_plugin_is_empty() -> None:
    assert parse_topology("") == []


def test_partition_unlimited_time() -> None:
    (partition,) = parse_partitions(
        "PartitionName=long Default=NO MaxTime=UNLIMITED DefaultTime=1-00:00:00 Nodes=g[01-03] "
        "State=DRAIN TotalCPUs=24 TotalNodes=3 Hidden=YES"
    )
    assert partition.max_time_minutes is None
    assert partition.default_time_minutes == 1440
    assert partition.nodes == ("g01", "g02", "g03")
    assert partition.state == "drain"
    assert partition.hidden


def test_text_lines_with_a_pipe_in_the_job_name() -> None:
    line = "42|weird|name|gantry|batch|RUNNING|None|0:05|5:00|1|n1|N/A|1796032115|1796032113"
    (job,) = parse_squeue_text(line)
    assert job.name == "weird|name"
    assert job.partition == "batch"
    assert job.start_time is not None and job.start_time.year == 2026


def test_sacct_text_skips_steps_and_header() -> None:
    text = (
        "JobID|JobName|User|Account|Partition|State|ExitCode|Elapsed|Submit|Start|End|"
        "NodeList|AllocTRES|ReqTRES|Timelimit\n"
        "5|j|u|a|p|FAILED|2:0|00:00:01|1796032113|1796032114|1796032115|n1|cpu=1|cpu=1|00:10:00\n"
        "5.batch|batch||a||FAILED|2:0|00:00:01|1796032114|1796032114|1796032115|n1|cpu=1||\n"
    )
    (job,) = parse_sacct_text(text)
    assert job.job_id == "5" and job.exit_code == 2 and job.time_limit_minutes == 10


def test_text_line_with_too_few_fields() -> None:
    with pytest.raises(SlurmParseError, match="squeue text line"):
        parse_squeue_text("42|only|three")


@pytest.mark.parametrize(
    ("text", "job_id"),
    [("123\n", "123"), ("123;cluster\n", "123"), ("sbatch: warning: x\n77\n", "77")],
)
def test_sbatch_parsable(text: str, job_id: str) -> None:
    assert parse_sbatch_parsable(text) == job_id


@pytest.mark.parametrize("text", ["", "Submitted batch job 12", "abc"])
def test_sbatch_parsable_refuses_other_output(text: str) -> None:
    with pytest.raises(SlurmParseError, match="sbatch"):
        parse_sbatch_parsable(text)


def test_version_and_config() -> None:
    assert parse_version("slurm 23.11.4\n") == "23.11.4"
    with pytest.raises(SlurmParseError):
        parse_version("command not found")
    assert parse_config("Configuration data as of x\nClusterName = c1\n")["ClusterName"] == "c1"
