"""Trainer versions: every version Gantry ships is kept, content-addressed, so that a drill
can run the version that wrote a checkpoint.

On the cluster each version lives in ``<workdir>/trainer/<digest[:20]>`` (``runs.runtime``);
Gantry also keeps an archive of each version it shipped in ``GANTRY_DATA_DIR/trainers/
<digest>.zip``, from which a version is shipped again when the cluster's copy is gone.
The digest is ``trainer.source_digest()``: sha256 over the package's ``.py`` files.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import zipfile
from pathlib import Path

from django.conf import settings

import trainer
from runs.runtime import FileTransport, trainer_dir, trainer_ensure_uploaded, trainer_upload

DIGEST_LENGTH = 64


class TrainerUnavailable(Exception):
    """Neither the cluster nor Gantry holds this trainer version any more."""


def archive_dir() -> Path:
    return Path(settings.DATA_DIR) / "trainers"


def archive_path(digest: str) -> Path:
    if len(digest) != DIGEST_LENGTH or any(c not in "0123456789abcdef" for c in digest):
        raise TrainerUnavailable(f"{digest[:80]!r} is not a trainer version digest")
    return archive_dir() / f"{digest}.zip"


def _digest_of(files: list[tuple[str, bytes]]) -> str:
    """``trainer.source_digest`` over files held in memory."""
    h = hashlib.sha256()
    for relative, data in sorted(f for f in files if f[0].endswith(".py")):
        h.update(relative.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()


def archive_current() -> str:
    """Keep the current trainer's files under its digest (once); returns the digest."""
    from runs.runtime import trainer_files

    digest = trainer.source_digest()
    path = archive_path(digest)
    if path.exists():
        return digest
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for relative, data in trainer_files():
            archive.writestr(relative, data)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".trainer-")
    with os.fdopen(fd, "wb") as fh:
        fh.write(buffer.getvalue())
    os.replace(temp, path)
    return digest


def archived_files(digest: str) -> list[tuple[str, bytes]]:
    """The files of an archived version, checked against its digest."""
    path = archive_path(digest)
    if not path.exists():
        raise TrainerUnavailable(f"Gantry keeps no copy of trainer version {digest[:12]}")
    try:
        with zipfile.ZipFile(path) as archive:
            files = [(name, archive.read(name)) for name in archive.namelist()]
    except (OSError, zipfile.BadZipFile) as error:
        raise TrainerUnavailable(
            f"the archive of trainer {digest[:12]} is unreadable: {error}"
        ) from None
    if _digest_of(files) != digest:
        raise TrainerUnavailable(f"the archive of trainer {digest[:12]} does not match its digest")
    return files


def trainer_version_ensure(transport: FileTransport, workdir: str, digest: str) -> str:
    """The directory to put on PYTHONPATH for trainer version ``digest`` on this cluster:
    already there (its ``.complete`` marker, written last, exists), or shipped again from
    Gantry's archive. Raises ``TrainerUnavailable`` when neither holds it."""
    if digest == trainer.source_digest():
        archive_current()
        return trainer_ensure_uploaded(transport, workdir)
    target = trainer_dir(workdir, digest)
    files = archived_files(digest) if not transport.exists(f"{target}/.complete") else None
    if files is None:
        return target
    return trainer_upload(transport, target, files, digest)
