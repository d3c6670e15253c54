"""Collecting the health-check hook's probe files: one remote command per cluster, the
answer checked, hostile outputs (oversized, links, unknown nodes, odd names, stale files,
a forged node name) failing closed, the cost on the source, an audit event when nodes'
health changed."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import health.collect
from core.models import AuditEvent
from factories import ClusterFactory, GpuFactory, NodeFactory
from health.collect import PROGRAM, ProbeFilesError, parse_answer
from health.collection import health_collect
from health.models import GpuHealth, HealthEvent, HealthSource, NodeHealth, NodeProbe
from health.services import STALE_REASON
from nodes.models import Cluster, Node
from slurm.errors import SshTransientError
from slurm.transport import ExecResult

pytestmark = pytest.mark.django_db
NOW = datetime(2030, 5, 6, 12, 0, tzinfo=UTC)
Document = Callable[..., dict[str, Any]]


class FakeTransport:
    """The service account's login: answers a recorded listing, records what was run."""

    def __init__(self, stdout: str = "", error: Exception | None = None) -> None:
        self.stdout = stdout
        self.error = error
        self.calls: list[tuple[list[str], dict[str, Any]]] = []

    def exec(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        check: bool = True,
    ) -> ExecResult:
        self.calls.append((list(argv), json.loads(stdin or b"{}")))
        if self.error is not None:
            raise self.error
        return ExecResult(argv=list(argv), rc=0, stdout=self.stdout, stderr="")


def entry(name: str, document: Any = None, *, age: float = 5.0, **extra: Any) -> dict[str, Any]:
    found: dict[str, Any] = {"name": name, "mtime": 1000.0 - age, "size": 10, "key": f"{name}:1"}
    found["key"] = f"{abs(hash((name, age))) % 10**9}:10"
    if document is not None:
        found["data"] = base64.b64encode(json.dumps(document).encode()).decode()
    found.update(extra)
    return found


def answer(*entries: dict[str, Any], **extra: Any) -> str:
    return json.dumps({"v": 1, "now": 1000.0, "files": list(entries), **extra})


def for_node(document: Document, node: str, smi: str = "derived/a100-2gpu-healthy.xml") -> Any:
    found = document(smi)
    found["node"] = node
    return found


@pytest.fixture
def cluster() -> Cluster:
    cluster = ClusterFactory(name="c1", python="/opt/py/bin/python")
    for name in ("n1", "n2", "n3"):
        node = NodeFactory(cluster=cluster, name=name)
        GpuFactory(node=node, index=0)
        GpuFactory(node=node, index=1)
    HealthSource.objects.create(cluster=cluster, directory="/var/lib/gantry/health")
    return cluster


def health_of(cluster: Cluster, name: str) -> NodeHealth:
    return NodeHealth.objects.get(node__cluster=cluster, node__name=name)


def test_one_command_reads_every_file_and_records_known_nodes(
    cluster: Cluster, document: Document
) -> None:
    transport = FakeTransport(
        answer(
            entry("n1.json", for_node(document, "n1")),
            entry("n2.json", for_node(document, "n2", "derived/a100-ecc-uncorrectable.xml")),
            # A node the inventory does not have, and names no hook writes.
            entry("ghost.json", for_node(document, "ghost")),
            entry("../n3.json", for_node(document, "n3")),
            entry("n3;reboot.json", for_node(document, "n3")),
            entry("n\u00e93.json", for_node(document, "n3")),
            ignored=2,
        )
    )
    result = health_collect(cluster_id=cluster.pk, transport=transport, now=NOW)

    assert result is not None and result.ok and result.commands == 1
    assert len(transport.calls) == 1
    argv, request = transport.calls[0]
    # A fixed program, isolated; the directory travels as data on stdin, never in a shell.
    assert argv == ["/opt/py/bin/python", "-I", "-S", "-c", PROGRAM]
    assert request["directory"] == "/var/lib/gantry/health" and request["known"] == {}
    assert (health_of(cluster, "n1").state, health_of(cluster, "n2").state) == ("ok", "critical")
    # n3 got nothing: never probed, still unknown and without a verdict row.
    assert not NodeHealth.objects.filter(node__name="n3").exists()
    assert Node.objects.get(cluster=cluster, name="n3").health_state == "unknown"
    assert not Node.objects.filter(name="ghost").exists()
    assert result.counts == {
        "recorded": 2,
        "unknown_node": 1,
        "ignored": 5,
        "over_limit": 0,
    }
    source = HealthSource.objects.get(cluster=cluster)
    assert (source.last_commands, source.last_error, source.last_collected_at) == (1, "", NOW)
    assert source.last_bytes == len(transport.stdout) and source.last_seconds >= 0
    assert source.last_counts["recorded"] == 2
    assert source.next_collect_at == NOW + timedelta(seconds=60)
    assert set(source.seen) == {"n1.json", "n2.json"}
    audit = AuditEvent.objects.get(action="health.collect")
    assert audit.actor_name == "system" and audit.target_id == str(source.pk)
    assert {(c["node"], c["to"]) for c in audit.details["changes"]} == {
        ("n1", "ok"),
        ("n2", "critical"),
    }
    assert audit.details["commands"] == 1 and audit.details["bytes"] == len(transport.stdout)


def test_unchanged_files_are_not_sent_or_recorded_again(
    cluster: Cluster, document: Document
) -> None:
    first = entry("n1.json", for_node(document, "n1"))
    health_collect(cluster_id=cluster.pk, transport=FakeTransport(answer(first)), now=NOW)
    again = FakeTransport(answer({**entry("n1.json", unchanged=True), "key": first["key"]}))
    later = NOW + timedelta(seconds=60)
    result = health_collect(cluster_id=cluster.pk, transport=again, now=later)

    assert again.calls[0][1]["known"] == {"n1.json": first["key"]}
    assert result is not None and result.counts["unchanged"] == 1
    assert NodeProbe.objects.filter(node__name="n1").count() == 1
    # Nothing changed: no second audit event.
    assert AuditEvent.objects.filter(action="health.collect").count() == 1


def test_refused_oversized_forged_and_unreadable_files_make_nodes_unknown(
    cluster: Cluster, document: Document
) -> None:
    healthy = FakeTransport(
        answer(*(entry(f"{n}.json", for_node(document, n)) for n in ("n1", "n2", "n3")))
    )
    health_collect(cluster_id=cluster.pk, transport=healthy, now=NOW)
    assert {health_of(cluster, n).state for n in ("n1", "n2", "n3")} == {"ok"}

    hostile = FakeTransport(
        answer(
            entry("n1.json", code="refused", error="cannot open: a link", age=1),
            entry("n2.json", code="too_large", error="9000000 bytes (at most 8388608)", age=1),
            # n3's file claims to be n1's probe.
            entry("n3.json", for_node(document, "n1", "derived/a100-ecc-uncorrectable.xml"), age=1),
        )
    )
    later = NOW + timedelta(seconds=60)
    result = health_collect(cluster_id=cluster.pk, transport=hostile, now=later)

    assert result is not None and result.counts["refused"] == 2
    n1, n2, n3 = (health_of(cluster, n) for n in ("n1", "n2", "n3"))
    assert (n1.state, n1.reasons) == ("unknown", ["probe file refused: cannot open: a link"])
    assert n2.state == "unknown" and "9000000 bytes" in n2.reasons[0]
    assert n3.state == "unknown" and n3.reasons == ["probe file names 'n1', not 'n3'"]
    # The forged "critical" probe was not recorded against either node.
    assert NodeProbe.objects.filter(node__name="n3").count() == 1
    assert Node.objects.get(cluster=cluster, name="n1").health_state == "unknown"
    assert set(GpuHealth.objects.filter(node__name="n1").values_list("state", flat=True)) == {
        "unknown"
    }
    assert HealthEvent.objects.filter(
        node__name="n1", gpu_index=None, from_state="ok", to_state="unknown"
    ).exists()

    broken = FakeTransport(answer(entry("n1.json", age=1, data=base64.b64encode(b"{").decode())))
    health_collect(cluster_id=cluster.pk, transport=broken, now=later + timedelta(seconds=60))
    assert health_of(cluster, "n1").reasons == ["probe file is not JSON"]


def test_stale_files_and_missing_files_fail_closed(cluster: Cluster, document: Document) -> None:
    fresh = FakeTransport(
        answer(*(entry(f"{n}.json", for_node(document, n)) for n in ("n1", "n2", "n3")))
    )
    health_collect(cluster_id=cluster.pk, transport=fresh, now=NOW)
    # Ten minutes later: n1's file was not rewritten (600 s > 3 x 60 s); n2's file is gone;
    # n3 is fresh.
    later = NOW + timedelta(minutes=10)
    stale = FakeTransport(
        answer(
            entry("n1.json", for_node(document, "n1"), age=600),
            entry("n3.json", for_node(document, "n3"), age=10),
        )
    )
    result = health_collect(cluster_id=cluster.pk, transport=stale, now=later)

    assert result is not None and result.counts["stale"] == 2
    for name in ("n1", "n2"):
        health = health_of(cluster, name)
        assert health.state == "unknown" and health.reasons[0] == STALE_REASON
        assert Node.objects.get(cluster=cluster, name=name).health_state == "unknown"
    assert health_of(cluster, "n3").state == "ok"
    # The stale probe's content was not recorded as new.
    assert NodeProbe.objects.filter(node__name="n1").count() == 1
    # Again: nothing more changes, no more events.
    events = HealthEvent.objects.count()
    health_collect(cluster_id=cluster.pk, transport=stale, now=later + timedelta(seconds=60))
    assert HealthEvent.objects.count() == events


def test_a_failed_collection_is_recorded_and_nodes_go_stale(
    cluster: Cluster, document: Document
) -> None:
    fresh = FakeTransport(answer(entry("n1.json", for_node(document, "n1"))))
    health_collect(cluster_id=cluster.pk, transport=fresh, now=NOW)
    down = FakeTransport(error=SshTransientError("connection refused"))
    result = health_collect(cluster_id=cluster.pk, transport=down, now=NOW + timedelta(seconds=60))
    assert result is not None and not result.ok
    source = HealthSource.objects.get(cluster=cluster)
    assert "connection refused" in source.last_error and source.last_collected_at == NOW
    assert health_of(cluster, "n1").state == "ok"
    # Still down after three intervals: the node is no longer vouched for.
    health_collect(cluster_id=cluster.pk, transport=down, now=NOW + timedelta(seconds=200))
    assert health_of(cluster, "n1").reasons[0] == STALE_REASON


@pytest.mark.parametrize(
    ("stdout", "why"),
    [
        ("not json", "not JSON"),
        (json.dumps({"v": 2, "now": 1, "files": []}), "version 1"),
        (json.dumps({"v": 1, "files": []}), "no clock"),
        (json.dumps({"v": 1, "error": "x", "code": "absent", "now": 1}), "absent: x"),
        (json.dumps({"v": 1, "error": "x", "code": "boom", "now": 1}), "unknown code"),
        (answer({"name": "n1.json", "mtime": 1, "data": "!!"}), "not base64"),
        (answer({"name": "n1.json", "mtime": 1, "code": "weird", "error": "x"}), "unknown code"),
    ],
)
def test_a_malformed_answer_is_refused_whole(stdout: str, why: str) -> None:
    with pytest.raises(ProbeFilesError, match=why):
        parse_answer(stdout)


def test_an_oversized_answer_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health.collect, "BUDGET_BYTES", 1000)
    monkeypatch.setattr(health.collect, "MAX_FILES", 2)
    with pytest.raises(ProbeFilesError, match="answered"):
        parse_answer(answer(entry("n1.json", data="A" * 8000)))
    monkeypatch.undo()
    with pytest.raises(ProbeFilesError, match="longer than asked"):
        parse_answer(answer(entry("n1.json", data="A" * (12 << 20))))


def test_a_bad_answer_is_recorded_as_the_collection_error(cluster: Cluster) -> None:
    result = health_collect(cluster_id=cluster.pk, transport=FakeTransport("<html>"), now=NOW)
    assert result is not None and not result.ok
    assert "not JSON" in HealthSource.objects.get(cluster=cluster).last_error


def test_a_disabled_source_collects_nothing(cluster: Cluster) -> None:
    HealthSource.objects.filter(cluster=cluster).update(enabled=False)
    transport = FakeTransport(answer())
    assert health_collect(cluster_id=cluster.pk, transport=transport, now=NOW) is None
    assert transport.calls == []


# The remote program itself, on a real directory (as this user: it accepts files of root
# and of the account running it).


def run_program(directory: Path, known: dict[str, str] | None = None) -> Any:
    request = health.collect.request_for(str(directory), known or {})
    done = subprocess.run(
        ["python3", "-I", "-S", "-c", PROGRAM],
        input=json.dumps(request).encode(),
        capture_output=True,
        timeout=30,
        check=True,
    )
    return parse_answer(done.stdout.decode())


def test_the_program_refuses_links_fifos_and_big_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(health.collect, "MAX_FILE_BYTES", 100)
    directory = tmp_path / "health"
    directory.mkdir(mode=0o755)
    (directory / "n1.json").write_text('{"node": "n1"}')
    (directory / "n2.json").symlink_to("/etc/passwd")
    os.mkfifo(directory / "n3.json")
    (directory / "n4.json").write_text("x" * 101)
    (directory / ".n5.json.tmp123").write_text("partial")
    (directory / "n6;x.json").write_text("{}")
    os.link(directory / "n1.json", tmp_path / "other-link")

    found = run_program(directory)
    # n1 has a second hard link now: refused too.
    assert found.files["n1"].code == "refused" and "links" in found.files["n1"].error
    assert found.files["n2"].code == "refused" and "link" in found.files["n2"].error
    assert found.files["n3"].code == "refused" and "regular" in found.files["n3"].error
    assert found.files["n4"].code == "too_large"
    assert set(found.files) == {"n1", "n2", "n3", "n4"} and found.ignored == 1

    (tmp_path / "other-link").unlink()
    found = run_program(directory)
    assert found.files["n1"].data == b'{"node": "n1"}' and found.files["n1"].age_s is not None
    again = run_program(directory, {"n1.json": found.files["n1"].key})
    assert again.files["n1"].unchanged and again.files["n1"].data is None

    directory.chmod(0o777)
    with pytest.raises(ProbeFilesError, match="writable by others"):
        run_program(directory)
    with pytest.raises(ProbeFilesError, match="absent"):
        run_program(tmp_path / "nowhere")
