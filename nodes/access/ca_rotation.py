"""Rotating a cluster's user CA without a moment when logins fail (``manage.py
gantry_ca_rotate``).

Publish before use: a login node accepts a certificate only from a CA in its
TrustedUserCAKeys file, and Gantry cannot know when every login node's admin has added a
new line. So a rotation has two steps, and the login nodes trust both CAs in between:

1. ``cluster_user_ca_rotate``: a new CA key is made beside the current one
   (``user_ca.next``, 0600) and its public line is stored as ``user_ca_next_public_key``;
   Gantry shows both lines for the trusted file (``identities.trusted_ca_keys``) and keeps
   signing with the current CA, so nothing changes for logins. The admins add the new line.
2. ``cluster_user_ca_rotate_finish``: the new key replaces the current one (one atomic
   rename: a signer reads either the old file or the new one, never a mix); Gantry signs
   with it from now on and shows only its line. The admins remove the old line. A
   certificate of the old CA still held by a pooled connection is refused once its line is
   gone, and the transport signs a new one at once.

Both are audited and safe to run again (a repeated rotate keeps the pending key; a finish
whose rename happened but whose database write did not completes on the next run), and
run only where the CA key may be read (the workers' host, as the user that owns
``GANTRY_DATA_DIR/ssh``): never in a web process.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from django.conf import settings
from django.db import transaction

from core.audit import AuditAction, audit_event_record
from core.errors import FieldError
from core.types import Actor
from nodes.access.cluster import user_ca_key_path
from nodes.access.identities import _check_operator, _create_private_file, trusted_ca_keys
from nodes.models import Cluster
from slurm.certificates import ca_public_line, generate_ca_private_key

NEXT_SUFFIX = ".next"


def user_ca_next_key_path(cluster: Cluster) -> Path:
    """The rotation's new CA key, beside the current one (same 0700 directory)."""
    current = user_ca_key_path(cluster)
    return current.with_name(current.name + NEXT_SUFFIX)


def _public(path: Path, cluster: Cluster) -> str:
    return ca_public_line(path.read_bytes(), f"gantry-user-ca:{cluster.name}")


def _check_rotatable(cluster: Cluster) -> Path:
    if settings.CA_KEY_ACCESS != "local":
        raise FieldError(
            "cluster", "this process may not read the CA key; rotate where the workers run"
        )
    if cluster.user_auth != Cluster.UserAuth.CERTIFICATE:
        raise FieldError("cluster", f"{cluster.name} does not use certificates")
    current = user_ca_key_path(cluster)
    if not current.exists():
        raise FieldError("cluster", f"{cluster.name} has no user CA to rotate; create it first")
    return current


def cluster_user_ca_rotate(*, actor: Actor, cluster: Cluster) -> list[str]:
    """Step 1: make the next CA (kept if one is pending) and trust both. Returns the lines
    the login nodes' TrustedUserCAKeys file holds now (current first)."""
    _check_operator(actor)
    _check_rotatable(cluster)
    path = user_ca_next_key_path(cluster)
    created = False
    if not path.exists():
        created = _create_private_file(path, generate_ca_private_key())
    pending = _public(path, cluster)
    with transaction.atomic():
        current = Cluster.objects.select_for_update().get(pk=cluster.pk)
        if current.user_ca_next_public_key != pending:
            current.user_ca_next_public_key = pending
            current.save(update_fields=["user_ca_next_public_key", "updated_at"])
            audit_event_record(
                actor=actor,
                action=AuditAction.CLUSTER_USER_CA_ROTATE,
                target=current,
                details={
                    "current": current.user_ca_public_key,
                    "next": pending,
                    "new_key": created,
                },
            )
    cluster.refresh_from_db()
    return trusted_ca_keys(cluster)


def cluster_user_ca_rotate_finish(*, actor: Actor, cluster: Cluster) -> list[str]:
    """Step 2: sign with the next CA from now on and stop trusting the old one. Returns the
    one line the TrustedUserCAKeys file keeps."""
    _check_operator(actor)
    current_path = _check_rotatable(cluster)
    next_path = user_ca_next_key_path(cluster)
    with transaction.atomic():
        current = Cluster.objects.select_for_update().get(pk=cluster.pk)
        pending = current.user_ca_next_public_key.strip()
        if not pending:
            raise FieldError("cluster", f"{cluster.name} has no rotation to finish")
        if next_path.exists():
            if _public(next_path, cluster) != pending:
                raise FieldError(
                    "cluster",
                    f"{next_path} is not the CA the login nodes were told to trust; rotate again",
                )
            os.replace(next_path, current_path)
            with contextlib.suppress(OSError):
                _fsync_directory(current_path.parent)
        signing = _public(current_path, cluster)
        if signing != pending:
            raise FieldError("cluster", f"{current_path} is not the pending CA; rotate again")
        retired = current.user_ca_public_key
        current.user_ca_public_key = signing
        current.user_ca_next_public_key = ""
        current.save(update_fields=["user_ca_public_key", "user_ca_next_public_key", "updated_at"])
        audit_event_record(
            actor=actor,
            action=AuditAction.CLUSTER_USER_CA_ROTATE_FINISH,
            target=current,
            details={"retired": retired, "current": signing},
        )
    cluster.refresh_from_db()
    return trusted_ca_keys(cluster)


def _fsync_directory(path: Path) -> None:
    """The rename survives a crash once the directory is on disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
