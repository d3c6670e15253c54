"""The certificate signer: the web processes never read a user CA's private key.

Pages act as a researcher's cluster account (the job's log tail and whole output, the rank
files, cancel, hold and release, a checkpoint's verification), and each such login needs a
certificate of the cluster's user CA. The CA key is the most valuable secret Gantry holds:
with it, anyone can log in as every mapped account for as long as they like. The web tier
is the part of Gantry the whole network talks to, so it is the part that must not be able
to read it.

Design: **signing moves to the Celery workers, which already hold the key** (they submit
and watch as the researchers). A web process runs with ``GANTRY_CA_KEY_ACCESS=signer``
(``make run`` and the README's gunicorn line set it): for each connection it makes the key
pair itself, keeps the private half in memory as before, and sends only the public half
and the names (cluster, account, purpose) to ``USER_CERTIFICATE_SIGN`` on the ``signer``
queue; it waits up to the SSH connect timeout for the certificate
(``nodes.access.signer_client``). The worker (``user_certificate_sign``) decides everything else
from its own database, never from the request: the account must be mapped to a Gantry user
on that cluster (``ClusterIdentity``), not a system account or the service account, the
cluster must use certificates, and the purpose must be one the signer grants (``web``, named
in the certificate's key id, which sshd logs); principal, lifetime and ``source-address``
are the ones a worker would use itself. The web checks the answer is a certificate of its
key for that principal (``certificates.check_signed``). Creating the CA also happens there
(``USER_CA_ENSURE``): the web process writes the database and the audit event, the worker
the key file.

Why this and not the alternatives: moving each page's operation into a task would need one
task per operation and cannot stream a large output file through the broker; a separate
signing daemon would be one more service to deploy and secure, while the workers and the
broker are already there. What it costs: one round trip through Redis per certificate, and
the transport pool reuses a certificate for most of its life, so one per account per web
process every few minutes. A mapping an operator removed stops the pages' access to that
account at once (the watcher, in the workers, still reads the account's running work).

Enforced by configuration and by test: with ``signer`` access, ``nodes.access.cluster``
builds certificate specs with no CA path at all, and ``tests/nodes/test_signer.py`` and the
dev-cluster test stream a log and cancel a job through a real worker while an audit hook
sees every file the web process opens. Deployments make it true for the file system too:
the web processes run as a Unix user that cannot read ``GANTRY_DATA_DIR/ssh``.
"""

from __future__ import annotations

import logging
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from nodes.access.cluster import certificate_spec
from nodes.access.identities import user_ca_key_ensure
from nodes.access.signer_client import PURPOSE_WEB
from nodes.models import Cluster, ClusterIdentity
from slurm.certificates import sign_user_key
from slurm.errors import SshError

logger = logging.getLogger(__name__)

# The purposes the signer grants (the web's). Workers sign their own.
SIGNER_PURPOSES = frozenset({PURPOSE_WEB})


def _refused(reason: str, *, transient: bool = False) -> dict[str, Any]:
    logger.warning("certificate signer refused: %s", reason)
    return {"refused": reason, "transient": transient}


def user_certificate_sign(
    *, cluster: str, account: str, public_key: str, purpose: str
) -> dict[str, Any]:
    """A certificate for ``public_key`` (an Ed25519 OpenSSH public key line) as
    ``account`` on the cluster named ``cluster``: ``{"certificate": line}``, or
    ``{"refused": why}`` when the account is not mapped there, is one Gantry never
    certifies, the cluster does not use certificates or ``purpose`` is not granted.

    Read-only (the CA file is read, nothing is written): safe to repeat."""
    if purpose not in SIGNER_PURPOSES:
        return _refused(f"purpose {purpose!r} is not one the signer grants")
    found = Cluster.objects.filter(name=cluster).first()
    if found is None:
        return _refused(f"no cluster named {cluster!r}")
    if found.user_auth != Cluster.UserAuth.CERTIFICATE:
        return _refused(f"{found.name} does not use certificates ({found.user_auth})")
    try:
        # Refuses root, system accounts and the service account, mapped or not.
        spec = certificate_spec(found, account, purpose=purpose)
    except ValueError as error:
        return _refused(str(error))
    if not ClusterIdentity.objects.filter(cluster=found, account=account).exists():
        return _refused(f"{account!r} is not mapped to a Gantry user on {found.name}")
    try:
        key = serialization.load_ssh_public_key(public_key.encode())
    except (ValueError, TypeError, AttributeError) as error:
        return _refused(f"not an OpenSSH public key: {error}")
    if not isinstance(key, ed25519.Ed25519PublicKey):
        return _refused("only Ed25519 keys are certified")
    if not spec.ca_key_path:
        return _refused("this worker does not read the CA key (GANTRY_CA_KEY_ACCESS)")
    try:
        line, valid_before, serial = sign_user_key(spec, key)
    except SshError as error:
        return _refused(str(error), transient=error.transient)
    logger.info(
        "signed a certificate for %s (%s, serial %s, valid until %d)",
        spec.principal,
        purpose,
        serial,
        valid_before,
    )
    return {"certificate": line.decode()}


def user_ca_public_key(*, cluster_id: int) -> dict[str, Any]:
    """The cluster's user CA public key line, making the CA key file if there is none:
    ``{"public_key": line, "created": bool}``. The database and the audit event are the
    caller's (``nodes.access.identities.cluster_user_ca_ensure``). Safe to repeat: an existing
    CA is kept."""
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        return _refused(f"no cluster {cluster_id}")
    try:
        public, created = user_ca_key_ensure(cluster)
    except SshError as error:
        return _refused(str(error), transient=error.transient)
    except (OSError, ValueError) as error:
        return _refused(f"cannot make or read the user CA of {cluster.name}: {error}")
    return {"public_key": public, "created": created}
