"""One exception hierarchy for everything the Slurm adapter can fail with.

Every class carries ``transient``: ``True`` means "the same call may well succeed
if retried later" (a dropped link, a timeout, a busy controller), ``False`` means
"retrying will not help until a person changes something" (a refused host key,
a wrong user or key, Slurm missing, a rejected job, output we cannot read).
Celery tasks retry on ``TRANSIENT_ERRORS`` only.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Sequence


class SlurmError(Exception):
    """Base class of every error raised by ``slurm``."""

    transient: bool = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class SshError(SlurmError):
    """Something went wrong on the SSH link itself."""


class SshTransientError(SshError):
    """Connection refused, timed out, reset, EOF, channel closed: worth a retry."""

    transient = True


class SshOutcomeUnknown(SshTransientError):
    """The link failed after the command was sent: it may have run, or may still be
    running. Retrying a command that is not idempotent (``sbatch``) here could run it twice;
    the caller must find out what happened first."""


class SshCommandTimeout(SshOutcomeUnknown):
    """A remote command ran past its time limit; its channel was closed (the command may
    still be running on the login node)."""

    def __init__(self, message: str, *, argv: Sequence[str], timeout: float) -> None:
        super().__init__(message)
        self.argv = list(argv)
        self.timeout = timeout


class CommandOutputTooLarge(SshOutcomeUnknown):
    """A remote command printed more than the bytes Gantry keeps of it (``limit`` on
    ``stream``): reading stopped there, the channel was closed (the remote side gets EOF or
    SIGPIPE) and what it had printed was discarded, so no caller ever sees a truncated
    success. Its outcome is unknown like a timeout's (a flooding login file may still have
    let ``sbatch`` queue the job), but retrying will not help until the account's login files
    or the command change: not transient."""

    transient = False

    def __init__(self, message: str, *, argv: Sequence[str], stream: str, limit: int) -> None:
        super().__init__(message)
        self.argv = list(argv)
        self.stream = stream
        self.limit = limit


class LocalResourceUnavailable(SshTransientError):
    """Gantry's own side of a login failed for a reason that passes: one of its SSH files
    (the user CA, a private key, known_hosts) could not be read just now (an I/O error, too
    many open files, a stale NFS handle), or the name server did not answer. Nothing was
    sent to the cluster: worth a retry."""


class SshConfigurationError(SshError):
    """The SSH settings cannot work as given (unresolvable host, unreadable file)."""


class SshAuthenticationError(SshError):
    """The server refused our user/key, or the private key cannot be used."""


class HostKeyError(SshError):
    """The server's host key is not the pinned one. Never retried."""

    def __init__(
        self,
        message: str,
        *,
        host: str,
        port: int,
        key_type: str,
        fingerprint_seen: str,
        fingerprint_expected: str | None = None,
    ) -> None:
        super().__init__(message)
        self.host = host
        self.port = port
        self.key_type = key_type
        self.fingerprint_seen = fingerprint_seen
        self.fingerprint_expected = fingerprint_expected


class HostKeyUnknown(HostKeyError):
    """No pinned key for this host in our known_hosts file."""


class HostKeyMismatch(HostKeyError):
    """The host presented a key different from the pinned one."""


class SftpError(SshError):
    """An SFTP operation failed for a reason other than the link."""


class RemoteFileNotFound(SftpError):
    """The remote path does not exist."""

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class RemoteFileRefused(SlurmError):
    """A file read as evidence is not what evidence may be: not a regular file (a link, a
    device, a directory), or larger than the reader's bound. Says nothing about the
    connection: the caller records it against the object the file belongs to."""

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class SlurmCommandError(SlurmError):
    """A remote command exited non-zero."""

    def __init__(
        self,
        message: str,
        *,
        argv: Sequence[str],
        rc: int,
        stdout: str = "",
        stderr: str = "",
    ) -> None:
        super().__init__(message)
        self.argv = list(argv)
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr


class SlurmNotFound(SlurmCommandError):
    """The Slurm command is not installed (or not on PATH) on the login host."""


class SlurmPermissionDenied(SlurmCommandError):
    """Slurm refused the operation for this user (e.g. draining a node needs an
    operator/admin account: ``sacctmgr modify user <u> set AdminLevel=Operator``)."""


class SlurmControllerUnavailable(SlurmCommandError):
    """slurmctld/slurmdbd did not answer (down, restarting, overloaded): retry later."""

    transient = True


class SlurmParseError(SlurmError):
    """Output we could not make sense of; ``snippet`` shows the offending text."""

    def __init__(self, what: str, snippet: str, detail: str = "") -> None:
        shown = snippet if len(snippet) <= 200 else snippet[:200] + "…"
        message = f"cannot parse {what}: {shown!r}"
        if detail:
            message += f" ({detail})"
        super().__init__(message)
        self.what = what
        self.snippet = snippet
        self.detail = detail


# The only errors a task should retry.
TRANSIENT_ERRORS: tuple[type[SlurmError], ...] = (SshTransientError, SlurmControllerUnavailable)

# errno values of a local file operation that mean "not now" rather than "never": the
# device or the network file system hiccuped, a table of open files or memory is full, a
# call was interrupted, a lock is busy. Every other errno (ENOENT, EACCES, EISDIR, ELOOP,
# ...) says the file is missing or unusable as configured: a person has to act.
TRANSIENT_ERRNOS = frozenset(
    {
        errno.EIO,
        errno.EAGAIN,
        errno.EINTR,
        errno.EBUSY,
        errno.ENFILE,
        errno.EMFILE,
        errno.ENOMEM,
        errno.ENOBUFS,
        errno.ENOSPC,
        errno.ENOLCK,
        errno.ETIMEDOUT,
        errno.ESTALE,
    }
)

# getaddrinfo failures that pass: the name server did not answer (EAI_AGAIN, which is also
# what glibc returns for a SERVFAIL) or the resolver ran out of memory. The others are
# answers about the name itself (EAI_NONAME: no such name; EAI_NODATA/EAI_ADDRFAMILY: no
# address; EAI_FAIL: the server refused for good) or about our call (EAI_SERVICE,
# EAI_FAMILY): retrying changes nothing until someone fixes the host name or its record.
# (EAI_SYSTEM never arrives here: Python raises it as a plain OSError with its errno.)
TRANSIENT_RESOLVER_ERRORS = frozenset(
    code for code in (socket.EAI_AGAIN, getattr(socket, "EAI_MEMORY", None)) if code is not None
)


def local_file_error(what: str, error: OSError) -> SshError:
    """``error`` from reading or writing one of Gantry's own SSH files while ``what`` (in
    words), as one of our errors: ``LocalResourceUnavailable`` when its errno passes,
    else ``SshConfigurationError``."""
    if error.errno in TRANSIENT_ERRNOS:
        return LocalResourceUnavailable(f"{what}: {error} (a passing error: retried)")
    return SshConfigurationError(f"{what}: {error}")


def resolution_error(host: str, error: socket.gaierror) -> SshError:
    """A failed lookup of ``host``'s address, as one of our errors (see
    ``TRANSIENT_RESOLVER_ERRORS`` for which pass)."""
    if error.errno in TRANSIENT_RESOLVER_ERRORS:
        return LocalResourceUnavailable(
            f"cannot resolve host {host!r} for now: {error} (the name server did not answer; "
            "retried)"
        )
    return SshConfigurationError(f"cannot resolve host {host!r}: {error}")


def is_transient(error: BaseException) -> bool:
    """True when ``error`` is one of ours and worth retrying."""
    return isinstance(error, SlurmError) and error.transient


# stderr fragments that mean "the controller or the database did not answer".
_CONTROLLER_DOWN_MARKERS = (
    "unable to contact slurm controller",
    "socket timed out on send/recv operation",
    "zero bytes were transmitted or received",
    "slurm backup controller in standby mode",
    "slurmctld is not responding",
    "connection refused",
    "unable to connect to database",
    "slurmdbd: connection refused",
    "problem talking to the database",
)


# stderr fragments that mean "you are not allowed to do this".
_PERMISSION_MARKERS = (
    "invalid user id",
    "access/permission denied",
    "access denied",
    "permission denied",
    "user not authorized",
)


def command_error(argv: Sequence[str], rc: int, stdout: str, stderr: str) -> SlurmCommandError:
    """Classify a failed remote command into the most specific error class."""
    program = argv[0] if argv else "?"
    if program == "env":
        # ``env VAR=value prog ...``: name the real program in messages.
        program = next((part for part in argv[1:] if "=" not in part), program)
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    # Slurm often puts the cause on the last line ("Batch job submission failed: ...").
    first_line = " / ".join(lines[-3:])[:400]
    if rc in (126, 127) and ("not found" in stderr.lower() or rc == 127):
        return SlurmNotFound(
            f"{program!s} is not available on the cluster's login host "
            f"(exit {rc}: {first_line or 'command not found'}); is Slurm installed and on PATH?",
            argv=argv,
            rc=rc,
            stdout=stdout,
            stderr=stderr,
        )
    lowered = stderr.lower()
    if any(marker in lowered for marker in _CONTROLLER_DOWN_MARKERS):
        return SlurmControllerUnavailable(
            f"{program} could not reach the Slurm controller or database (exit {rc}): {first_line}",
            argv=argv,
            rc=rc,
            stdout=stdout,
            stderr=stderr,
        )
    if any(marker in lowered for marker in _PERMISSION_MARKERS):
        return SlurmPermissionDenied(
            f"{program} was refused by Slurm for this user (exit {rc}): {first_line}; "
            "the cluster account needs Slurm operator rights for this",
            argv=argv,
            rc=rc,
            stdout=stdout,
            stderr=stderr,
        )
    return SlurmCommandError(
        f"{program} failed (exit {rc}): {first_line or '(no error output)'}",
        argv=argv,
        rc=rc,
        stdout=stdout,
        stderr=stderr,
    )


def describe_cluster_error(error: BaseException) -> str:
    """A plain-words line for a page or an API error: what failed and what to check."""
    if isinstance(error, HostKeyError):
        return f"Host key refused: {error}"
    if isinstance(error, SshAuthenticationError):
        return f"SSH login refused: {error} (check the user and the private key)"
    if isinstance(error, SlurmNotFound):
        return f"Slurm is not installed or not on PATH on the login node: {error}"
    if isinstance(error, SlurmControllerUnavailable):
        return f"The Slurm controller does not answer: {error}"
    if isinstance(error, SlurmParseError):
        return f"Gantry could not read Slurm's output: {error}"
    if isinstance(error, SlurmCommandError):
        return f"A Slurm command failed: {error}"
    if isinstance(error, CommandOutputTooLarge):
        # Not "unreachable": the link works, the account's command or login files flood.
        return f"A command on the cluster printed too much: {error}"
    if isinstance(error, LocalResourceUnavailable):
        return f"Gantry could not set up the SSH login for now: {error}"
    if isinstance(error, SshTransientError):
        return f"Cluster unreachable: {error}"
    if isinstance(error, SlurmError):
        return str(error)
    return f"{type(error).__name__}: {error}"
