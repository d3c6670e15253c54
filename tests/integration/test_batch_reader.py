"""The batched run-directory reader on the dev cluster, over real SSH: a researcher's area
prepared as Gantry prepares it (as the researcher: 0700, the service account's grant), a
run directory made and granted as at submission, files written as the researcher; then
the service account lists and reads them in one command, another researcher still cannot
read them, and a directory whose grant its owner removed falls back to the owner's login.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from nodes.access.cluster import transport_as, transport_for
from nodes.models import Cluster
from runs.rundir import RunDirectories
from runs.rundir_batch import BatchReader, FileRequest
from runs.runtime import run_dir, service_read_grant, user_area_ensure

pytestmark = pytest.mark.django_db(transaction=True)

OWNER, OTHER = "alice", "bob"
METRICS = b'{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n'


def _run_directory(cluster: Cluster, job_id: str) -> str:
    """As Gantry's submission does it, with a few of the trainer's files."""
    own = transport_as(cluster, OWNER)
    area = user_area_ensure(
        transport_for(cluster), own, cluster.workdir, OWNER, service_account=cluster.ssh_user
    )
    directory = run_dir(cluster.workdir, job_id, OWNER)
    own.makedirs(directory, mode=0o700)
    assert service_read_grant(own, area=area, directory=directory, service_account=cluster.ssh_user)
    own.put_bytes(f"{directory}/metrics.jsonl", METRICS)
    own.makedirs(f"{directory}/checkpoints/step-000002", mode=0o755)
    own.put_bytes(f"{directory}/checkpoints/step-000002/manifest.json", b"{}")
    return directory


@pytest.mark.nodes(0)
def test_the_service_account_reads_every_area_in_one_command(
    dev_cluster_registered: Cluster,
) -> None:
    cluster = dev_cluster_registered
    job_id = f"batch-reader-{uuid.uuid4().hex[:8]}"
    directory = _run_directory(cluster, job_id)
    own = transport_as(cluster, OWNER)
    try:
        service = transport_for(cluster)
        batch = BatchReader(
            service,
            workdir=cluster.workdir,
            service_account=cluster.ssh_user,
            python=cluster.python,
        )
        listing = RunDirectories(batch=batch)
        missing = run_dir(cluster.workdir, "never-made", OTHER)
        owners: dict[str, Any] = {
            directory: lambda: transport_as(cluster, OWNER),
            missing: lambda: transport_as(cluster, OTHER),
        }
        errors: list[str] = []
        found = listing.look(list(owners.items()), errors)
        assert not errors and listing.commands == 1 and listing.fallbacks == 0
        assert found[directory].metrics_size == len(METRICS)
        assert found[directory].manifests == [f"{directory}/checkpoints/step-000002/manifest.json"]
        reads = listing.read({directory: [FileRequest("metrics.jsonl", 100, offset=25)]})
        assert reads[directory]["metrics.jsonl"].data == METRICS[25:]
        assert listing.commands == 2

        # Another researcher still reads nothing of it.
        peek = transport_as(cluster, OTHER).exec(["cat", f"{directory}/metrics.jsonl"], check=False)
        assert peek.rc != 0 and METRICS.decode() not in peek.stdout

        # The owner removes the grant: that directory is listed as the owner again.
        assert own.exec(["setfacl", "-b", directory], check=False).rc == 0
        listing = RunDirectories(batch=batch)
        found = listing.look([(directory, owners[directory])], errors)
        assert not errors and listing.fallbacks == 1
        assert found[directory].metrics_size == len(METRICS)
    finally:
        own.exec(["rm", "-rf", "--", directory], check=False)
