"""OpenSSH user certificates: Gantry's per-cluster certificate authority, and short-lived
certificates for one cluster account on a key made for that one connection.

A certificate's one principal is Gantry's name for the account, ``gantry:<cluster>:<account>``
(``gantry_principal``), never the bare account name. The login node trusts the CA
(``TrustedUserCAKeys FILE``) and says which principal each account accepts with
``AuthorizedPrincipalsCommand`` (``scripts/gantry-principals``: the one Gantry principal for
an ordinary account, nothing for root, system accounts and the service account). Why this
form: ``:`` is the passwd file's field separator, so no Unix account is named like it, and a
login node that trusts the CA without the principals command (sshd's default: principal =
account name) refuses every Gantry certificate instead of accepting one for ``root``; the
cluster's name in it makes a certificate for one cluster useless on another; sshd reads a
principal as one word, and this one has no space or comma.

Gantry refuses to certify what the login node refuses: ``CertificateSpec`` cannot be made
for a system account (``SYSTEM_ACCOUNTS``) or the cluster's service account. With
``source_addresses`` a certificate carries the ``source-address`` critical option: sshd
accepts it only from those networks. Certificates carry no extensions (no pty, no
forwarding, no agent: an exec channel and SFTP need none) and are valid for minutes; the
private half of the key they certify lives only in memory. Signed with ``cryptography``,
never by a shell; in a process that may not read the CA key (the web tier), by
``CertificateSpec.signer`` instead (``nodes.access.signer``).
"""

from __future__ import annotations

import io
import ipaddress
import re
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import paramiko
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.serialization import (
    SSHCertificateBuilder,
    SSHCertificateType,
)

from slurm.errors import SshConfigurationError, local_file_error

# A Unix account name: what ``useradd`` accepts by default, and no more.
PRINCIPAL = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
# Gantry's name of a cluster (also its key directory's name), the principal's namespace.
CLUSTER_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")
# Accounts Gantry never certifies, whatever an operator maps: root and the accounts
# Debian, RHEL and the Slurm stack create for themselves. The login node's principals
# command refuses every account below its minimum uid as well.
SYSTEM_ACCOUNTS = frozenset(
    {
        "root",
        "toor",
        "daemon",
        "bin",
        "sys",
        "sync",
        "games",
        "man",
        "lp",
        "mail",
        "news",
        "uucp",
        "proxy",
        "www-data",
        "backup",
        "list",
        "irc",
        "gnats",
        "nobody",
        "nfsnobody",
        "adm",
        "operator",
        "halt",
        "shutdown",
        "ftp",
        "messagebus",
        "polkitd",
        "sshd",
        "ntp",
        "chrony",
        "systemd-network",
        "systemd-resolve",
        "systemd-timesync",
        "slurm",
        "munge",
        "mysql",
        "postgres",
        "redis",
    }
)
# A certificate starts to be valid a little in the past: the login node's clock may lag.
CLOCK_SKEW_SECONDS = 60
# Key ids are logged by sshd ("ID gantry:devcluster:alice"); keep them printable.
_KEY_ID = re.compile(r"[A-Za-z0-9:._@/-]{1,128}")


# Signs for a process that may not read the CA key: (the spec, the OpenSSH public key
# line of the key to certify) -> the certificate line. A module-level function, so specs
# (and the connection pool keyed by them) stay equal from call to call.
Signer = Callable[["CertificateSpec", str], str]


@dataclass(frozen=True)
class CertificateSpec:
    """How to sign a certificate for one cluster account: the CA file (or the signer that
    holds it), for whom, from where, how long. Made only for an account Gantry may certify:
    never a system account or the cluster's service account (ValueError)."""

    cluster: str
    account: str
    service_account: str
    key_id: str
    ca_key_path: str = ""
    valid_seconds: int = 600
    source_addresses: tuple[str, ...] = ()
    signer: Signer | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.cluster, str) or not CLUSTER_NAME.fullmatch(self.cluster):
            raise ValueError(f"invalid cluster name: {self.cluster!r}")
        check_principal(self.account)
        if self.account == self.service_account:
            raise ValueError(
                f"{self.account!r} is the cluster's service account: Gantry never certifies it"
            )
        if not _KEY_ID.fullmatch(self.key_id):
            raise ValueError(f"invalid certificate key id: {self.key_id!r}")
        if not self.ca_key_path and self.signer is None:
            raise ValueError("a certificate needs the CA key file or a signer")
        addresses = check_source_addresses(self.source_addresses)
        object.__setattr__(self, "source_addresses", addresses)

    @property
    def principal(self) -> str:
        """The certificate's one principal: Gantry's name for the account."""
        return gantry_principal(self.cluster, self.account)


@dataclass(frozen=True)
class SignedKey:
    """A fresh key with its certificate loaded (for paramiko), and when it expires."""

    key: paramiko.PKey
    valid_before: float
    serial: int


def check_principal(account: str) -> str:
    """A cluster account Gantry may act as: a plain Unix user name, not a system account
    (ValueError otherwise). The service account is refused where the cluster is known."""
    if not isinstance(account, str) or not PRINCIPAL.fullmatch(account):
        raise ValueError(f"invalid cluster account (principal): {account!r}")
    if account in SYSTEM_ACCOUNTS or account.startswith("systemd-"):
        raise ValueError(f"{account!r} is a system account: Gantry never acts as it")
    return account


def gantry_principal(cluster: str, account: str) -> str:
    """``gantry:<cluster>:<account>``: what a certificate for ``account`` names, and what
    the login node's principals command prints for it."""
    return f"gantry:{cluster}:{account}"


def check_source_addresses(addresses: str | Iterable[str]) -> tuple[str, ...]:
    """Networks a certificate may be used from (CIDR, or single addresses), normalized
    (``10.1.0.0/16``); a comma- or space-separated text or a list. ValueError on anything
    else, or on a network with host bits set (a typo sshd would read differently)."""
    items = addresses.replace(",", " ").split() if isinstance(addresses, str) else addresses
    networks = []
    for item in items:
        try:
            networks.append(str(ipaddress.ip_network(str(item).strip(), strict=True)))
        except ValueError as error:
            raise ValueError(f"not an IP network in CIDR form: {item!r} ({error})") from None
    if len(",".join(networks)) > 1000:
        raise ValueError("at most 1000 characters of source addresses")
    return tuple(dict.fromkeys(networks))


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
        # EIO, EMFILE, a stale NFS handle: retried; EACCES, EISDIR: a person must act.
        raise local_file_error(f"cannot read the user CA key {path}", error) from None
    try:
        key = serialization.load_ssh_private_key(data, password=None)
    except (ValueError, TypeError) as error:
        raise SshConfigurationError(f"the user CA key {path} is unusable: {error}") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise SshConfigurationError(f"the user CA key {path} is not an Ed25519 key")
    return key


def public_line(private_key: bytes, comment: str) -> str:
    """The public half of an Ed25519 private key (OpenSSH format) as one line with
    ``comment``; ValueError when ``private_key`` is no such key."""
    try:
        key = serialization.load_ssh_private_key(private_key, password=None)
    except TypeError as error:
        # An encrypted key loaded without a password.
        raise ValueError(str(error)) from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise ValueError("not an Ed25519 key")
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return f"{public.decode()} {comment}".strip()


def ca_public_line(ca_private_key: bytes, comment: str) -> str:
    """The CA's public key as one line, what goes in the login node's TrustedUserCAKeys file."""
    try:
        return public_line(ca_private_key, comment)
    except ValueError as error:
        raise ValueError(f"the user CA key is unusable: {error}") from None


def sign_user_key(
    spec: CertificateSpec,
    public_key: ed25519.Ed25519PublicKey,
    *,
    now: float | None = None,
    valid_seconds: int | None = None,
) -> tuple[bytes, float, int]:
    """A user certificate for ``public_key`` with ``spec.principal`` as its only principal
    (and ``source-address`` when the spec has addresses), signed with the CA key file:
    (the certificate line, when it expires, its serial)."""
    if not spec.ca_key_path:
        raise SshConfigurationError(
            "this process does not read the user CA key (GANTRY_CA_KEY_ACCESS=signer)"
        )
    ca = _load_ca(spec.ca_key_path)
    started = int(time.time() if now is None else now)
    lifetime = spec.valid_seconds if valid_seconds is None else valid_seconds
    if lifetime < 1:
        raise ValueError("a certificate must be valid for at least one second")
    valid_before = started + lifetime
    serial = secrets.randbits(63)
    builder = (
        SSHCertificateBuilder()
        .public_key(public_key)
        .serial(serial)
        .type(SSHCertificateType.USER)
        .key_id(spec.key_id.encode())
        .valid_principals([spec.principal.encode()])
        .valid_after(max(0, started - CLOCK_SKEW_SECONDS))
        .valid_before(valid_before)
    )
    if spec.source_addresses:
        builder = builder.add_critical_option(
            b"source-address", ",".join(spec.source_addresses).encode()
        )
    return builder.sign(ca).public_bytes(), float(valid_before), serial


def check_signed(
    spec: CertificateSpec, public_key: ed25519.Ed25519PublicKey, line: str
) -> tuple[bytes, float, int]:
    """A certificate a signer returned, held to what was asked: a user certificate of
    ``public_key`` whose only principal is ``spec.principal``, with the spec's source
    addresses. (the certificate line, when it expires, its serial); SshConfigurationError
    otherwise."""
    try:
        certificate = serialization.load_ssh_public_identity(line.strip().encode())
    except (ValueError, UnsupportedAlgorithm) as error:
        raise SshConfigurationError(f"the signer returned no certificate: {error}") from None
    raw = (serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    certified = (
        certificate.public_key() if isinstance(certificate, serialization.SSHCertificate) else None
    )
    if (
        not isinstance(certificate, serialization.SSHCertificate)
        or certificate.type != SSHCertificateType.USER
        or not isinstance(certified, ed25519.Ed25519PublicKey)
        or certified.public_bytes(*raw) != public_key.public_bytes(*raw)
        or certificate.valid_principals != [spec.principal.encode()]
        or certificate.extensions
    ):
        raise SshConfigurationError(
            f"the signer's certificate is not a user certificate of this key for {spec.principal}"
        )
    wanted = ",".join(spec.source_addresses).encode()
    if certificate.critical_options.get(b"source-address", b"") != wanted:
        raise SshConfigurationError("the signer's certificate has other source addresses")
    return line.strip().encode(), float(certificate.valid_before), certificate.serial


def signed_key(
    spec: CertificateSpec, *, now: float | None = None, valid_seconds: int | None = None
) -> SignedKey:
    """A key made for one connection, with a fresh certificate for ``spec.principal``:
    signed here with the CA key file, or, with ``spec.signer``, by whoever holds it (which
    decides the validity: ``now`` and ``valid_seconds`` are for the CA key file only).

    The private half never leaves this process's memory."""
    try:
        key = ed25519.Ed25519PrivateKey.generate()
        if spec.signer is not None and not spec.ca_key_path:
            if now is not None or valid_seconds is not None:
                raise ValueError("the signer decides a certificate's validity")
            public = key.public_key().public_bytes(
                serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
            )
            answer = spec.signer(spec, public.decode())
            certificate, valid_before, serial = check_signed(spec, key.public_key(), answer)
        else:
            certificate, valid_before, serial = sign_user_key(
                spec, key.public_key(), now=now, valid_seconds=valid_seconds
            )
    except OSError as error:
        # Randomness for the key or the serial could not be had (no file descriptor left).
        raise local_file_error(f"cannot sign a certificate for {spec.principal}", error) from None
    private_text = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    pkey = paramiko.Ed25519Key.from_private_key(io.StringIO(private_text))
    pkey.load_certificate(certificate.decode())
    return SignedKey(key=pkey, valid_before=valid_before, serial=serial)
