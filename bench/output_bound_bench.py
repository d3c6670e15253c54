"""A process's memory while a remote command floods (issue 37, item 3): bounded by the
output bound, not by what the command prints.

    .venv/bin/python bench/output_bound_bench.py      # ~1 min;  --flood 2GiB (default);  --quick

Starts a throwaway OpenSSH server of its own on 127.0.0.1 (``tests/sshd_support.py``: its own
host key, client key and port, for the current user; no dev cluster) and, for each scenario,
a fresh Python process that connects a real ``SshTransport`` to it, runs one small command to
warm up, then the scenario's command, and reports how much its peak resident set size
(``ru_maxrss``) grew over the command. Scenarios, side by side in one run:

- **small**: ``echo`` (what any command costs);
- **stdout flood**: ``head -c FLOOD /dev/zero`` under the default bound (16 MiB) and under a
  bound of 64 MiB (the growth follows the bound);
- **stderr flood**: the same on stderr (its bound: 1 MiB);
- **login file flood**: a login file that prints ``yes`` forever before the command;
- **unbounded (before)**: a smaller flood with the bound lifted above it (``max_output``), as
  every command was before the bound: the growth follows the output.

Goal: under every bound, growth ≤ 2 × bound + 16 MiB, and the flood fails with
``CommandOutputTooLarge``. Not a test; nothing here runs in CI.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _benchlib as lib  # noqa: F401 (puts the repository and tests/ on sys.path)
from sshd_support import PrivateSshd, available

MIB = 1 << 20
DEFAULT_CAP = 16 * MIB
STDERR_CAP = 1 * MIB


def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower().removesuffix("ib").removesuffix("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def child(spec: dict[str, Any]) -> None:
    """One scenario in this fresh process: a JSON line of what it cost."""
    from sshd_support import PrivateSshd

    from slurm.errors import SlurmError
    from slurm.transport import SshTransport

    server = PrivateSshd(Path(spec["dir"]))
    server.port = spec["port"]
    config = server.config(
        max_output_bytes=spec["cap"], max_stderr_bytes=STDERR_CAP, command_timeout=120
    )
    argv, max_output = spec["argv"], spec["max_output"]
    with SshTransport(config) as transport:
        transport.exec(["echo", "warm"])
        # The login file from now on: the warm-up ran without it.
        server.set_login_file(spec["login"])
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.perf_counter()
        try:
            result = transport.exec(argv, max_output=max_output, check=False)
            outcome, kept = "returned", len(result.stdout) + len(result.stderr)
        except SlurmError as error:
            outcome, kept = type(error).__name__, 0
        seconds = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "growth": (after - before) * 1024,
                "outcome": outcome,
                "kept": kept,
                "seconds": seconds,
            }
        )
    )


def run_scenario(server: PrivateSshd, scenario: Scenario) -> dict[str, Any]:
    """The scenario's figures, from a fresh process (its peak RSS is its own)."""
    spec = {
        "port": server.port,
        "dir": str(server.dir),
        "argv": scenario.argv,
        "cap": scenario.cap,
        "max_output": scenario.max_output,
        "login": scenario.login,
    }
    command = [
        sys.executable,
        __file__,
        "--child",
        json.dumps(spec),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


@dataclass(frozen=True)
class Scenario:
    name: str
    argv: list[str]
    # What the command prints (None: without end) and the bound that applies (None: none).
    printed: int | None
    bound: int | None
    cap: int = DEFAULT_CAP
    max_output: int | None = None
    login: str = ""
    flood: bool = True


def scenarios(flood: int, unbounded: int) -> list[Scenario]:
    head = ["head", "-c", str(flood), "/dev/zero"]
    return [
        Scenario("small (echo)", ["echo", "hello"], 6, DEFAULT_CAP, flood=False),
        Scenario("stdout flood, default bound", head, flood, DEFAULT_CAP),
        Scenario("stdout flood, 64 MiB bound", head, flood, 64 * MIB, cap=64 * MIB),
        Scenario("stderr flood", ["sh", "-c", " ".join(head) + " >&2"], flood, STDERR_CAP),
        Scenario("login file flood (yes)", ["true"], None, DEFAULT_CAP, login="yes\n"),
        Scenario(
            "unbounded (before)",
            ["head", "-c", str(unbounded), "/dev/zero"],
            unbounded,
            None,
            max_output=2 * unbounded,
            flood=False,
        ),
    ]


def _mib(size: int | None, *, none: str) -> str:
    if size is None:
        return none
    return f"{size / MIB:g} MiB" if size >= MIB else f"{size} B"


def row(scenario: Scenario, answer: dict[str, Any]) -> tuple[str, bool]:
    """The scenario's line of the table, and whether it met the goal."""
    growth, printed, bound = int(answer["growth"]), scenario.printed, scenario.bound
    per_bound = f"{growth / bound:.2f}" if bound else "—"
    per_printed = f"{growth / printed:.3f}" if printed and printed >= MIB else "—"
    ok = not scenario.flood or (
        bound is not None
        and growth <= 2 * bound + 16 * MIB
        and answer["outcome"] == "CommandOutputTooLarge"
    )
    goal = ("MET" if ok else "NOT MET") if scenario.flood else ""
    line = (
        f"{scenario.name:30} {_mib(printed, none='endless'):>10} {_mib(bound, none='none'):>8} "
        f"{answer['outcome']:>22} {growth / MIB:>7.1f} MiB {per_bound:>7} {per_printed:>9} "
        f"{answer['seconds']:>6.2f}  {goal}"
    )
    return line, ok


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--flood", default="2GiB", help="bytes the flooding commands print")
    parser.add_argument("--unbounded", default="256MiB", help="the unbounded reference's output")
    parser.add_argument("--quick", action="store_true", help="--flood 256MiB --unbounded 64MiB")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return 0
    if args.quick:
        args.flood, args.unbounded = "256MiB", "64MiB"
    if why := available():
        print(f"cannot start a private sshd: {why}")
        return 2
    server = PrivateSshd(Path(tempfile.mkdtemp(prefix="gantry-output-bound-"))).start()
    print(f"private sshd on 127.0.0.1:{server.port}; one fresh process per scenario")
    print(
        f"{'scenario':30} {'printed':>10} {'bound':>8} {'outcome':>22} {'RSS growth':>11} "
        f"{'/bound':>7} {'/printed':>9} {'s':>6}  goal"
    )
    met = True
    try:
        for scenario in scenarios(_size(args.flood), _size(args.unbounded)):
            answer = run_scenario(server, scenario)
            server.set_login_file("")
            line, ok = row(scenario, answer)
            met = met and ok
            print(line)
    finally:
        server.close()
    verdict = "MET" if met else "NOT MET"
    print(f"goal (each bounded flood: growth <= 2 x bound + 16 MiB, failed, with why): {verdict}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
