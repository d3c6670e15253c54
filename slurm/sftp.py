"""The SFTP half of ``SshTransport``: reads (whole, or from an offset), atomic writes,
stat/lstat, listing, ``mkdir -p`` with a mode, chmod, remove. Every operation runs on the
transport's one SFTP session, reconnecting once if the link was dead (SFTP operations are
idempotent: writes go to a temporary name, then rename)."""

from __future__ import annotations

import contextlib
import errno
import posixpath
import secrets
import socket
import stat as stat_module
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import paramiko

from slurm.connect import SshConfig
from slurm.errors import RemoteFileNotFound, RemoteFileRefused, SftpError

T = TypeVar("T")
# Bytes per SFTP read request (the protocol's customary largest).
_SFTP_READ = 32768


@dataclass(frozen=True)
class StatResult:
    path: str
    size: int
    mtime: float
    mode: int

    @property
    def is_dir(self) -> bool:
        return stat_module.S_ISDIR(self.mode)

    @property
    def is_link(self) -> bool:
        return stat_module.S_ISLNK(self.mode)

    @property
    def permissions(self) -> int:
        """The permission bits (with setuid/setgid/sticky), e.g. 0o700 or 0o1777."""
        return stat_module.S_IMODE(self.mode)


class SftpOperations:
    """Mixed into ``SshTransport``, which provides the link (``_with_link``), the session
    slot (``_sftp``) and the counters."""

    config: SshConfig
    _sftp: paramiko.SFTPClient | None
    sftp_operations: int
    bytes_read: int

    def _with_link(
        self, what: str, operation: Callable[[paramiko.SSHClient], T], *, retry: bool
    ) -> T:
        raise NotImplementedError

    def _sftp_call(self, what: str, path: str, operation: Callable[[paramiko.SFTPClient], T]) -> T:
        def run(client: paramiko.SSHClient) -> T:
            if self._sftp is None:
                self._sftp = client.open_sftp()
                channel = self._sftp.get_channel()
                if channel is not None:
                    channel.settimeout(self.config.command_timeout)
            self.sftp_operations += 1
            try:
                return operation(self._sftp)
            except FileNotFoundError as exc:
                raise RemoteFileNotFound(
                    f"{what}: {path} does not exist on {self.config.host}", path=path
                ) from exc
            except PermissionError as exc:
                raise SftpError(
                    f"{what}: permission denied on {path} (as {self.config.user})"
                ) from exc
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    raise RemoteFileNotFound(f"{what}: {path} does not exist", path=path) from exc
                if (
                    isinstance(exc, socket.timeout | TimeoutError | ConnectionError)
                    or exc.errno is None
                ):
                    # paramiko reports a dead SFTP channel as a bare OSError/EOFError.
                    self._sftp = None
                    raise
                raise SftpError(f"{what} {path} failed: {exc}") from exc
            except (EOFError, paramiko.SSHException):
                self._sftp = None
                raise

        # SFTP operations are idempotent (writes go to a temp name, then rename).
        return self._with_link(f"SFTP {what}", run, retry=True)

    def get_bytes(self, path: str, max_bytes: int | None = None) -> bytes:
        """The whole of ``path``, of at most ``max_bytes`` (default: the config's
        ``max_output_bytes``, the bound on a command's output): a larger file is refused
        (``RemoteFileRefused``) after reading at most ``max_bytes + 1`` bytes."""
        limit = self.config.max_output_bytes if max_bytes is None else max_bytes
        if limit <= 0:
            raise ValueError("max_bytes must be > 0")

        def read(sftp: paramiko.SFTPClient) -> bytes:
            with sftp.open(path, "rb") as handle:
                handle.prefetch(min(handle.stat().st_size or 0, limit + 1))
                data = handle.read(limit + 1)
            if len(data) > limit:
                raise RemoteFileRefused(f"{path} is larger than {limit} bytes", path=path)
            return data

        data = self._sftp_call("read", path, read)
        self.bytes_read += len(data)
        return data

    def read_bounded(self, path: str, max_bytes: int) -> bytes:
        """The whole of a file another account may have written, read as evidence: refused
        (``RemoteFileRefused``) unless it is a regular file, not a link, of at most
        ``max_bytes``; never more than ``max_bytes + 1`` bytes are read, whatever the file
        does meanwhile (a sparse or growing file, a link swapped in after the check)."""
        if max_bytes <= 0:
            raise ValueError("max_bytes must be > 0")

        def read(sftp: paramiko.SFTPClient) -> bytes:
            before = sftp.lstat(path)
            if not stat_module.S_ISREG(before.st_mode or 0):
                raise RemoteFileRefused(f"{path} is not a regular file", path=path)
            if (before.st_size or 0) > max_bytes:
                raise RemoteFileRefused(
                    f"{path} is {before.st_size} bytes, over the {max_bytes} read as evidence",
                    path=path,
                )
            with sftp.open(path, "rb") as handle:
                # What was opened, which a link swapped in after lstat would change.
                if not stat_module.S_ISREG(handle.stat().st_mode or 0):
                    raise RemoteFileRefused(f"{path} is not a regular file", path=path)
                chunks: list[bytes] = []
                remaining = max_bytes + 1
                while remaining > 0:
                    chunk = handle.read(min(remaining, 32768))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    remaining -= len(chunk)
            data = b"".join(chunks)
            if len(data) > max_bytes:
                raise RemoteFileRefused(
                    f"{path} grew past the {max_bytes} bytes read as evidence", path=path
                )
            return data

        data = self._sftp_call("read", path, read)
        self.bytes_read += len(data)
        return data

    def read_from(self, path: str, offset: int, max_bytes: int = 1 << 20) -> bytes:
        """Up to ``max_bytes`` from ``offset`` (b"" at or past the end): for log tailing."""
        if offset < 0 or max_bytes <= 0:
            raise ValueError("offset must be >= 0 and max_bytes > 0")

        def read(sftp: paramiko.SFTPClient) -> bytes:
            with sftp.open(path, "rb") as handle:
                # Every 32 KiB request of the range is sent before the first answer is
                # read (``readv``): one round trip per call, not one per 32 KiB. The size
                # bounds the ranges (a file that grows is read up to its size now).
                end = min(handle.stat().st_size or 0, offset + max_bytes)
                if end <= offset:
                    return b""
                ranges = [(at, min(_SFTP_READ, end - at)) for at in range(offset, end, _SFTP_READ)]
                return b"".join(handle.readv(ranges))

        data = self._sftp_call("read", path, read)
        self.bytes_read += len(data)
        return data

    def put_bytes(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Write ``data`` to ``path`` atomically: a temp file in the same directory, then rename."""
        directory, name = posixpath.split(path)
        temporary = posixpath.join(directory, f".{name}.tmp-{secrets.token_hex(6)}")

        def write(sftp: paramiko.SFTPClient) -> None:
            try:
                with sftp.open(temporary, "wb") as handle:
                    handle.set_pipelined(True)
                    handle.write(data)
                sftp.chmod(temporary, mode)
                sftp.posix_rename(temporary, path)
            except BaseException:
                # Best effort: do not leave temp files behind.
                with contextlib.suppress(Exception):
                    sftp.remove(temporary)
                raise

        self._sftp_call("write", path, write)

    def _stat(self, path: str, *, follow: bool) -> StatResult | None:
        def run(sftp: paramiko.SFTPClient) -> StatResult | None:
            try:
                attributes: Any = sftp.stat(path) if follow else sftp.lstat(path)
            except FileNotFoundError:
                return None
            return StatResult(
                path=path,
                size=attributes.st_size or 0,
                mtime=float(attributes.st_mtime or 0),
                mode=attributes.st_mode or 0,
            )

        return self._sftp_call("stat" if follow else "lstat", path, run)

    def stat(self, path: str) -> StatResult | None:
        """Size, mtime and mode of ``path``; None if it does not exist."""
        return self._stat(path, follow=True)

    def lstat(self, path: str) -> StatResult | None:
        """Like ``stat``, of a symbolic link itself rather than what it points to."""
        return self._stat(path, follow=False)

    def exists(self, path: str) -> bool:
        return self.stat(path) is not None

    def listdir(self, path: str) -> list[str]:
        return sorted(self._sftp_call("list", path, lambda sftp: sftp.listdir(path)))

    def chmod(self, path: str, mode: int) -> None:
        """Set ``path``'s permission bits; only its owner may (SftpError otherwise)."""
        self._sftp_call("chmod", path, lambda sftp: sftp.chmod(path, mode))

    def makedirs(self, path: str, mode: int = 0o755) -> None:
        """``mkdir -p`` over SFTP; directories it creates get ``mode`` (less the umask)."""

        def run(sftp: paramiko.SFTPClient) -> None:
            parts: list[str] = []
            current = path.rstrip("/") or "/"
            while current not in ("", "/"):
                try:
                    attributes = sftp.stat(current)
                except FileNotFoundError:
                    parts.append(current)
                    current = posixpath.dirname(current)
                    continue
                if not stat_module.S_ISDIR(attributes.st_mode or 0):
                    raise SftpError(f"{current} exists and is not a directory")
                break
            for directory in reversed(parts):
                try:
                    sftp.mkdir(directory, mode)
                except OSError:
                    # Someone else may have created it meanwhile.
                    if not stat_module.S_ISDIR(sftp.stat(directory).st_mode or 0):
                        raise

        self._sftp_call("mkdir", path, run)

    def remove(self, path: str) -> None:
        self._sftp_call("remove", path, lambda sftp: sftp.remove(path))
