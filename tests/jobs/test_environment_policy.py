"""The job environment is an allow-list (``nodes.environment``): every name that could load
code into a job is refused with a 400 naming it, through every submit path, again when the
batch script is rendered at submit-task time, and an operator's additions for one cluster
never reach the hard-deny set."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from rest_framework.test import APIClient

from core.errors import FieldError
from factories import ClusterFactory, GpuFactory, JobFactory, NodeFactory, PartitionFactory
from jobs.lifecycle import JOBS
from jobs.models import Job, JobTemplate
from jobs.validation import validate_environment
from nodes.environment import DEFAULT_ALLOWED, environment_name_refused, hard_denied
from nodes.models import Cluster, extra_allowed_environment_validator
from nodes.services import cluster_update

pytestmark = pytest.mark.django_db

# Each loads code (a library, a shell start-up file, a Python hook, a plugin) or chooses
# what runs; every one passed the old block list but the last few.
CODE_LOADING = (
    "BASH_ENV",
    "ENV",
    "BASH_FUNC_srun%%",
    "SHELLOPTS",
    "PS4",
    "PROMPT_COMMAND",
    "IFS",
    "PYTHONUSERBASE",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONINSPECT",
    "PYTHONWARNINGS",
    "PYTHONSAFEPATH",
    "PYTHONPLATLIBDIR",
    "LD_AUDIT",
    "LD_BIND_NOW",
    "GCONV_PATH",
    "GLIBC_TUNABLES",
    "NCCL_NET_PLUGIN",
    "NCCL_TUNER_PLUGIN",
    "NCCL_PROFILER_PLUGIN",
    "NCCL_ENV_PLUGIN",
    "NCCL_CONF_FILE",
    "CUDA_INJECTION64_PATH",
    "TORCH_EXTENSIONS_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
    "HF_HOME",
    "HF_MODULES_CACHE",
    "PERL5OPT",
    "PERL5LIB",
    "RUBYOPT",
    "NODE_OPTIONS",
    "JAVA_TOOL_OPTIONS",
    "OPENSSL_CONF",
    "GIT_SSH_COMMAND",
    "EDITOR",
    "PYTHONPATH",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "PATH",
    "SLURM_EXPORT_ENV",
    "MASTER_ADDR",
)
ALLOWED = {
    "OMP_NUM_THREADS": "4",
    "NCCL_DEBUG": "INFO",
    "NCCL_DEBUG_SUBSYS": "INIT,NET",
    "NCCL_IB_HCA": "mlx5_0",
    "NCCL_SOCKET_IFNAME": "eth0",
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "CUDA_LAUNCH_BLOCKING": "1",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_MODE": "offline",
    "HF_HUB_OFFLINE": "1",
    "GANTRY_USER_RUN_TAG": "sweep 3",
}


@pytest.fixture
def cluster() -> Any:
    cluster = ClusterFactory(name="devcluster", is_default=True, default_partition="batch")
    PartitionFactory(cluster=cluster, name="batch", max_time_minutes=60, is_default=True)
    for name in ("n1", "n2"):
        node = NodeFactory(cluster=cluster, name=name, partitions=["batch"], cpus_total=2)
        GpuFactory(node=node, index=0, gpu_type="a100")
    return cluster


def submit(api: APIClient, environment: dict[str, str]) -> Any:
    body = {
        "name": "env",
        "partition": "batch",
        "nodes": 1,
        "gpus_per_node": 1,
        "tasks_per_node": 1,
        "time_limit_minutes": 10,
        "config": {"preset": "tiny", "steps": 20},
        "environment": environment,
    }
    return api.post("/api/v1/jobs/submit/", body, format="json")


@pytest.mark.parametrize("name", CODE_LOADING)
def test_each_code_loading_name_is_refused_naming_it(
    cluster: Any, researcher_api: APIClient, name: str
) -> None:
    response = submit(researcher_api, {"OMP_NUM_THREADS": "2", name: "/home/alice/evil"})
    assert response.status_code == 400, response.json()
    why = response.json()["extra"]["fields"]["environment"][0]
    assert why.startswith(name if "%" not in name else repr(name)), why
    assert not Job.objects.exists()


def test_the_allowed_names_pass_and_reach_the_job(cluster: Any, researcher_api: APIClient) -> None:
    response = submit(researcher_api, ALLOWED)
    assert response.status_code == 202, response.json()
    assert Job.objects.get().environment == ALLOWED


@pytest.mark.parametrize("name", ["FOO", "MY_SETTING", "NCCL_NET", "GANTRY_SECRET", "TMPDIR"])
def test_a_name_on_no_list_is_refused_saying_an_operator_may_allow_it(
    cluster: Any, researcher_api: APIClient, name: str
) -> None:
    response = submit(researcher_api, {name: "1"})
    assert response.status_code == 400
    why = response.json()["extra"]["fields"]["environment"][0]
    assert why.startswith(f"{name} is not on the list") and "operator may allow" in why


def test_no_default_name_is_hard_denied() -> None:
    """The two lists agree: nothing on the default list is a name that loads code."""
    assert [name for name in DEFAULT_ALLOWED if hard_denied(name)] == []
    assert all(environment_name_refused(name) is None for name in DEFAULT_ALLOWED)


def test_an_operator_extends_the_list_for_one_cluster(
    cluster: Any, researcher_api: APIClient, operator: Any
) -> None:
    assert submit(researcher_api, {"MYLAB_SHARD": "3"}).status_code == 400
    cluster_update(
        actor=operator, cluster=cluster, extra_allowed_environment=["MYLAB_*", "NCCL_*", "FOO"]
    )
    extended = {"MYLAB_SHARD": "3", "FOO": "bar", "NCCL_NET": "Socket"}
    response = submit(researcher_api, extended)
    assert response.status_code == 202, response.json()
    assert Job.objects.get().environment == extended
    # A pattern never reaches the hard-deny set: NCCL_* does not allow NCCL's plugins.
    for name in ("NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_CONF_FILE"):
        refused = submit(researcher_api, {name: "libevil.so"})
        assert refused.status_code == 400
        assert "never allowed" in refused.json()["extra"]["fields"]["environment"][0]
    # Another cluster keeps the defaults.
    with pytest.raises(FieldError, match="FOO is not on the list"):
        validate_environment({"FOO": "bar"}, cluster=ClusterFactory())


@pytest.mark.parametrize(
    "entries",
    [
        ["LD_PRELOAD"],
        ["LD_*"],
        ["PYTHON*"],
        ["PYTHONUSERBASE"],
        ["BASH_ENV"],
        ["ENV"],
        ["NCCL_NET_PLUGIN"],
        ["CUDA_INJECTION64_PATH"],
        ["lower_case"],
        ["*"],
        ["A B"],
        "NCCL_*",
    ],
)
def test_an_operator_cannot_allow_a_hard_denied_name(
    cluster: Any, operator: Any, entries: Any
) -> None:
    with pytest.raises(FieldError) as refused:
        cluster_update(actor=operator, cluster=cluster, extra_allowed_environment=entries)
    assert refused.value.field == "extra_allowed_environment"
    cluster.refresh_from_db()
    assert cluster.extra_allowed_environment == []
    # The admin's form runs the same validator.
    with pytest.raises(ValidationError):
        extra_allowed_environment_validator(entries)


def test_a_hard_denied_entry_stored_anyway_allows_nothing(
    cluster: Any, researcher_api: APIClient
) -> None:
    """Written around the validator (a raw update): the check at use still refuses."""
    Cluster.objects.filter(pk=cluster.pk).update(
        extra_allowed_environment=["BASH_ENV", "LD_*", "PYTHON*", 7, None]
    )
    for name in ("BASH_ENV", "LD_AUDIT", "PYTHONSTARTUP"):
        response = submit(researcher_api, {name: "/tmp/x"})
        assert response.status_code == 400, name
        assert "never allowed" in response.json()["extra"]["fields"]["environment"][0]


# ---------------------------------------------------------------- saved before the policy


def test_a_template_saved_before_the_policy_is_refused_at_submit(
    cluster: Any, researcher: Any, researcher_api: APIClient
) -> None:
    template = JobTemplate.objects.create(
        owner=researcher,
        name="old",
        cluster=cluster,
        settings={
            "name": "old",
            "partition": "batch",
            "config": {"preset": "tiny"},
            "environment": {"BASH_ENV": "/home/rita/.evil"},
        },
    )
    response = researcher_api.post(f"/api/v1/job-templates/{template.pk}/submit/", {})
    assert response.status_code == 400
    assert response.json()["extra"]["fields"]["environment"][0].startswith("BASH_ENV ")
    assert not Job.objects.exists()


@dataclass
class RecordingTransport:
    """Every file written and command run, as the job's account or the service account."""

    written: list[str] = field(default_factory=list)
    commands: list[list[str]] = field(default_factory=list)

    def connect(self) -> None:
        pass

    def makedirs(self, path: str, mode: int = 0o755) -> None:
        self.written.append(path)

    def put_bytes(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self.written.append(path)

    def exists(self, path: str) -> bool:
        return True

    def exec(self, argv: Any, **kwargs: Any) -> Any:
        self.commands.append(list(argv))
        raise AssertionError(f"nothing may run on the cluster: {argv}")


@dataclass
class NoTags:
    def find_jobs_by_tag(self, tag: str, *, since: Any = None) -> list[Any]:
        return []


def test_a_job_queued_before_the_policy_is_refused_when_its_script_is_rendered(
    cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The submit task renders the script again, with the policy as it stands: a job that
    sneaked past (queued before it, or its cluster's operator took a name back) fails
    with the reason, and nothing is written or sent."""
    own, shared = RecordingTransport(), RecordingTransport()
    monkeypatch.setattr("runs.lifecycle.submit.slurm_client_for", lambda cluster: NoTags())
    monkeypatch.setattr(JOBS, "transport_of", lambda obj: own)
    monkeypatch.setattr(JOBS, "client_of", lambda obj: own)
    monkeypatch.setattr("jobs.lifecycle.transport_for", lambda cluster: shared)
    monkeypatch.setattr("jobs.lifecycle.archive_current", lambda: "0" * 64)
    monkeypatch.setattr("jobs.lifecycle.trainer_ensure_uploaded", lambda t, w: "/srv/trainer")
    job = JobFactory(
        cluster=cluster,
        state=Job.State.QUEUED,
        environment={"NCCL_DEBUG": "INFO", "PYTHONUSERBASE": "/home/alice/.hook"},
    )
    outcome = JOBS.submit_exactly_once(str(job.id))
    job.refresh_from_db()
    assert outcome.startswith("not submitted"), outcome
    assert job.state == Job.State.FAILED and job.sbatch_sent_at is None
    assert "PYTHONUSERBASE is never allowed" in job.state_reason
    assert own.written == [] and own.commands == []


def test_the_job_page_of_such_a_job_says_why_instead_of_a_script(
    cluster: Any, researcher: Any
) -> None:
    from jobs.script import job_script

    job = JobFactory(cluster=cluster, owner=researcher, environment={"LD_AUDIT": "/x.so"})
    script = job_script(job)
    assert script.startswith("# Gantry will not submit this job:") and "LD_AUDIT" in script
