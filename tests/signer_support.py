"""For tests of the web role (``GANTRY_CA_KEY_ACCESS=signer``): see every file this process
opens under a path (a Python audit hook: ``open``, ``io.open`` and ``os.open`` all raise the
``open`` event), and a signer that runs the worker's side in this process while the watch
looks away, for tests without a Celery worker."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.test import override_settings


class OpenWatch:
    """Paths opened under ``prefix`` while active, except while ``paused`` (the worker's
    side of a signer run in this process)."""

    def __init__(self, prefix: str | Path) -> None:
        self.prefix = str(prefix)
        self.opened: list[str] = []
        self.paused = False


_watches: list[OpenWatch] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "open" or not _watches or not args or isinstance(args[0], int):
        return
    try:
        path = os.path.abspath(os.fsdecode(args[0]))
    except (TypeError, ValueError):
        return
    for watch in _watches:
        if not watch.paused and path.startswith(watch.prefix):
            watch.opened.append(path)


# An audit hook cannot be removed: one for the whole test process, idle without watches.
sys.addaudithook(_audit)


@contextlib.contextmanager
def watching_opens(prefix: str | Path) -> Iterator[OpenWatch]:
    watch = OpenWatch(os.path.abspath(prefix))
    _watches.append(watch)
    try:
        yield watch
    finally:
        _watches.remove(watch)


def in_process_round_trip(watch: OpenWatch | None = None, calls: list[str] | None = None) -> Any:
    """A stand-in for ``nodes.access.signer_client.signer_round_trip``: the worker's task, run
    here (the watch paused: what the worker opens is not the web's)."""
    from controlplane.tasknames import USER_CA_ENSURE, USER_CERTIFICATE_SIGN
    from nodes.access.signer import user_ca_public_key, user_certificate_sign

    services = {USER_CERTIFICATE_SIGN: user_certificate_sign, USER_CA_ENSURE: user_ca_public_key}

    def round_trip(task_name: str, arguments: dict[str, Any]) -> Any:
        if calls is not None:
            calls.append(task_name)
        if watch is not None:
            watch.paused = True
        try:
            # A worker: it reads the CA key.
            with override_settings(CA_KEY_ACCESS="local"):
                return services[task_name](**arguments)
        finally:
            if watch is not None:
                watch.paused = False

    return round_trip
