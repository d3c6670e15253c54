"""OpenSSH user certificates: Gantry's per-cluster certificate authority, and short-lived
certificates for one principal (a cluster account) on a key made for that one connection.

The login node trusts the CA with one ``sshd_config`` line (``TrustedUserCAKeys FILE``);
sshd then accepts a certificate whose principals name the account being logged in to,
while it is valid. Certificates carry no extensions (no pty, no forwarding, no agent: an
exec channel and SFTP need none) and are valid for minutes; the private half of the key
they certify lives only in memory. Signed with ``cryptography``, never by a shell.
"""

from __future__ import annotations

import io
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.serialization import (
    SSHCertificateBuilder,
    SSHCertificateType,
)

from nodes.slurm.errors import SshConfigurationError

# A Unix account name as a principal: what ``useradd`` accepts by default, and no more.
PRINCIPAL = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
# A certificate starts to be valid a little in the past: the login node's clock may lag.
CLOCK_SKEW_SECONDS = 60
# Key ids are logged by sshd ("ID gantry:devcluster:alice"); keep them printable.
_KEY_ID = re.compile(r"[A-Za-z0-9:._@/-]{1,128}")


@dataclass(frozen=True)
class CertificateSpec:
    """How to sign a certificate for one principal: which CA file, for whom, how long."""

    ca_key_path: str
    principal: str
    key_id: str
    valid_seconds: int = 600


@dataclass(frozen=True)
class SignedKey:
    """A fresh key with its certificate loaded (for paramiko), and when it expires."""

    key: paramiko.PKey
    valid_before: float
    serial: int


def check_principal(principal: str) -> str:
    if not isinstance(principal, str) or not PRINCIPAL.fullmatch(principal):
        raise ValueError(f"invalid cluster account (principal): {principal!r}")
    return principal


def generate_ca_private_key() -> bytes:
    """A new Ed25519 CA key, in OpenSSH's private key format (unencrypted: it is kept in a
    0600 file only Gantry reads)."""
    return ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )


def generate_key_pair(comment: str) -> tuple[bytes, str]:
    """A new Ed25519 key pair: the private key (OpenSSH format) and the public line."""
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return private, f"{public.decode()} {comment}".strip()


def _load_ca(ca_key_path: str) -> ed25519.Ed25519PrivateKey:
    path = Path(ca_key_path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SshConfigurationError(
            f"the user certificate authority key {path} does not exist; an operator "
            'creates it (admin: Clusters, action "Create the user CA")'
        ) from None
    except OSError as error:
        raise SshConfigurationError(f"cannot read the user CA key {path}: {error}") from None
    try:
        key = serialization.load_ssh_private_key(data, password=None)
    except (ValueError, TypeError) as error:
        raise SshConfigurationError(f"the user CA key {path} is unusable: {error}") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise SshConfigurationError(f"the user CA key {path} is not an Ed25519 key")
    return key


def ca_public_line(ca_private_key: bytes, comment: str) -> str:
    """The CA's public key as one line, what goes in the login node's TrustedUserCAKeys file."""
    key = serialization.load_ssh_private_key(ca_private_key, password=None)
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise ValueError("the user CA key is not an Ed25519 key")
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return f"{public.decode()} {comment}".strip()


def sign_user_key(
    spec: CertificateSpec,
    public_key: ed25519.Ed25519PublicKey,
    *,
    now: float | None = None,
    valid_seconds: int | None = None,
) -> tuple[bytes, float, int]:
    """A user certificate for ``public_key`` with ``spec.principal`` as its only principal:
    (the certificate line, when it expires, its serial)."""
    check_principal(spec.principal)
    if not _KEY_ID.fullmatch(spec.key_id):
        raise ValueError(f"invalid certificate key id: {spec.key_id!r}")
    ca = _load_ca(spec.ca_key_path)
    started = int(time.time() if now is None else now)
    lifetime = spec.valid_seconds if valid_seconds is None else valid_seconds
    if lifetime < 1:
        raise ValueError("a certificate must be valid for at least one second")
    valid_before = started + lifetime
    serial = secrets.randbits(63)
    certificate = (
        SSHCertificateBuilder()
        .public_key(public_key)
        .serial(serial)
        .type(SSHCertificateType.USER)
        .key_id(spec.key_id.encode())
        .valid_principals([spec.principal.encode()])
        .valid_after(max(0, started - CLOCK_SKEW_SECONDS))
        .valid_before(valid_before)
        .sign(ca)
    )
    return certificate.public_bytes(), float(valid_before), serial


def signed_key(
    spec: CertificateSpec, *, now: float | None = None, valid_seconds: int | None = None
) -> SignedKey:
    """A key made for one connection, with a fresh certificate for ``spec.principal``.

    The private half never leaves this process's memory."""
    key = ed25519.Ed25519PrivateKey.generate()
    certificate, valid_before, serial = sign_user_key(
        spec, key.public_key(), now=now, valid_seconds=valid_seconds
    )
    private_text = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    pkey = paramiko.Ed25519Key.from_private_key(io.StringIO(private_text))
    pkey.load_certificate(certificate.decode())
    return SignedKey(key=pkey, valid_before=valid_before, serial=serial)
