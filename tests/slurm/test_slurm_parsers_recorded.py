"""Parsers against real outputs recorded from the dev cluster (one folder per Slurm version)."""

from __future__ import annotations

from datetime import UTC
from typing import Any

import pytest

from slurm.parsers import (
    parse_config,
    parse_partitions,
    parse_sacct_json,
    parse_sacct_text,
    parse_sbatch_parsable,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    parse_sinfo_json,
    parse_sinfo_text,
    parse_squeue_json,
    parse_squeue_text,
    parse_topology,
    parse_version,
)
from slurm.units import Gres


def test_version(recorded: Any) -> None:
    assert parse_version(recorded.text("sinfo_V.txt")) == recorded.version


@pytest.mark.parametrize(
    "name", ["sinfo.json", "scontrol_show_node.txt", "scontrol_show_node_oneliner.txt"]
)
def test_idle_nodes_in_every_form(recorded: Any, name: str) -> None:
    text = recorded.text(name)
    nodes = parse_sinfo_json(text) if name.endswith(".json") else parse_scontrol_nodes(text)
    by_name = {node.name: node for node in nodes}
    assert sorted(by_name) == ["n1", "n2", "n3", "n4"]
    for node in nodes:
        assert node.state == "idle"
        assert node.state_flags == ()
        assert node.cpus_total == 2
        assert node.cpus_alloc == 0
        assert node.memory_mb == 4000
        assert node.memory_alloc_mb == 0
        assert node.address == "127.0.0.1"
        assert node.slurmd_version == recorded.version
        assert node.gpu_count == 2
        assert node.reason is None
        assert node.boot_time is not None and node.boot_time.tzinfo is not None
    assert by_name["n1"].gpus == (Gres("gpu", "a100", 2),)
    assert by_name["n3"].gpus == (Gres("gpu", "h100", 2),)
    assert by_name["n1"].partitions == ("batch",)
    assert by_name["n4"].partitions == ("gpu",)
    assert by_name["n2"].features == ("a100",)
    assert by_name["n2"].port == 17002
    assert by_name["n1"].tres["gres/gpu"] == "2"
    assert sum(node.gpu_count for node in nodes) == 8


def test_idle_nodes_text_sinfo(recorded: Any) -> None:
    nodes = parse_sinfo_text(recorded.text("sinfo_nodes.txt"))
    assert [node.name for node in nodes] == ["n1", "n2", "n3", "n4"]
    assert {node.state for node in nodes} == {"idle"}
    assert nodes[0].partitions == ("batch",)  # "batch*": the default marker is dropped
    assert nodes[2].gpus == (Gres("gpu", "h100", 2),)
    assert nodes[0].memory_mb == 4000
    assert nodes[0].cpus_total == 2


def _check_drained(node: Any) -> None:
    assert node.name == "n2"
    assert node.state == "drained"
    assert "DRAIN" in node.state_flags
    assert node.is_drained
    assert node.reason == "maintenance test"
    assert node.reason_set_by == "root"


def test_drained_node_json(recorded: Any) -> None:
    nodes = {node.name: node for node in parse_sinfo_json(recorded.text("sinfo_drained.json"))}
    _check_drained(nodes["n2"])
    assert nodes["n2"].reason_changed_at is not None
    assert nodes["n1"].state == "idle"
    assert not nodes["n1"].is_drained


@pytest.mark.parametrize(
    "name", ["scontrol_show_node_drained.txt", "scontrol_show_node_drained_oneliner.txt"]
)
def test_drained_node_scontrol(recorded: Any, name: str) -> None:
    (node,) = parse_scontrol_nodes(recorded.text(name))
    _check_drained(node)
    assert node.operating_system is not None and node.operating_system.startswith("Linux")
    assert node.memory_free_mb is not None and node.memory_free_mb > 0


def test_drained_node_sinfo_text(recorded: Any) -> None:
    nodes = {node.name: node for node in parse_sinfo_text(recorded.text("sinfo_nodes_drained.txt"))}
    assert nodes["n2"].state == "drained"
    assert nodes["n2"].reason == "maintenance test"
    assert nodes["n1"].reason is None  # "none"


def test_busy_nodes_json(recorded: Any) -> None:
    nodes = {node.name: node for node in parse_sinfo_json(recorded.text("sinfo_busy.json"))}
    assert {node.state for node in nodes.values()} == {"mixed"}
    assert nodes["n1"].cpus_alloc == 1
    assert nodes["n1"].memory_alloc_mb == 1000
    assert nodes["n1"].gres_used == (Gres("gpu", "a100", 1, (0,), ()),)
    assert nodes["n1"].gpus_used == 1
    assert nodes["n4"].gres_used == (Gres("gpu", "h100", 2, (0, 1), ()),)
    assert nodes["n4"].gpus_used == 2
    assert nodes["n3"].gpus_used == 0


def test_busy_nodes_sinfo_text(recorded: Any) -> None:
    nodes = parse_sinfo_text(recorded.text("sinfo_nodes_busy.txt"))
    assert {node.state for node in nodes} == {"mixed"}
    assert all(node.cpus_alloc == 1 for node in nodes)


def test_topology(recorded: Any) -> None:
    switches = {
        switch.name: switch
        for switch in parse_topology(recorded.text("scontrol_show_topology.txt"))
    }
    assert sorted(switches) == ["leaf1", "leaf2", "spine"]
    assert switches["leaf1"].nodes == ("n1", "n2")
    assert switches["leaf2"].nodes == ("n3", "n4")
    assert switches["leaf1"].level == 0
    assert switches["leaf1"].parent == "spine"
    assert switches["leaf2"].parent == "spine"
    assert switches["spine"].parent is None
    assert switches["spine"].level == 1
    assert switches["spine"].switches == ("leaf1", "leaf2")
    assert switches["spine"].nodes == ("n1", "n2", "n3", "n4")
    assert switches["spine"].link_speed == 1


@pytest.mark.parametrize(
    "name", ["scontrol_show_partition.txt", "scontrol_show_partition_oneliner.txt"]
)
def test_partitions(recorded: Any, name: str) -> None:
    partitions = {p.name: p for p in parse_partitions(recorded.text(name))}
    assert sorted(partitions) == ["batch", "gpu"]
    batch, gpu = partitions["batch"], partitions["gpu"]
    assert batch.default and not gpu.default
    assert batch.nodes == ("n1", "n2") and batch.node_list_expr == "n[1-2]"
    assert gpu.nodes == ("n3", "n4")
    assert batch.max_time_minutes == 60
    assert gpu.max_time_minutes == 120
    assert batch.default_time_minutes is None
    assert batch.state == "up"
    assert batch.total_cpus == 4 and batch.total_nodes == 2
    assert batch.max_nodes is None  # UNLIMITED
    assert batch.tres["gres/gpu:a100"] == "4"


def test_squeue_json(recorded: Any) -> None:
    jobs = {job.name: job for job in parse_squeue_json(recorded.text("squeue.json"))}
    running = jobs["rec-running-2n"]
    assert running.state == "RUNNING"
    assert running.nodes == ("n1", "n2") and running.node_list_expr == "n[1-2]"
    assert running.partition == "batch"
    assert running.user == "gantry"
    assert running.gpus == 2
    assert running.gpus_per_node == 1
    assert running.time_limit_minutes == 5
    assert running.start_time is not None and running.start_time.tzinfo == UTC
    assert running.end_time is None  # still running: Slurm's projected end is dropped
    assert running.exit_code is None
    assert jobs["rec-running-h100"].gpus == 2
    assert jobs["rec-running-h100"].nodes == ("n4",)
    pending = jobs["rec-pending-res"]
    assert pending.state == "PENDING" and pending.reason == "Resources"
    assert pending.nodes == () and pending.start_time is None
    assert jobs["rec-pending-begin"].reason == "BeginTime"
    assert jobs["rec-pending-held"].reason == "JobHeldUser"
    # Jobs that just finished are still in the queue with their final state.
    failed = jobs["rec-failed"]
    assert failed.state == "FAILED" and failed.exit_code == 3 and failed.is_final
    assert jobs["rec-completed"].exit_code == 0
    assert jobs["rec-oom"].state == "OUT_OF_MEMORY"
    assert jobs["rec-too-many-gpus"].state == "FAILED"
    assert jobs["rec-too-many-gpus"].reason == "BadConstraints"


def test_squeue_text(recorded: Any) -> None:
    jobs = {job.name: job for job in parse_squeue_text(recorded.text("squeue.txt"))}
    running = jobs["rec-running-2n"]
    assert running.state == "RUNNING"
    assert running.nodes == ("n1", "n2")
    assert running.time_limit_minutes == 5
    assert running.gpus_per_node == 1
    # Text times without an offset are read as UTC.
    assert running.submit_time is not None and running.submit_time.tzinfo == UTC
    assert jobs["rec-pending-res"].reason == "Resources"
    assert jobs["rec-pending-res"].start_time is None
    assert jobs["rec-running-h100"].gpus_per_node == 2
    assert jobs["rec-timeout"].time_limit_minutes == 1


@pytest.mark.parametrize("name", ["scontrol_show_job.txt", "scontrol_show_job_oneliner.txt"])
def test_scontrol_show_job_running(recorded: Any, name: str) -> None:
    (job,) = parse_scontrol_jobs(recorded.text(name))
    assert job.name == "rec-running-2n"
    assert job.state == "RUNNING"
    assert job.reason is None  # "None"
    assert job.nodes == ("n1", "n2")
    assert job.user == "gantry"
    assert job.partition == "batch"
    assert job.time_limit_minutes == 5
    assert job.gpus == 2 and job.gpus_per_node == 1
    assert job.stdout_path is not None and job.stdout_path.endswith(f"slurm-{job.job_id}.out")


def test_scontrol_show_job_pending(recorded: Any) -> None:
    (job,) = parse_scontrol_jobs(recorded.text("scontrol_show_job_pending.txt"))
    assert job.state == "PENDING" and job.reason == "Resources"
    assert job.nodes == () and job.start_time is None
    assert job.alloc_tres == {}  # TRES= before allocation is the request
    assert job.gpus_per_node == 2


def test_sbatch_outputs(recorded: Any) -> None:
    assert parse_sbatch_parsable(recorded.text("sbatch_parsable.txt")).isdigit()


def test_cluster_config_from_sacctmgr_and_ping_are_text(recorded: Any) -> None:
    text = recorded.text("sacctmgr_show_cluster.txt")
    assert "gantrydev" in text
    config = parse_config("ClusterName             = gantrydev\nTopologyPlugin = topology/tree\n")
    assert config["ClusterName"] == "gantrydev"


def _final_jobs(jobs: list[Any]) -> dict[str, Any]:
    return {job.name: job for job in jobs}


def test_sacct_text_final_states_and_exit_codes(recorded: Any) -> None:
    for name in ("sacct_allocations.txt", "sacct.txt"):
        jobs = _final_jobs(parse_sacct_text(recorded.text(name)))
        assert jobs["rec-completed"].state == "COMPLETED"
        assert jobs["rec-completed"].exit_code == 0
        assert jobs["rec-failed"].state == "FAILED"
        assert jobs["rec-failed"].exit_code == 3
        # The running 2-node job and a pending job were scancel'ed: "CANCELLED by <uid>".
        assert jobs["rec-running-2n"].state == "CANCELLED"
        assert jobs["rec-running-2n"].nodes == ("n1", "n2")
        assert jobs["rec-running-2n"].gpus == 2
        assert jobs["rec-pending-res"].state == "CANCELLED"
        assert jobs["rec-pending-res"].nodes == ()
        assert jobs["rec-pending-res"].start_time is None
        assert jobs["rec-oom"].state == "OUT_OF_MEMORY"
        assert (jobs["rec-oom"].exit_code, jobs["rec-oom"].signal) == (0, 125)
        assert jobs["rec-too-many-gpus"].state == "FAILED"
        assert jobs["rec-too-many-gpus"].time_limit_minutes is None  # Partition_Limit
        assert jobs["rec-timeout"].state == "TIMEOUT"
        assert jobs["rec-timeout"].time_limit_minutes == 1
        assert jobs["rec-2n-completed"].nodes == ("n3", "n4")
        assert all(job.is_final for job in jobs.values())
        assert all(job.end_time is None or job.end_time.tzinfo == UTC for job in jobs.values())


def test_sacct_json_states(recorded: Any) -> None:
    jobs = _final_jobs(parse_sacct_json(recorded.text("sacct.json")))
    assert jobs["rec-completed"].state == "COMPLETED"
    assert jobs["rec-failed"].state == "FAILED"
    assert jobs["rec-running-2n"].state == "CANCELLED"
    assert jobs["rec-running-2n"].gpus == 2
    assert jobs["rec-timeout"].state == "TIMEOUT"
    assert jobs["rec-timeout"].time_limit_minutes == 1
    assert jobs["rec-2n-completed"].nodes == ("n3", "n4")
    assert jobs["rec-oom"].state == "OUT_OF_MEMORY"
    assert jobs["rec-oom"].signal == 125


def test_sacct_json_of_slurm_22_05_misreports_exit_codes(recorded: Any) -> None:
    """Why SlurmClient reads accounting from sacct's text form: 22.05's JSON says the
    job that ran ``exit 3`` succeeded with 0, while the text form says 3:0."""
    if not recorded.version.startswith("22.05"):
        pytest.skip("only documented for Slurm 22.05")
    as_json = _final_jobs(parse_sacct_json(recorded.text("sacct.json")))
    as_text = _final_jobs(parse_sacct_text(recorded.text("sacct_allocations.txt")))
    assert as_text["rec-failed"].exit_code == 3
    assert as_json["rec-failed"].exit_code == 0
