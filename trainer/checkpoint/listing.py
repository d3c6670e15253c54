"""Which checkpoints a directory holds, and retention."""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass

from .layout import MANIFEST, STEP_RE


@dataclass
class Entry:
    step: int
    path: str
    complete: bool


def list_checkpoints(root: str) -> list[Entry]:
    """All ``step-*`` directories under root, oldest first; complete = has manifest.json."""
    out: list[Entry] = []
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return out
    for name in names:
        m = STEP_RE.match(name)
        path = os.path.join(root, name)
        if m and os.path.isdir(path):
            out.append(Entry(int(m.group(1)), path, os.path.isfile(os.path.join(path, MANIFEST))))
    out.sort(key=lambda e: e.step)
    return out


def complete_checkpoints(root: str) -> list[Entry]:
    return [e for e in list_checkpoints(root) if e.complete]


def apply_retention(root: str, keep: int) -> list[str]:
    """Keep the newest ``keep`` complete checkpoints (never the newest one); remove older
    complete ones and incomplete directories older than the newest complete checkpoint."""
    entries = list_checkpoints(root)
    complete = [e for e in entries if e.complete]
    if not complete:
        return []
    newest = complete[-1].step
    keep_steps = {e.step for e in complete[-max(1, keep) :]}
    removed: list[str] = []
    for e in entries:
        if e.step in keep_steps or e.step >= newest:
            continue
        if e.complete:
            # drop the manifest first so a crash mid-delete leaves an incomplete dir, not a
            # "complete" checkpoint with missing files
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(e.path, MANIFEST))
        shutil.rmtree(e.path, ignore_errors=True)
        removed.append(e.path)
    return removed
