"""Who attests a restore drill, and how a verifier's drill reaches the checkpoint.

The trust model
---------------
A drill's verdict comes from ``drill.json``, written by whoever runs the drill. The owner of
a checkpoint owns their run directory and everything in it, can log in as their own account
and can change their shell's start-up files: a drill run as the owner, or writing where the
owner can write, reports whatever the owner wants. So:

- **Verifier-attested** (``RestoreDrill.Attestation.VERIFIER``): the cluster names a
  verifier account (``Cluster.verifier_account``) that no Gantry user is mapped to, that is
  not the service account and not the checkpoint's owner. Gantry logs in as it with its own
  short-lived certificate (principal = the verifier; Gantry never signs one for it on a
  user's behalf), and submits the drill as it. The drill writes into the verifier's own
  area, ``<workdir>/users/<verifier>/drills/<drill id>/`` (0700), which the owner cannot
  write; Gantry writes the reference there and reads ``drill.json`` and the exit record
  back as the verifier. The trainer comes from Gantry's content-addressed archive (written by
  the service account, read-only for users); the job's environment is the verifier's, never
  the owner's (``Job.environment`` is left out); the working directory is the verifier's.
  What the owner still controls is the checkpoint's bytes, which is what is judged: they
  are held to Gantry's own reference (fingerprints, losses, the registered manifest
  digest), loaded with ``torch.load(weights_only=True)``.
- **Read access** is granted per drill by Gantry acting as the owner, with POSIX ACLs:
  ``u:<verifier>:x`` on each directory from the owner's area down to the checkpoint, and
  ``u:<verifier>:rX`` on the checkpoint's files. Safety never depends on it: an owner who
  withdraws it makes the drill end ``error`` (Gantry checks, before submitting and when a
  report says files are missing, that the verifier can see what the owner can), never a
  pass.
- **Self-attested** (``SELF``): everything else (no verifier account, a cluster in
  service-account mode or in per-user key mode, a verifier that is mapped to a user or is
  the owner, and every drill from before attestation). It runs as the owner, in the run
  directory, as before. Its pass is shown as self-attested, for the researcher's own
  information: it does not set ``Checkpoint.last_proven_at`` (the proof behind fleet
  health, work at risk, recovery and policies) and does not clear a failed integrity
  check. Its failure still blocks resuming: the owner's word against their own checkpoint
  only fails closed.

The same rule holds for integrity checks (``checkpoint_verify``): run as the verifier where
there is one; an owner-run check can fail a checkpoint but never clear a failure.
"""

from __future__ import annotations

import posixpath

from drills.models import RestoreDrill
from jobs.models import Checkpoint
from nodes.access.cluster import transport_as, transport_for
from nodes.models import Cluster, ClusterIdentity
from runs.runtime import UserAreaError, user_area, user_area_ensure
from slurm.errors import SftpError
from slurm.transport import SshTransport
from trainer.schema import Reason

# How long the grant's setfacl may take on a large checkpoint (one entry per file).
GRANT_TIMEOUT_S = 300
# Reason codes a verifier's drill reports when it cannot see the files (an untraversable
# directory looks absent to the trainer).
UNSEEN_CODES = frozenset({Reason.MISSING_FILE, Reason.MISSING_MANIFEST})


class VerifierAccessError(Exception):
    """The verifier cannot be given, or does not have, read access to the checkpoint."""


def drill_verifier(*, cluster: Cluster, owner_account: str) -> tuple[str, str]:
    """``(verifier, "")`` when a drill of a checkpoint that ``owner_account`` owns can run
    as ``cluster``'s verifier; ``("", why not)`` when it runs self-attested. Checked when
    each drill starts, whatever was saved on the cluster."""
    verifier = cluster.verifier_account
    if not verifier:
        return "", f"{cluster.name} has no verifier account"
    if cluster.user_auth != Cluster.UserAuth.CERTIFICATE:
        return "", (
            f"{cluster.name} does not log in with Gantry's user certificates, which the "
            "verifier account needs"
        )
    if verifier in (cluster.ssh_user, owner_account):
        return "", f"the verifier account {verifier} is the owner's or the service account"
    if ClusterIdentity.objects.filter(cluster=cluster, account=verifier).exists():
        return "", f"the verifier account {verifier} is mapped to a Gantry user, who acts as it"
    return verifier, ""


def drill_attestation(*, cluster: Cluster, owner_account: str) -> tuple[dict[str, str], str]:
    """The fields a new drill gets (``attestation``, ``verifier_account``), and why it is
    self-attested (``""`` when it is not)."""
    verifier, why = drill_verifier(cluster=cluster, owner_account=owner_account)
    attestation = RestoreDrill.Attestation.VERIFIER if verifier else RestoreDrill.Attestation.SELF
    return {"attestation": attestation, "verifier_account": verifier}, why


def verifier_drill_dir(workdir: str, verifier: str, drill_id: str) -> str:
    """Where a verifier's drill writes: its own area, which no owner can write."""
    return f"{user_area(workdir, verifier)}/drills/{drill_id}"


def owner_root(workdir: str, owner_account: str) -> str:
    """The top of what the owner's work writes: their area (or, for work run as the
    service account, ``<workdir>/runs``)."""
    return user_area(workdir, owner_account) if owner_account else f"{workdir.rstrip('/')}/runs"


def directories_down_to(root: str, path: str) -> list[str]:
    """``root`` and each directory below it on the way to ``path`` (not ``path`` itself);
    refused when ``path`` is not below ``root`` or climbs out of it."""
    normal = posixpath.normpath(path)
    if normal != path.rstrip("/") or not normal.startswith(root.rstrip("/") + "/"):
        raise VerifierAccessError(f"the checkpoint {path} is not inside its owner's area {root}")
    parts = normal[len(root.rstrip("/")) + 1 :].split("/")
    return [root.rstrip("/")] + [
        posixpath.join(root.rstrip("/"), *parts[:depth]) for depth in range(1, len(parts))
    ]


def grant_read(owner: SshTransport, *, root: str, checkpoint_path: str, verifier: str) -> None:
    """As the owner: let ``verifier`` traverse to the checkpoint and read it (POSIX ACLs;
    argv only, no shell). Raises ``VerifierAccessError`` with setfacl's words when the way
    to the checkpoint cannot be opened. A file in it the owner does not own (only root puts
    one there) keeps its own mode: what the verifier can read of it, the drill judges."""
    commands = [
        ["setfacl", "-m", f"u:{verifier}:x", "--", *directories_down_to(root, checkpoint_path)],
        ["setfacl", "-R", "-P", "-m", f"u:{verifier}:rX", "--", checkpoint_path],
    ]
    for index, argv in enumerate(commands):
        result = owner.exec(argv, check=False, timeout=GRANT_TIMEOUT_S)
        if result.rc != 0 and (index == 0 or "Operation not permitted" not in result.stderr):
            said = (result.stderr or result.stdout).strip()[:500]
            raise VerifierAccessError(
                f"could not let the verifier {verifier} read the checkpoint as its owner "
                f"({' '.join(argv[:4])} exited {result.rc}: {said}); the login node needs "
                "setfacl and a file system with POSIX ACLs"
            )


def manifest_visible(transport: SshTransport, checkpoint: Checkpoint) -> bool | None:
    """Whether ``transport``'s account sees the checkpoint's manifest; None when the
    cluster did not say (an SFTP error other than permission denied)."""
    try:
        return transport.exists(f"{checkpoint.path}/manifest.json")
    except SftpError as error:
        return False if "permission denied" in str(error) else None


def check_verifier_reads(
    verifier: SshTransport, owner: SshTransport, checkpoint: Checkpoint
) -> None:
    """Before submitting: the verifier sees the manifest the owner sees, or the drill cannot
    run (a manifest missing for the owner too is the checkpoint's fault: the drill says so)."""
    if manifest_visible(verifier, checkpoint) is True:
        return
    if manifest_visible(owner, checkpoint) is not False:
        raise VerifierAccessError(
            f"the verifier account {verifier.config.user} cannot read {checkpoint.path} "
            "(its owner's grant is missing or was withdrawn)"
        )


def unseen_by_verifier(
    report: object, checkpoint: Checkpoint, *, verifier: SshTransport, owner: SshTransport
) -> str | None:
    """Why a verifier's report of missing files is the verifier's blindness, not the
    checkpoint's fault (the owner sees the manifest, the verifier does not), or None."""
    if not isinstance(report, dict) or report.get("reason_code") not in UNSEEN_CODES:
        return None
    if manifest_visible(verifier, checkpoint) is not False:
        return None
    if manifest_visible(owner, checkpoint) is not True:
        return None
    return (
        f"the verifier account {verifier.config.user} could not read the checkpoint its "
        "owner still holds (read access was withdrawn while the drill waited or ran)"
    )


def open_to_verifier(
    *, cluster: Cluster, owner_account: str, checkpoint: Checkpoint, verifier: SshTransport
) -> None:
    """Before a verifier's drill is submitted: its own area (0700, proven its own), read
    access to the checkpoint granted as the owner, and checked as the verifier. Raises
    ``VerifierAccessError`` saying which step failed."""
    account = verifier.config.user
    try:
        user_area_ensure(
            transport_for(cluster),
            verifier,
            cluster.workdir,
            account,
            service_account=cluster.ssh_user,
        )
    except UserAreaError as error:
        raise VerifierAccessError(str(error)) from None
    owner = transport_as(cluster, owner_account)
    grant_read(
        owner,
        root=owner_root(cluster.workdir, owner_account),
        checkpoint_path=checkpoint.path,
        verifier=account,
    )
    check_verifier_reads(verifier, owner, checkpoint)


def integrity_checker(checkpoint: Checkpoint) -> tuple[SshTransport, bool]:
    """Whom an integrity check runs as: the cluster's verifier, once it can read the
    checkpoint (True: its result counts either way), else the owner (False: it can fail
    the checkpoint but never clear a failure)."""
    job = checkpoint.job
    cluster = job.cluster
    owner = transport_as(cluster, job.run_as)
    verifier, _ = drill_verifier(cluster=cluster, owner_account=job.run_as)
    if verifier:
        transport = transport_as(cluster, verifier)
        try:
            root = owner_root(cluster.workdir, job.run_as)
            grant_read(owner, root=root, checkpoint_path=checkpoint.path, verifier=verifier)
            check_verifier_reads(transport, owner, checkpoint)
        except VerifierAccessError:
            # The owner's own check instead, which counts for less.
            return owner, False
        return transport, True
    return owner, False
