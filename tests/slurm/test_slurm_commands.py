from __future__ import annotations

import shlex
import uuid

import pytest

from slurm import commands

HOSTILE = [
    "a; touch /tmp/CANARY",
    "$(touch /tmp/CANARY)",
    "`touch /tmp/CANARY`",
    'it\'s "quoted"',
    "line\nbreak",
    "x && y || z | w > out < in & bg",
    "*",
    "--help",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_any_argument_survives_the_remote_shell_literally(value: str) -> None:
    """The transport sends shlex.join(argv); a POSIX shell splits it back exactly."""
    argv = ["echo", value, "tail"]
    assert shlex.split(shlex.join(argv)) == argv


def test_drain_reason_is_one_argument() -> None:
    argv = commands.node_update("n2", "drain", "fan failed; $(reboot) `x` 'q'")
    assert argv == [
        "scontrol",
        "update",
        "NodeName=n2",
        "State=DRAIN",
        "Reason=fan failed; $(reboot) `x` 'q'",
    ]
    assert shlex.split(shlex.join(argv))[-1] == argv[-1]


@pytest.mark.parametrize("reason", ["", "   ", "two\nlines", "tab\there", "x" * 2000])
def test_drain_refuses_unusable_reasons(reason: str) -> None:
    with pytest.raises(ValueError, match="reason"):
        commands.node_update("n2", "drain", reason)


def test_node_update_states() -> None:
    assert commands.node_update("n2", "resume") == [
        "scontrol",
        "update",
        "NodeName=n2",
        "State=RESUME",
    ]
    assert commands.node_update("n[1-2]", "undrain")[3] == "State=UNDRAIN"
    with pytest.raises(ValueError, match="needs a reason"):
        commands.node_update("n2", "drain")
    with pytest.raises(ValueError, match="node state"):
        commands.node_update("n2", "down", "x")


@pytest.mark.parametrize("node", ["n1;ls", "n 1", "$(x)", "", "-n1", "n1\n"])
def test_node_names_are_validated(node: str) -> None:
    with pytest.raises(ValueError, match="node"):
        commands.node_update(node, "resume")


@pytest.mark.parametrize("job_id", ["1", "123", "123_4", 77])
def test_job_ids_accepted(job_id: str | int) -> None:
    assert commands.scancel(job_id) == ["scancel", str(job_id)]


@pytest.mark.parametrize("job_id", ["", "12a", "1;ls", "-1", "1 2", "123_", "99999999999"])
def test_job_ids_refused(job_id: str) -> None:
    with pytest.raises(ValueError, match="job id"):
        commands.scancel(job_id)


def test_job_tag() -> None:
    job_uuid = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert commands.job_tag(job_uuid) == "gantry-12345678123456781234567812345678"
    assert commands.job_tag(str(job_uuid)) == commands.job_tag(job_uuid)
    with pytest.raises(ValueError):
        commands.job_tag("not-a-uuid")


def test_sbatch_parsable_argv() -> None:
    tag = commands.job_tag(uuid.uuid4())
    argv = commands.sbatch_parsable(
        "/work/runs/x/job.sbatch",
        tag=tag,
        partition="gpu",
        nodes=2,
        ntasks_per_node=1,
        gpus_per_node="h100:2",
        memory_mb=2000,
        time_limit_minutes=30,
        nodelist=["n3", "n4"],
        switches=1,
        switches_wait_minutes=5,
        chdir="/work/runs/x",
        output="/work/runs/x/slurm-%j.out",
        extra_options=["--exclusive"],
    )
    assert argv[:4] == ["sbatch", "--parsable", f"--job-name={tag}", f"--comment={tag}"]
    assert "--partition=gpu" in argv
    assert "--nodes=2" in argv
    assert "--gpus-per-node=h100:2" in argv
    assert "--mem=2000M" in argv
    assert "--time=30" in argv
    assert "--nodelist=n3,n4" in argv
    assert "--switches=1@5" in argv
    assert "--output=/work/runs/x/slurm-%j.out" in argv
    assert argv[-2] == "--exclusive"
    assert argv[-1] == "/work/runs/x/job.sbatch"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tag": "has space"}, "tag"),
        ({"tag": "t", "partition": "gpu;ls"}, "partition"),
        ({"tag": "t", "nodes": 0}, "positive"),
        ({"tag": "t", "nodes": True}, "positive"),
        ({"tag": "t", "gpus_per_node": "2;x"}, "gpus-per-node"),
        ({"tag": "t", "nodelist": ["n1", "n2;x"]}, "node name"),
        ({"tag": "t", "extra_options": ["-x"]}, "--name"),
        ({"tag": "t", "extra_options": ["--job-name=other"]}, "cannot be passed"),
        ({"tag": "t", "extra_options": ["--wrap=rm -rf /"]}, "cannot be passed"),
    ],
)
def test_sbatch_parsable_validation(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        commands.sbatch_parsable("/abs/job.sbatch", **kwargs)  # type: ignore[arg-type]


def test_sbatch_needs_an_absolute_script_path() -> None:
    with pytest.raises(ValueError, match="absolute"):
        commands.sbatch_parsable("job.sbatch", tag="t")


def test_read_only_builders() -> None:
    assert commands.sinfo_json() == ["sinfo", "--json"]
    assert commands.version() == ["sinfo", "-V"]
    assert commands.scontrol_show_topology() == ["scontrol", "show", "topology"]
    assert commands.scontrol_show_partitions() == ["scontrol", "--oneliner", "show", "partition"]
    assert commands.scontrol_show_nodes("n1")[-1] == "n1"
    assert commands.squeue_text(["1", "2"])[:2] == ["env", "SLURM_TIME_FORMAT=%s"]
    assert "--jobs=1,2" in commands.squeue_text(["1", "2"])
    assert "--name=gantry-x" in commands.sacct_text(name="gantry-x")
    with pytest.raises(ValueError, match="at least one"):
        commands.sacct_text([])
    with pytest.raises(ValueError, match="job id"):
        commands.sacct_json(["1", "2;x"])
