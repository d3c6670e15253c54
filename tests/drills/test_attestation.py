"""Who attests a restore drill (``drills.attestation``), red-teamed by the owner being
judged: a researcher whose checkpoint failed writes a perfect passing ``drill.json`` where
their drill writes. Without a verifier that is all a self-attested pass, which proves
nothing and lifts no block; with one, the drill runs as the verifier, writes where the
owner cannot, and only its own report counts.

The login node is a stand-in (``FakeLoginNode``) that keeps who owns what and who was
granted read access, as the real one does; the dev cluster runs the same path for real
(``tests/integration/test_drills.py``).
"""

from __future__ import annotations

import importlib
import json
import types
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.apps import apps as django_apps
from django.core.exceptions import ValidationError
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from core.errors import FieldError
from drills import attestation, lifecycle, services
from drills.attestation import directories_down_to, drill_verifier
from drills.lifecycle import DRILLS
from drills.models import DrillPolicy, RestoreDrill
from drills.policies import _policy_candidates
from drills.selectors import checkpoint_proofs, drill_fleet_health
from drills.verdicts import verdict_of_report
from factories import (
    CheckpointFactory,
    ClusterFactory,
    GpuFactory,
    JobFactory,
    NodeFactory,
    PartitionFactory,
)
from jobs.models import Checkpoint, Job, MetricPoint, StateFingerprint
from jobs.services import job_resume
from nodes.access.identities import check_account
from nodes.models import Cluster, ClusterIdentity
from runs import lifecycle as runs_lifecycle
from slurm.errors import RemoteFileNotFound, SftpError
from slurm.parsers.models import SlurmJob
from slurm.sftp import StatResult
from slurm.transport import ExecResult
from trainer.schema import DRILL_SCHEMA, Reason

pytestmark = pytest.mark.django_db

WORKDIR = "/srv/gantry"
VERIFIER = "gantry-verify"
STEP = 200


# ---------------------------------------------------------------- a login node


@dataclass
class FakeLoginNode:
    """Who owns what under the work directory, and what setfacl granted: an account writes
    only inside its own area (``<workdir>/users/<account>``), reads its own files and those
    it was granted; the service account owns the rest."""

    files: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    dirs: dict[str, str] = field(default_factory=dict)
    granted: dict[str, set[str]] = field(default_factory=dict)
    commands: list[tuple[str, list[str]]] = field(default_factory=list)

    def owner_of(self, path: str) -> str:
        parts = path[len(WORKDIR) + 1 :].split("/") if path.startswith(WORKDIR + "/") else []
        return parts[1] if len(parts) > 1 and parts[0] == "users" else "gantry"

    def as_(self, account: str) -> FakeTransport:
        return FakeTransport(self, account or "gantry")

    def write(self, account: str, path: str, data: bytes) -> None:
        if self.owner_of(path) != account:
            raise SftpError(f"write: permission denied on {path} (as {account})")
        self.files[path] = (account, data)

    def can_read(self, account: str, path: str) -> bool:
        owner = self.owner_of(path)
        return owner == account or any(
            path == root or path.startswith(root + "/")
            for root, accounts in self.granted.items()
            if account in accounts
        )


@dataclass
class FakeTransport:
    node: FakeLoginNode
    account: str

    @property
    def config(self) -> Any:
        return types.SimpleNamespace(user=self.account, host="login")

    def exec(self, argv: list[str], *, check: bool = True, timeout: float | None = None) -> Any:
        self.node.commands.append((self.account, list(argv)))
        if argv[0] == "setfacl":
            paths = argv[argv.index("--") + 1 :]
            if any(self.node.owner_of(path) != self.account for path in paths):
                return ExecResult(argv=argv, rc=1, stdout="", stderr="Operation not permitted")
            entry = argv[argv.index("-m") + 1]
            for path in paths:
                self.node.granted.setdefault(path, set()).add(entry.split(":")[1])
            return ExecResult(argv=argv, rc=0, stdout="", stderr="")
        raise AssertionError(f"unexpected command {argv}")

    def exists(self, path: str) -> bool:
        if not self.node.can_read(self.account, path):
            raise SftpError(f"stat: permission denied on {path} (as {self.account})")
        return path in self.node.files or path in self.node.dirs

    def lstat(self, path: str) -> StatResult | None:
        if path in self.node.dirs:
            return StatResult(path=path, size=0, mtime=0, mode=0o040700)
        return None

    def makedirs(self, path: str, mode: int = 0o755) -> None:
        owner = self.node.owner_of(path)
        if owner != self.account and not path.endswith("/users"):
            raise SftpError(f"mkdir: permission denied on {path} (as {self.account})")
        self.node.dirs.setdefault(path, self.account)

    def chmod(self, path: str, mode: int) -> None:
        if self.node.dirs.get(path) != self.account:
            raise SftpError(f"chmod: permission denied on {path} (as {self.account})")

    def put_bytes(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self.node.write(self.account, path, data)

    def read_bounded(self, path: str, max_bytes: int) -> bytes:
        if path not in self.node.files:
            raise RemoteFileNotFound(f"read: {path} does not exist", path=path)
        if not self.node.can_read(self.account, path):
            raise SftpError(f"read: permission denied on {path} (as {self.account})")
        return self.node.files[path][1]


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> FakeLoginNode:
    """Every login Gantry makes, as the service account, the owner or the verifier."""
    login = FakeLoginNode()

    def as_account(cluster: Cluster, account: str = "") -> FakeTransport:
        return login.as_(account)

    for module in (runs_lifecycle.kind, lifecycle, attestation):
        monkeypatch.setattr(module, "transport_as", as_account)
    for module in (lifecycle, attestation, services):
        monkeypatch.setattr(module, "transport_for", lambda cluster: login.as_("gantry"))
    monkeypatch.setattr(
        lifecycle, "trainer_version_ensure", lambda t, w, d: f"{WORKDIR}/trainer/{d[:20]}"
    )
    return login


# ---------------------------------------------------------------- a drillable checkpoint


@pytest.fixture
def cluster() -> Cluster:
    cluster = ClusterFactory(name="verified", workdir=WORKDIR, is_default=True)
    PartitionFactory(cluster=cluster, name="batch", max_time_minutes=60, is_default=True)
    for index in range(2):
        GpuFactory(node=NodeFactory(cluster=cluster, name=f"n{index}"), index=0)
    return cluster


@pytest.fixture
def failed_checkpoint(cluster: Cluster, researcher: Any, node: FakeLoginNode) -> Checkpoint:
    """Alice's checkpoint at step 200, which failed its integrity check: resuming from it
    is blocked. Its files are on the login node, alice's alone."""
    job = JobFactory(
        owner=researcher,
        cluster=cluster,
        run_as="alice",
        state=Job.State.COMPLETED,
        last_step=STEP + 10,
        trainer_digest="a" * 64,
        environment={"GANTRY_USER_OWNER_SET": "mine"},
        config={"preset": "tiny", "steps": STEP + 10, "checkpoint_every": 100},
    )
    StateFingerprint.objects.create(
        job=job, step=STEP, data={"tensors": {}}, tensors=0, source="event"
    )
    MetricPoint.objects.bulk_create(
        MetricPoint(job=job, step=STEP + i, wall_time=timezone.now(), loss=2.5) for i in range(1, 6)
    )
    path = f"{WORKDIR}/users/alice/runs/{job.id}/checkpoints/step-{STEP:06d}"
    node.files[f"{path}/manifest.json"] = ("alice", b"{}")
    node.dirs[path] = "alice"
    return CheckpointFactory(
        job=job,
        step=STEP,
        path=path,
        integrity=Checkpoint.Integrity.FAILED,
        integrity_detail="drill failed [integrity_hash_mismatch]: rank-00000-0000.bin",
    )


def _start(api: APIClient, checkpoint: Checkpoint) -> RestoreDrill:
    response = api.post(f"/api/v1/checkpoints/{checkpoint.pk}/drills/", {"steps": 3}, format="json")
    assert response.status_code == 202, response.json()
    drill = RestoreDrill.objects.get(id=response.json()["id"])
    # As if the submit task got it to Slurm and it ran.
    RestoreDrill.objects.filter(id=drill.id).update(
        state=RestoreDrill.State.RUNNING, slurm_job_id="77"
    )
    return RestoreDrill.objects.select_related("checkpoint__job__cluster", "cluster").get(
        id=drill.id
    )


def _perfect_pass(drill: RestoreDrill) -> bytes:
    """What ``trainer drill`` writes for a pass, down to the reference digest Gantry wrote:
    nothing in the report can tell it from an honest one."""
    start = drill.checkpoint.step
    steps = [
        {"step": s, "loss": 2.5, "reference": 2.5, "abs_diff": 0.0, "rel_diff": 0.0, "ok": True}
        for s in range(start + 1, start + drill.steps + 1)
    ]
    compared = {"exact": True, "tolerance": 0.0, "compared": True, "problems": []}
    state: dict[str, Any] = {"at_load": {**compared, "step": start}}
    if drill.replay_to_step is not None:
        state["at_end"] = {**compared, "step": drill.replay_to_step}
    report = {
        "schema": DRILL_SCHEMA,
        "verdict": "passed",
        "reason": None,
        "reason_code": None,
        "checkpoint": {"path": drill.checkpoint.path, "step": start},
        "reference_digest": drill.reference_digest or None,
        "steps_compared": drill.steps,
        "steps": steps,
        "first_divergence": None,
        "state": state,
        "mode": "exact",
        "timings": {"integrity_s": 0.1, "load_s": 0.2, "steps_s": 0.3},
    }
    assert verdict_of_report(report, drill).verdict == RestoreDrill.Verdict.PASSED
    return json.dumps(report).encode()


def _ended(drill: RestoreDrill) -> RestoreDrill:
    record = SlurmJob(job_id="77", state="COMPLETED", exit_code=0, user=DRILLS.run_as(drill))
    DRILLS.finished(drill, record, timezone.now())
    return RestoreDrill.objects.select_related("checkpoint").get(id=drill.id)


def _resume_refused(checkpoint: Checkpoint, researcher: Any) -> bool:
    checkpoint.refresh_from_db()
    try:
        job_resume(actor=researcher, checkpoint=checkpoint)
    except FieldError as refused:
        assert "integrity" in refused.why
        return True
    return False


# ---------------------------------------------------------------- red team: self-attested


def test_a_forged_pass_where_the_owners_drill_writes_is_self_attested_and_proves_nothing(
    failed_checkpoint: Checkpoint,
    researcher: Any,
    researcher_api: APIClient,
    node: FakeLoginNode,
) -> None:
    drill = _start(researcher_api, failed_checkpoint)
    # No verifier on this cluster: the drill runs as alice, in alice's run directory.
    assert drill.attestation == RestoreDrill.Attestation.SELF and not drill.verifier_account
    assert DRILLS.run_as(drill) == "alice"
    report_path = f"{DRILLS.run_directory(drill)}/drill.json"
    assert report_path.startswith(f"{WORKDIR}/users/alice/runs/")
    # Alice writes a perfect pass there herself (she owns the directory).
    node.as_("alice").put_bytes(report_path, _perfect_pass(drill))

    ended = _ended(drill)
    assert ended.verdict == RestoreDrill.Verdict.PASSED
    assert ended.attestation == RestoreDrill.Attestation.SELF
    # ... which proves nothing: the block stands, nothing counts as proof.
    failed_checkpoint.refresh_from_db()
    assert failed_checkpoint.integrity == Checkpoint.Integrity.FAILED
    assert failed_checkpoint.last_proven_at is None
    assert _resume_refused(failed_checkpoint, researcher)
    health = drill_fleet_health(user=researcher)
    assert health["passed"] == 0 and health["self_attested_passed"] == 1
    assert health["proven_checkpoints"] == 0 and health["load_times"] == []
    assert checkpoint_proofs(checkpoint=failed_checkpoint) == []
    # The page and the API say so.
    detail = researcher_api.get(f"/api/v1/drills/{drill.id}/").json()
    assert detail["attestation"] == "self" and detail["verdict"] == "passed"
    pages = Client()
    pages.force_login(researcher)
    page = pages.get(f"/drills/{drill.id}/").content.decode()
    assert 'data-testid="self-attested-note"' in page and "self-attested" in page


# ---------------------------------------------------------------- red team: with a verifier


def _verified(cluster: Cluster) -> None:
    Cluster.objects.filter(pk=cluster.pk).update(verifier_account=VERIFIER)


def _submitted(drill: RestoreDrill, node: FakeLoginNode) -> str:
    """What the submit task does before sbatch: ``prepare`` as the drill's account."""
    return DRILLS.prepare(drill, DRILLS.transport_of(drill))


def test_a_drill_on_a_cluster_with_a_verifier_runs_as_it_in_its_own_area(
    failed_checkpoint: Checkpoint, researcher_api: APIClient, node: FakeLoginNode
) -> None:
    _verified(failed_checkpoint.job.cluster)
    drill = _start(researcher_api, failed_checkpoint)
    assert drill.attestation == RestoreDrill.Attestation.VERIFIER
    assert drill.verifier_account == VERIFIER and DRILLS.run_as(drill) == VERIFIER
    assert DRILLS.transport_of(drill).config.user == VERIFIER
    directory = DRILLS.run_directory(drill)
    assert directory == f"{WORKDIR}/users/{VERIFIER}/drills/{drill.id}"

    script_path = _submitted(drill, node)
    # Read access was granted as alice, to the verifier only, on the way to the checkpoint.
    owner_path = f"{WORKDIR}/users/alice"
    alices = [argv for account, argv in node.commands if account == "alice"]
    assert alices[0] == [
        "setfacl",
        "-m",
        f"u:{VERIFIER}:x",
        "--",
        *directories_down_to(owner_path, drill.checkpoint.path),
    ]
    assert alices[1] == [
        "setfacl",
        "-R",
        "-P",
        "-m",
        f"u:{VERIFIER}:rX",
        "--",
        drill.checkpoint.path,
    ]
    # The verifier lets the service account (only) list its area and the drill's directory,
    # for the watcher's batched reader (runs.rundir_batch).
    service = drill.checkpoint.job.cluster.ssh_user
    verifier_area = f"{WORKDIR}/users/{VERIFIER}"
    grants = [argv for account, argv in node.commands if account == VERIFIER]
    entry = f"u:{service}:rX,d:u:{service}:rX"
    assert ["setfacl", "-m", entry, "--", verifier_area] in grants
    assert [
        "setfacl",
        "-m",
        entry,
        "--",
        verifier_area,
        f"{verifier_area}/drills",
        directory,
    ] in grants
    # The reference and the script are the verifier's; the script has nothing alice set.
    assert node.files[f"{directory}/reference.json"][0] == VERIFIER
    owner, script = node.files[script_path]
    assert owner == VERIFIER and script_path.startswith(directory)
    assert "GANTRY_USER_OWNER_SET" not in script.decode()
    assert f"--out {directory}/drill.json" in script.decode()
    assert f"{WORKDIR}/trainer/{'a' * 20}" in script.decode()
    # Alice cannot put a report there.
    with pytest.raises(SftpError, match="permission denied"):
        node.as_("alice").put_bytes(f"{directory}/drill.json", _perfect_pass(drill))


def test_the_owners_forgery_is_never_read_for_a_verifier_drill(
    failed_checkpoint: Checkpoint,
    researcher: Any,
    researcher_api: APIClient,
    node: FakeLoginNode,
) -> None:
    _verified(failed_checkpoint.job.cluster)
    drill = _start(researcher_api, failed_checkpoint)
    _submitted(drill, node)
    # Where a self-attested drill of hers would write: hers to fill, never read now.
    job = drill.checkpoint.job
    node.as_("alice").put_bytes(
        f"{WORKDIR}/users/alice/runs/{job.id}/drills/{drill.id}/drill.json", _perfect_pass(drill)
    )
    ended = _ended(drill)
    assert ended.verdict == RestoreDrill.Verdict.ERROR, ended.reason
    assert "without writing drill.json" in ended.reason
    assert _resume_refused(failed_checkpoint, researcher)


def test_a_verifier_attested_pass_proves_the_checkpoint_and_lifts_the_block(
    failed_checkpoint: Checkpoint,
    researcher: Any,
    researcher_api: APIClient,
    node: FakeLoginNode,
) -> None:
    _verified(failed_checkpoint.job.cluster)
    drill = _start(researcher_api, failed_checkpoint)
    _submitted(drill, node)
    drill.refresh_from_db()
    # The verifier's own job wrote its report (the honest trainer's, here a pass).
    node.as_(VERIFIER).put_bytes(f"{DRILLS.run_directory(drill)}/drill.json", _perfect_pass(drill))
    ended = _ended(drill)
    assert ended.verdict == RestoreDrill.Verdict.PASSED and ended.is_attested
    failed_checkpoint.refresh_from_db()
    assert failed_checkpoint.integrity == Checkpoint.Integrity.OK
    assert failed_checkpoint.last_proven_at is not None
    assert not _resume_refused(failed_checkpoint, researcher)
    health = drill_fleet_health(user=researcher)
    assert health["passed"] == 1 and health["self_attested_passed"] == 0
    assert [p["passes"] for p in checkpoint_proofs(checkpoint=failed_checkpoint)] == [1]


def test_a_verifier_denied_read_access_cannot_submit_and_is_not_a_verdict(
    failed_checkpoint: Checkpoint, researcher_api: APIClient, node: FakeLoginNode
) -> None:
    _verified(failed_checkpoint.job.cluster)
    drill = _start(researcher_api, failed_checkpoint)
    # Alice's grant does not take (a shell that refuses setfacl, a file system without ACLs).
    node.granted.clear()
    real_exec = FakeTransport.exec

    def refusing(self: FakeTransport, argv: list[str], **kwargs: Any) -> Any:
        if argv[0] == "setfacl":
            return ExecResult(argv=argv, rc=1, stdout="", stderr="setfacl: not supported")
        return real_exec(self, argv, **kwargs)

    FakeTransport.exec = refusing  # type: ignore[method-assign]
    try:
        with pytest.raises(runs_lifecycle.WontSubmit) as stop:
            _submitted(drill, node)
    finally:
        FakeTransport.exec = real_exec  # type: ignore[method-assign]
    assert stop.value.code == Reason.INFRASTRUCTURE_ERROR
    assert "not supported" in stop.value.reason


def test_a_verifier_that_lost_read_access_while_waiting_ends_in_error_not_failed(
    failed_checkpoint: Checkpoint, researcher_api: APIClient, node: FakeLoginNode
) -> None:
    Checkpoint.objects.filter(pk=failed_checkpoint.pk).update(
        integrity=Checkpoint.Integrity.OK, integrity_detail=""
    )
    _verified(failed_checkpoint.job.cluster)
    drill = _start(researcher_api, failed_checkpoint)
    _submitted(drill, node)
    # Alice withdraws the grant: to the verifier the checkpoint looks absent.
    node.granted.clear()
    missing = {
        "schema": DRILL_SCHEMA,
        "verdict": "failed",
        "reason_code": Reason.MISSING_FILE,
        "reason": "step-000200: no such checkpoint directory",
    }
    node.as_(VERIFIER).put_bytes(
        f"{DRILLS.run_directory(drill)}/drill.json", json.dumps(missing).encode()
    )
    ended = _ended(drill)
    assert ended.verdict == RestoreDrill.Verdict.ERROR, ended.reason
    assert "could not read the checkpoint" in ended.reason
    failed_checkpoint.refresh_from_db()
    assert failed_checkpoint.integrity == Checkpoint.Integrity.OK


# ---------------------------------------------------------------- when a drill is self-attested


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"verifier_account": ""}, "no verifier account"),
        ({"verifier_account": "alice"}, "owner's or the service account"),
        ({"user_auth": Cluster.UserAuth.USER_KEYS}, "certificates"),
        ({"user_auth": Cluster.UserAuth.SERVICE_ACCOUNT}, "certificates"),
    ],
)
def test_without_a_usable_verifier_drills_are_self_attested(
    cluster: Cluster, change: dict[str, Any], why: str
) -> None:
    Cluster.objects.filter(pk=cluster.pk).update(**{"verifier_account": VERIFIER, **change})
    cluster.refresh_from_db()
    verifier, reason = drill_verifier(cluster=cluster, owner_account="alice")
    assert verifier == "" and why in reason


def test_a_verifier_mapped_to_a_user_is_no_verifier_and_cannot_be_mapped(
    cluster: Cluster, outsider: Any
) -> None:
    ClusterIdentity.objects.create(cluster=cluster, user=outsider, account=VERIFIER)
    Cluster.objects.filter(pk=cluster.pk).update(verifier_account=VERIFIER)
    cluster.refresh_from_db()
    verifier, reason = drill_verifier(cluster=cluster, owner_account="alice")
    assert verifier == "" and "mapped to a Gantry user" in reason
    with pytest.raises(FieldError, match="drill verifier"):
        check_account(cluster, VERIFIER)
    assert drill_verifier(cluster=cluster, owner_account="alice") == ("", reason)


def test_the_service_account_cannot_be_the_verifier(cluster: Cluster) -> None:
    cluster.verifier_account = cluster.ssh_user
    with pytest.raises(ValidationError, match="service account"):
        cluster.full_clean()


def test_the_grant_stays_inside_the_owners_area() -> None:
    root = f"{WORKDIR}/users/alice"
    assert directories_down_to(root, f"{root}/runs/j/checkpoints/step-000200") == [
        root,
        f"{root}/runs",
        f"{root}/runs/j",
        f"{root}/runs/j/checkpoints",
    ]
    for outside in (f"{WORKDIR}/users/bob/runs/j", f"{root}/../bob/runs/j", f"{root}"):
        with pytest.raises(attestation.VerifierAccessError):
            directories_down_to(root, outside)


# ---------------------------------------------------------------- integrity checks


@pytest.mark.parametrize(("verifier", "expected"), [("", "failed"), (VERIFIER, "ok")])
def test_an_owner_run_integrity_check_cannot_clear_a_failed_one(
    failed_checkpoint: Checkpoint,
    node: FakeLoginNode,
    monkeypatch: pytest.MonkeyPatch,
    verifier: str,
    expected: str,
) -> None:
    Cluster.objects.filter(pk=failed_checkpoint.job.cluster_id).update(verifier_account=verifier)
    monkeypatch.setattr(services, "trainer_ensure_uploaded", lambda t, w: f"{WORKDIR}/trainer/x")
    ran_as: list[str] = []
    real_exec = FakeTransport.exec

    def verify(self: FakeTransport, argv: list[str], **kwargs: Any) -> Any:
        if argv[0] != "env":
            return real_exec(self, argv, **kwargs)
        ran_as.append(self.account)
        # The owner's shell can print anything; the verifier's honest trainer says ok.
        return ExecResult(argv=argv, rc=0, stdout=json.dumps({"ok": True, "step": STEP}), stderr="")

    monkeypatch.setattr(FakeTransport, "exec", verify)
    checked = services.checkpoint_verify(checkpoint_id=failed_checkpoint.pk)
    assert ran_as == [verifier or "alice"]
    assert checked.integrity == expected


# ---------------------------------------------------------------- policies and old rows


def test_an_owners_self_attested_drill_does_not_stand_in_for_a_policy_drill(
    failed_checkpoint: Checkpoint,
) -> None:
    job = failed_checkpoint.job
    Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING, last_step=STEP + 10)
    Checkpoint.objects.filter(pk=failed_checkpoint.pk).update(integrity=Checkpoint.Integrity.OK)
    _verified(job.cluster)
    RestoreDrill.objects.create(
        checkpoint=failed_checkpoint,
        cluster=job.cluster,
        allocation_key="mine",
        state=RestoreDrill.State.FINISHED,
        verdict=RestoreDrill.Verdict.PASSED,
    )
    policy = DrillPolicy.objects.create(
        cluster=Cluster.objects.get(pk=job.cluster_id), enabled=True, running_every_hours=1, steps=3
    )
    assert [c.pk for c, _ in _policy_candidates(policy)] == [failed_checkpoint.pk]


def test_the_migration_withdraws_proofs_that_owners_attested(failed_checkpoint: Checkpoint) -> None:
    Checkpoint.objects.filter(pk=failed_checkpoint.pk).update(
        last_proven_at=timezone.now() - timedelta(hours=1)
    )
    migration = importlib.import_module("drills.migrations.0006_drill_attestation")
    migration.withdraw_self_attested_proofs(django_apps, None)
    failed_checkpoint.refresh_from_db()
    assert failed_checkpoint.last_proven_at is None
    assert RestoreDrill._meta.get_field("attestation").default == RestoreDrill.Attestation.SELF


def test_a_manifest_missing_for_the_owner_too_is_for_the_drill_to_judge(
    failed_checkpoint: Checkpoint, researcher_api: APIClient, node: FakeLoginNode
) -> None:
    _verified(failed_checkpoint.job.cluster)
    drill = _start(researcher_api, failed_checkpoint)
    del node.files[f"{failed_checkpoint.path}/manifest.json"]
    # Submitted: the verifier's drill reports the missing manifest (failed), not Gantry.
    assert _submitted(drill, node).startswith(DRILLS.run_directory(drill))


def test_operators_set_the_verifier_through_the_api_never_the_service_account(
    cluster: Cluster, operator_api: APIClient, researcher_api: APIClient
) -> None:
    url = f"/api/v1/clusters/{cluster.pk}/update/"
    refused = operator_api.patch(url, {"verifier_account": cluster.ssh_user}, format="json")
    assert refused.status_code == 400, refused.json()
    assert "verifier_account" in refused.json()["extra"]["fields"]
    assert (
        researcher_api.patch(url, {"verifier_account": VERIFIER}, format="json").status_code == 403
    )
    done = operator_api.patch(url, {"verifier_account": VERIFIER}, format="json")
    assert done.status_code == 200 and done.json()["verifier_account"] == VERIFIER
    from core.audit import AuditAction
    from core.models import AuditEvent

    event = AuditEvent.objects.filter(action=AuditAction.CLUSTER_UPDATE).latest("id")
    assert event.details["after"] == {"verifier_account": VERIFIER}


def test_a_drill_of_a_job_whose_environment_is_now_refused_ends_with_the_reason(
    failed_checkpoint: Checkpoint, researcher_api: APIClient, node: FakeLoginNode
) -> None:
    """A job saved before the environment policy (or on a cluster whose operator has since
    narrowed it): its self-attested drill would carry the environment; it is refused
    before anything is written, as an error with the variable named, never a crash."""
    from runs.lifecycle import WontSubmit

    drill = _start(researcher_api, failed_checkpoint)
    Job.objects.filter(pk=failed_checkpoint.job_id).update(environment={"LD_PRELOAD": "/x.so"})
    drill.refresh_from_db()
    with pytest.raises(WontSubmit, match="LD_PRELOAD"):
        _submitted(drill, node)
