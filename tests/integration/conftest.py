"""Integration tests: real services (the dev cluster's Slurm and sshd, ...).

The ``devcluster`` fixture brings the dev cluster up once per session
(idempotent: a few seconds when it already runs) and never tears it down.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from devcluster_support import DevCluster, ensure_up  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def devcluster() -> DevCluster:
    return ensure_up()
