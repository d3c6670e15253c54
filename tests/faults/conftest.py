"""The fault-injection suite: real worker, beat, Redis, Slurm and sshd, with faults.

Each test records a row; the table is printed at the end of the run. The number of trials
of the worker-kill test comes from GANTRY_FAULT_TRIALS (CI runs a short version; the full
run is `scripts/faults`, figures in bench/README.md).
"""

from __future__ import annotations

from typing import Any

import pytest

from fault_support import REPORT, FaultReport


@pytest.fixture
def fault_report() -> FaultReport:
    return REPORT


def pytest_collection_modifyitems(items: list[Any]) -> None:
    for item in items:
        if "tests/faults/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.faults)
    # The Redis test points this process's Celery app at a private Redis and back; run it
    # last, so no other test ever publishes through a connection pool it replaced.
    last = [item for item in items if "test_redis_restart" in item.name]
    for item in last:
        items.remove(item)
        items.append(item)
    # Recovery under real faults kills a slurmd and leaves nodes to come back: after the
    # other fault tests, which time their jobs against a cluster with every node in service.
    recovery = [item for item in items if "test_recovery_faults" in str(item.fspath)]
    for item in recovery:
        items.remove(item)
    faults = [i for i, item in enumerate(items) if "tests/faults/" in str(item.fspath)]
    at = (faults[-1] + 1) if faults else len(items)
    if last and at > items.index(last[0]):
        at = items.index(last[0])
    items[at:at] = recovery


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not REPORT.rows:
        return
    write = terminalreporter.write_line
    write("")
    write("fault-injection figures")
    header = (
        f"{'fault':<46} {'trials':>6} {'injected':>8} {'dupes':>5} {'lost':>4} {'wrong':>5}  notes"
    )
    write(header)
    write("-" * len(header))
    for row in REPORT.rows:
        write(
            f"{row.fault:<46} {row.trials:>6} {row.faults_injected:>8} {row.duplicates:>5} "
            f"{row.lost:>4} {row.wrong:>5}  {row.notes}"
        )
