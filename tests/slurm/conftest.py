"""Fixtures for the Slurm adapter tests: recorded outputs and the real dev cluster."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[3]


def recording_dirs() -> list[Path]:
    return sorted(path for path in DATA.glob("slurm-*") if path.is_dir())


class Recordings:
    """One Slurm version's recorded outputs (``tests/slurm/data/slurm-<version>``)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.version = folder.name.removeprefix("slurm-")

    def text(self, name: str) -> str:
        path = self.folder / name
        if not path.exists():
            pytest.skip(f"recording {name} not present for {self.folder.name}")
        return path.read_text()

    def job_ids(self) -> dict[str, str]:
        """``jobs.txt``: recorded job name -> Slurm job id."""
        ids: dict[str, str] = {}
        for line in self.text("jobs.txt").splitlines():
            name, sep, job_id = line.strip().partition("=")
            if sep:
                ids[name] = job_id
        return ids


@pytest.fixture(params=recording_dirs() or [None], ids=lambda p: p.name if p else "none")
def recorded(request: pytest.FixtureRequest) -> Recordings:
    """Recorded outputs of each Slurm version in turn."""
    if request.param is None:
        pytest.skip("no recorded Slurm outputs under tests/slurm/data")
    return Recordings(Path(request.param))


@pytest.fixture(scope="module")
def devcluster() -> Any:
    """The real dev cluster (brought up if needed), as tests/devcluster_support describes it."""
    if str(REPO / "tests") not in sys.path:
        sys.path.insert(0, str(REPO / "tests"))
    import devcluster_support

    return devcluster_support.ensure_up()


@pytest.fixture(scope="module")
def ssh_config(devcluster: Any) -> Any:
    from slurm.connect import SshConfig

    return SshConfig(
        host=devcluster.host,
        port=devcluster.port,
        user=devcluster.user,
        key_path=str(devcluster.key),
        known_hosts_path=str(devcluster.known_hosts),
        expected_fingerprint=devcluster.host_fingerprint,
        connect_timeout=5,
        command_timeout=30,
    )


@pytest.fixture
def transport(ssh_config: Any) -> Iterator[Any]:
    from slurm.transport import SshTransport

    with SshTransport(ssh_config) as connection:
        yield connection
