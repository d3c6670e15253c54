"""What the submit path makes of each way a submission can fail, driven through the real
lifecycle (``JOBS.submit_exactly_once``) with stand-ins only where no real part can fail on
demand: a name server that does not answer, a CA key whose read fails with EIO, an sbatch
that exits 0 with an answer nobody can read.

Transient (retried with back-off, the job not failed): a DNS EAI_AGAIN, an I/O error
reading the user CA. Permanent (the job fails with the reason): no such host name, a
missing CA. Unknown (``submit_unknown``, never a second sbatch before the tag is resolved):
sbatch exit 0 with an unreadable or empty answer."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import paramiko
import pytest
from django.utils import timezone

from factories import ClusterFactory, JobFactory
from jobs.lifecycle import JOBS
from jobs.models import Job, JobEvent
from jobs.tasks import job_submit_task
from nodes.access.cluster import user_ca_key_path
from nodes.models import Cluster
from slurm import commands as slurm_commands
from slurm.client import SlurmClient, TagLookup
from slurm.errors import TRANSIENT_ERRORS, SshAuthenticationError, command_error
from slurm.parsers import SlurmJob
from slurm.transport import close_all

pytestmark = pytest.mark.django_db

SCRIPT = "/srv/gantry/users/alice/runs/x/job.sbatch"


@dataclass
class TagClient:
    """The service account's tag lookup: finds what ``found`` holds, counts lookups."""

    found: list[SlurmJob] = field(default_factory=list)
    lookups: int = 0
    cancelled: list[str] = field(default_factory=list)

    def find_jobs_by_tag(self, tag: str, *, since: Any = None) -> list[SlurmJob]:
        self.lookups += 1
        return list(self.found)

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)


@dataclass
class Result:
    argv: list[str]
    rc: int
    stdout: str
    stderr: str = ""


@dataclass
class SbatchTransport:
    """The job's account: answers sbatch with ``answer`` (exit 0), records every sbatch."""

    answer: str = "4242\n"
    refuse_login: bool = False
    sbatches: list[list[str]] = field(default_factory=list)

    def connect(self) -> None:
        pass

    def exec(self, argv: Any, *, stdin: Any = None, timeout: Any = None, check: bool = True) -> Any:
        argv = list(argv)
        assert argv[0] == "sbatch", argv
        if self.refuse_login:
            # Reconnecting to send it: the login node no longer takes the account's key.
            raise SshAuthenticationError("127.0.0.1 refused key authentication for 'alice'")
        self.sbatches.append(argv)
        result = Result(argv, 0, self.answer)
        if check and result.rc != 0:
            raise command_error(argv, result.rc, result.stdout, result.stderr)
        return result


@pytest.fixture
def cluster(settings: Any, tmp_path: Path) -> Iterator[Cluster]:
    settings.SSH_DIR = tmp_path / "ssh"
    cluster = ClusterFactory(ssh_host="login.example.org", host_key_line="")
    from nodes.access.identities import cluster_user_ca_ensure

    cluster_user_ca_ensure(actor=None, cluster=cluster)
    yield cluster
    close_all()


@pytest.fixture
def tag_client(monkeypatch: pytest.MonkeyPatch) -> TagClient:
    client = TagClient()
    monkeypatch.setattr("runs.lifecycle.submit.slurm_client_for", lambda cluster: client)
    monkeypatch.setattr(JOBS, "prepare", lambda obj, transport: SCRIPT)
    return client


def _queued(cluster: Cluster) -> Job:
    return JobFactory(cluster=cluster, run_as="alice", state=Job.State.QUEUED)


def _connect_raises(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> list[str]:
    """paramiko's connect fails with ``error`` (what getaddrinfo raises in it); returns the
    hosts it was asked for."""
    asked: list[str] = []

    def connect(self: Any, hostname: str, *args: Any, **kwargs: Any) -> None:
        asked.append(hostname)
        raise error

    monkeypatch.setattr(paramiko.SSHClient, "connect", connect)
    return asked


def _ca_read_fails(monkeypatch: pytest.MonkeyPatch, path: Path, code: int) -> None:
    original = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if self == path:
            raise OSError(code, f"{errno.errorcode[code]} (stand-in)", str(self))
        return original(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)


def _assert_retried_not_failed(job: Job) -> None:
    """The state a transient error leaves: still being submitted, the claim given back so
    the task's retry claims it again at once, no sbatch marked sent, nothing failed."""
    job.refresh_from_db()
    assert job.state == Job.State.SUBMITTING
    assert job.submit_lease_until is None and job.sbatch_sent_at is None
    assert not JobEvent.objects.filter(job=job, to_state=Job.State.FAILED).exists()


# ---------------------------------------------------------------- transient: retried


def test_a_name_server_that_does_not_answer_is_retried_not_a_failed_job(
    cluster: Cluster, tag_client: TagClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = _connect_raises(
        monkeypatch, socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    )
    job = _queued(cluster)
    with pytest.raises(TRANSIENT_ERRORS) as raised:
        JOBS.submit_exactly_once(str(job.id))
    assert asked == ["login.example.org"] and "name server did not answer" in str(raised.value)
    _assert_retried_not_failed(job)
    # The retry claims it again (and here fails the same way, still not failing the job).
    with pytest.raises(TRANSIENT_ERRORS):
        JOBS.submit_exactly_once(str(job.id))
    assert len(asked) == 2
    _assert_retried_not_failed(job)


def test_when_the_retries_run_out_on_dns_the_job_waits_queued(
    cluster: Cluster, tag_client: TagClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = _connect_raises(
        monkeypatch, socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    )
    job = _queued(cluster)
    # The real task, run eagerly: autoretry re-runs it at once until max_retries.
    outcome = job_submit_task.apply(args=[str(job.id)]).get()
    assert outcome == "gave up for now: cluster unreachable"
    assert len(asked) == job_submit_task.max_retries + 1
    job.refresh_from_db()
    assert job.state == Job.State.QUEUED and job.sbatch_sent_at is None
    assert job.state_reason.startswith("waiting for the cluster")


def test_an_io_error_reading_the_user_ca_is_retried_not_a_failed_job(
    cluster: Cluster, tag_client: TagClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = _connect_raises(monkeypatch, AssertionError("never reached: signing failed first"))
    _ca_read_fails(monkeypatch, user_ca_key_path(cluster), errno.EIO)
    job = _queued(cluster)
    with pytest.raises(TRANSIENT_ERRORS) as raised:
        JOBS.submit_exactly_once(str(job.id))
    assert "cannot read the user CA key" in str(raised.value) and asked == []
    _assert_retried_not_failed(job)


def test_too_many_open_files_while_signing_is_retried(
    cluster: Cluster, tag_client: TagClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    _connect_raises(monkeypatch, AssertionError("never reached"))
    _ca_read_fails(monkeypatch, user_ca_key_path(cluster), errno.EMFILE)
    job = _queued(cluster)
    with pytest.raises(TRANSIENT_ERRORS):
        JOBS.submit_exactly_once(str(job.id))
    _assert_retried_not_failed(job)


# ---------------------------------------------------------------- permanent: failed, saying why


def test_a_host_name_that_does_not_exist_fails_the_job_with_the_reason(
    cluster: Cluster, tag_client: TagClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    _connect_raises(monkeypatch, socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
    job = _queued(cluster)
    outcome = JOBS.submit_exactly_once(str(job.id))
    job.refresh_from_db()
    assert outcome.startswith("not submitted") and job.state == Job.State.FAILED
    assert "cannot resolve host 'login.example.org'" in job.state_reason
    assert "as alice" in job.state_reason


def test_a_missing_ca_fails_the_job_with_the_fix(
    cluster: Cluster, tag_client: TagClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    _connect_raises(monkeypatch, AssertionError("never reached"))
    user_ca_key_path(cluster).unlink()
    job = _queued(cluster)
    JOBS.submit_exactly_once(str(job.id))
    job.refresh_from_db()
    assert job.state == Job.State.FAILED and "Create the user CA" in job.state_reason


def test_a_login_refused_while_reconnecting_to_send_sbatch_fails_the_job(
    cluster: Cluster, tag_client: TagClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    transport = SbatchTransport(refuse_login=True)
    _use_transport(monkeypatch, transport)
    job = _queued(cluster)
    outcome = JOBS.submit_exactly_once(str(job.id))
    job.refresh_from_db()
    assert outcome.startswith("not submitted") and job.state == Job.State.FAILED
    assert "refused key authentication" in job.state_reason
    # Nothing was sent: no sbatch is marked as possibly out there.
    assert job.sbatch_sent_at is None and transport.sbatches == []


# ---------------------------------------------------------------- unknown: sbatch exit 0, no id


def _use_transport(monkeypatch: pytest.MonkeyPatch, transport: SbatchTransport) -> None:
    client = SlurmClient(transport)
    monkeypatch.setattr(JOBS, "transport_of", lambda obj: transport)
    monkeypatch.setattr(JOBS, "client_of", lambda obj: client)


@pytest.mark.parametrize("answer", ["garbage\n", "", "sbatch: warning: odd\n"])
def test_sbatch_exit_0_without_a_job_id_is_unknown_and_never_sent_twice(
    cluster: Cluster, tag_client: TagClient, monkeypatch: pytest.MonkeyPatch, answer: str
) -> None:
    transport = SbatchTransport(answer=answer)
    _use_transport(monkeypatch, transport)
    job = _queued(cluster)
    outcome = JOBS.submit_exactly_once(str(job.id))
    job.refresh_from_db()
    assert outcome == "sbatch outcome unknown; the watcher will find the job by its tag"
    assert job.state == Job.State.SUBMIT_UNKNOWN and job.sbatch_sent_at is not None
    assert len(transport.sbatches) == 1
    assert "no readable answer" in JobEvent.objects.filter(job=job).last().message
    # A redelivered task, and the watcher's requeue of stalled submissions, send nothing.
    assert JOBS.submit_exactly_once(str(job.id)).startswith("not claimable")
    assert JOBS.requeue_stalled(cluster, timezone.now() + timedelta(days=1)) == 0
    assert len(transport.sbatches) == 1
    # The watcher finds the tag: the Slurm job sbatch did queue is adopted, not sent again.
    tag = slurm_commands.job_tag(job.id)
    lookup = TagLookup(found={tag: [SlurmJob(job_id="4242", state="PENDING")]})
    job = Job.objects.select_related("cluster").get(id=job.id)
    JOBS.resolve_by_tag([job], lookup, {}, tag_client, timezone.now())  # type: ignore[arg-type]
    job.refresh_from_db()
    assert (job.state, job.slurm_job_id) == (Job.State.PENDING, "4242")
    assert len(transport.sbatches) == 1 and tag_client.cancelled == []


def test_a_readable_sbatch_answer_still_submits_once(
    cluster: Cluster, tag_client: TagClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    transport = SbatchTransport(answer="sbatch: warning: odd\n4242;gantrydev\n")
    _use_transport(monkeypatch, transport)
    job = _queued(cluster)
    assert JOBS.submit_exactly_once(str(job.id)) == "submitted as Slurm job 4242"
    job.refresh_from_db()
    assert (job.state, job.slurm_job_id, len(transport.sbatches)) == ("pending", "4242", 1)


# ---------------------------------------------------------------- permanent, before any sbatch


def test_run_files_gantry_may_not_write_fail_the_job_instead_of_looping(
    cluster: Cluster, tag_client: TagClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm.errors import SftpError

    def prepare(obj: Job, transport: Any) -> str:
        raise SftpError("write /srv/gantry/users/alice/runs/x/job.sbatch: permission denied")

    transport = SbatchTransport()
    _use_transport(monkeypatch, transport)
    monkeypatch.setattr(JOBS, "prepare", prepare)
    job = _queued(cluster)
    outcome = JOBS.submit_exactly_once(str(job.id))
    job.refresh_from_db()
    # Before: the error left the job submitting under its lease, retried the same way
    # whenever the lease ran out, forever, with no word of why.
    assert outcome.startswith("not submitted") and job.state == Job.State.FAILED
    assert "permission denied" in job.state_reason and transport.sbatches == []


def test_a_changed_host_key_holds_the_job_queued_with_the_reason(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm.errors import HostKeyMismatch

    class Intercepted:
        def find_jobs_by_tag(self, tag: str, *, since: Any = None) -> list[SlurmJob]:
            raise HostKeyMismatch(
                "host key of gantry@login.example.org:22 CHANGED",
                host="login.example.org",
                port=22,
                key_type="ssh-ed25519",
                fingerprint_seen="SHA256:seen",
                fingerprint_expected="SHA256:pinned",
            )

    monkeypatch.setattr("runs.lifecycle.submit.slurm_client_for", lambda cluster: Intercepted())
    job = _queued(cluster)
    JOBS.submit_exactly_once(str(job.id))
    job.refresh_from_db()
    # The cluster's key, not the job: it waits, saying why, until an operator re-pins it
    # (every job of the cluster would otherwise fail alike).
    assert job.state == Job.State.QUEUED and "Host key refused" in job.state_reason
    assert job.sbatch_sent_at is None


# ---------------------------------------------------------------- cancel


@pytest.mark.parametrize("code", [socket.EAI_AGAIN, socket.EAI_NONAME])
def test_a_cancel_during_a_dns_outage_says_try_again_not_broken(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    from runs.lifecycle.requests import slurm_request_carry_out
    from runs.models import SlurmRequest

    asked = _connect_raises(monkeypatch, socket.gaierror(code, "stand-in resolver answer"))
    job = JobFactory(cluster=cluster, run_as="alice", state=Job.State.RUNNING, slurm_job_id="70")
    audited: list[Job] = []
    # The person's cancel is recorded without any lookup or connection (a worker sends it).
    assert JOBS.cancel_request(job, by="rita", audit=audited.append) == "cancel requested"
    assert asked == [] and audited == [job]
    request = SlurmRequest.objects.get()
    if code == socket.EAI_AGAIN:
        # A name server that does not answer now: raised for the task to retry; still open.
        with pytest.raises(TRANSIENT_ERRORS):
            slurm_request_carry_out(request_id=request.id)
        request.refresh_from_db()
        assert request.status == "open" and "cannot resolve host" in request.outcome
    else:
        # No such host: the request fails, saying why, on the job's own timeline.
        outcome = slurm_request_carry_out(request_id=request.id)
        assert outcome.startswith("could not cancel: ") and "cannot resolve host" in outcome
        event = JobEvent.objects.get(job=job, message__startswith="could not cancel: ")
        assert "cannot resolve host" in event.message
    assert asked
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING
