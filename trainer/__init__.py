"""Gantry's bundled trainer: ``python -m trainer <command>``. Imports torch, never Django."""

from __future__ import annotations

import hashlib
import os

__version__ = "0.1.0"

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


def source_digest() -> str:
    """sha256 over the package's .py files, sorted by relative path (path and bytes hashed)."""
    files = []
    for root, dirs, names in os.walk(_PKG_DIR):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for n in names:
            if n.endswith(".py"):
                full = os.path.join(root, n)
                files.append((os.path.relpath(full, _PKG_DIR).replace(os.sep, "/"), full))
    h = hashlib.sha256()
    for rel, full in sorted(files):
        with open(full, "rb") as fh:
            data = fh.read()
        h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()
