"""argv builders for the Slurm commands Gantry runs. Pure functions, no I/O.

Every builder returns a list of separate arguments; the transport joins them with
``shlex.join`` for the remote shell, so a value (a reason, a job name) is always
one literal argument and can never run a command. Identifiers that Slurm parses
itself (node names, job ids, partitions) are also checked against conservative
patterns here, and ``ValueError`` says why one is refused.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from slurm.parsers import (
    SACCT_TEXT_FIELDS,
    SINFO_TEXT_FORMAT,
    SQUEUE_START_FORMAT,
    SQUEUE_TEXT_FORMAT,
)

TAG_PREFIX = "gantry-"

_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HOSTLIST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\[\],-]{0,4095}$")
_JOB_ID = re.compile(r"^\d{1,10}(_\d{1,10})?$")
_PARTITION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}\$?$", re.IGNORECASE)
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_GRES = re.compile(
    r"^[A-Za-z0-9_]+(:[A-Za-z0-9_.-]+)?(:\d+)?(,[A-Za-z0-9_]+(:[A-Za-z0-9_.-]+)?(:\d+)?)*$"
)
_OPTION = re.compile(r"^--[a-z][a-z0-9-]*(=.*)?$", re.DOTALL)
# Options a caller may not pass through ``extra_options``: they would defeat the tag
# (idempotent submission) or change what runs.
_RESERVED_OPTIONS = ("--job-name", "--comment", "--parsable", "--wrap", "--array", "--hold")

# Make Slurm's text times unambiguous (epoch seconds) instead of the cluster's local time.
_EPOCH_TIMES = ["env", "SLURM_TIME_FORMAT=%s"]


def _check(pattern: re.Pattern[str], value: str, what: str) -> str:
    # fullmatch: "$" alone would accept a trailing newline.
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ValueError(f"invalid {what}: {value!r}")
    return value


def check_node_name(name: str) -> str:
    return _check(_NODE_NAME, name, "node name (letters, digits, '.', '_', '-')")


def check_job_id(job_id: str | int) -> str:
    return _check(_JOB_ID, str(job_id), "Slurm job id (digits, optionally _<task>)")


def check_partition(name: str) -> str:
    return _check(_PARTITION, name, "partition name")


def check_hostlist(expression: str) -> str:
    return _check(_HOSTLIST, expression, "node list expression")


def check_free_text(text: str, what: str, *, max_length: int = 1024) -> str:
    """Free text (a drain reason) travels as one argument; control characters would
    corrupt Slurm's one-line outputs, so they are refused."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{what} must not be empty")
    if len(text) > max_length:
        raise ValueError(f"{what} is longer than {max_length} characters")
    if any(ord(char) < 32 or ord(char) == 127 for char in text):
        raise ValueError(f"{what} must not contain control characters (newline, tab, ...)")
    return text


def job_tag(job_uuid: uuid.UUID | str) -> str:
    """The tag carried in a Gantry job's Slurm name and comment: ``gantry-<uuid hex>``."""
    return f"{TAG_PREFIX}{uuid.UUID(str(job_uuid)).hex}"


def check_tag(tag: str) -> str:
    return _check(_TAG, tag, "job tag (letters, digits, '.', '_', '-')")


def _job_ids(job_ids: Iterable[str | int]) -> list[str]:
    ids = [check_job_id(job_id) for job_id in job_ids]
    if not ids:
        raise ValueError("at least one job id is required")
    return ids


# ---------------------------------------------------------------- read-only


def version() -> list[str]:
    return ["sinfo", "-V"]


def show_config() -> list[str]:
    return ["scontrol", "show", "config"]


def ping() -> list[str]:
    return ["scontrol", "ping"]


def sinfo_json() -> list[str]:
    return ["sinfo", "--json"]


def sinfo_text() -> list[str]:
    return ["sinfo", "--Node", "--noheader", "--format", SINFO_TEXT_FORMAT]


def scontrol_show_nodes(node: str | None = None) -> list[str]:
    argv = ["scontrol", "--oneliner", "show", "node"]
    if node is not None:
        argv.append(check_node_name(node))
    return argv


def scontrol_show_topology() -> list[str]:
    return ["scontrol", "show", "topology"]


def scontrol_show_partitions() -> list[str]:
    return ["scontrol", "--oneliner", "show", "partition"]


def scontrol_show_job(job_id: str | int) -> list[str]:
    return [*_EPOCH_TIMES, "scontrol", "--oneliner", "show", "job", check_job_id(job_id)]


def squeue_json() -> list[str]:
    """All jobs as JSON. Slurm 22.05 ignores filters with --json: callers filter."""
    return ["squeue", "--all", "--json"]


def _names(name: str | None, names: Iterable[str] | None) -> list[str]:
    """``--name=a,b``: Slurm job names (Gantry's tags), each checked."""
    wanted = [check_tag(tag) for tag in ([name] if name is not None else []) + list(names or [])]
    return ["--name=" + ",".join(wanted)] if wanted else []


def squeue_text(
    job_ids: Iterable[str | int] | None = None,
    *,
    user: str | None = None,
    name: str | None = None,
    names: Iterable[str] | None = None,
) -> list[str]:
    """Jobs in the queue (all states Slurm still holds) as ``|``-separated lines."""
    argv = [*_EPOCH_TIMES, "squeue", "--all", "--noheader", "--states=all"]
    if job_ids is not None:
        argv.append("--jobs=" + ",".join(_job_ids(job_ids)))
    if user is not None:
        argv.append("--user=" + _check(_USER, user, "user name"))
    argv += _names(name, names)
    argv += ["--format", SQUEUE_TEXT_FORMAT]
    return argv


def squeue_start(partitions: Iterable[str] | None = None) -> list[str]:
    """Every pending job (of the given partitions) with the scheduler's expected start time
    and its priority, as ``|``-separated lines: one command for any number of jobs."""
    argv = [*_EPOCH_TIMES, "squeue", "--all", "--noheader", "--start", "--states=PENDING"]
    if partitions is not None:
        names = sorted({check_partition(name) for name in partitions})
        if not names:
            raise ValueError("at least one partition is required")
        argv.append("--partition=" + ",".join(names))
    return [*argv, "--format", SQUEUE_START_FORMAT]


def _since(start: datetime | None) -> list[str]:
    """``--starttime`` as a time relative to the login node's own clock: sacct reads an
    absolute time in the login node's local zone, which Gantry does not know (a UTC wall
    time sent to a login node west of UTC is in its future, and sacct refuses it). A naive
    ``start`` is taken as UTC."""
    if start is None:
        return []
    if start.tzinfo is None:
        start = start.replace(tzinfo=UTC)
    ago = max(0, math.ceil((datetime.now(UTC) - start).total_seconds()))
    return ["--starttime", f"now-{ago}seconds"]


def sacct_json(
    job_ids: Iterable[str | int] | None = None,
    *,
    name: str | None = None,
    start: datetime | None = None,
) -> list[str]:
    """Accounting records as JSON (filters are honoured by sacct, unlike squeue).

    With ``job_ids`` and no ``start``, sacct searches from the epoch; without
    job ids pass ``start`` (sacct's default is midnight today).
    """
    argv = ["sacct", "--json", "--allusers"]
    if job_ids is not None:
        argv.append("--jobs=" + ",".join(_job_ids(job_ids)))
    if name is not None:
        argv.append("--name=" + check_tag(name))
    return argv + _since(start)


def sacct_text(
    job_ids: Iterable[str | int] | None = None,
    *,
    name: str | None = None,
    names: Iterable[str] | None = None,
    start: datetime | None = None,
) -> list[str]:
    argv = [*_EPOCH_TIMES, "sacct", "--allusers", "--allocations", "--parsable2", "--noheader"]
    if job_ids is not None:
        argv.append("--jobs=" + ",".join(_job_ids(job_ids)))
    argv += _names(name, names)
    argv += _since(start)
    argv += ["--format=" + ",".join(SACCT_TEXT_FIELDS)]
    return argv


def accounting_check() -> list[str]:
    """A cheap sacct call that fails when accounting storage is disabled."""
    return ["sacct", "--noheader", "--parsable2", "--allocations", "--jobs=1", "--format=JobID"]


# ---------------------------------------------------------------- actions


def sbatch_parsable(
    script_path: str,
    *,
    tag: str,
    partition: str | None = None,
    nodes: int | None = None,
    ntasks_per_node: int | None = None,
    cpus_per_task: int | None = None,
    gpus_per_node: int | str | None = None,
    gres: str | None = None,
    memory_mb: int | None = None,
    time_limit_minutes: int | None = None,
    nodelist: Sequence[str] | str | None = None,
    exclude: Sequence[str] | str | None = None,
    switches: int | None = None,
    switches_wait_minutes: int | None = None,
    chdir: str | None = None,
    output: str | None = None,
    error: str | None = None,
    extra_options: Sequence[str] = (),
) -> list[str]:
    """``sbatch --parsable --job-name=<tag> --comment=<tag> [options] <script>``.

    The tag (``job_tag(uuid)``) in both name and comment is what lets a
    redelivered submit find the job it already created.
    """
    check_tag(tag)
    if not script_path or not script_path.startswith("/") or "\n" in script_path:
        raise ValueError(f"script path must be an absolute path: {script_path!r}")
    argv = ["sbatch", "--parsable", f"--job-name={tag}", f"--comment={tag}"]
    if partition is not None:
        argv.append(f"--partition={check_partition(partition)}")
    for option, value in (
        ("--nodes", nodes),
        ("--ntasks-per-node", ntasks_per_node),
        ("--cpus-per-task", cpus_per_task),
        ("--time", time_limit_minutes),
    ):
        if value is not None:
            argv.append(f"{option}={_positive(value, option)}")
    if memory_mb is not None:
        argv.append(f"--mem={_positive(memory_mb, '--mem')}M")
    if gpus_per_node is not None:
        # "2" or "a100:2".
        text = str(gpus_per_node)
        if not re.match(r"^([A-Za-z0-9_.-]+:)?\d+$", text):
            raise ValueError(f"invalid --gpus-per-node value: {text!r}")
        argv.append(f"--gpus-per-node={text}")
    if gres is not None:
        argv.append(f"--gres={_check(_GRES, gres, 'gres request')}")
    for option, hosts in (("--nodelist", nodelist), ("--exclude", exclude)):
        if hosts is None:
            continue
        if isinstance(hosts, str):
            expression = check_hostlist(hosts)
        else:
            expression = ",".join(check_node_name(host) for host in hosts)
        argv.append(f"{option}={expression}")
    if switches is not None:
        switches_value = f"{_positive(switches, '--switches')}"
        if switches_wait_minutes is not None:
            switches_value += f"@{_positive(switches_wait_minutes, '--switches wait')}"
        argv.append(f"--switches={switches_value}")
    for option, path in (("--chdir", chdir), ("--output", output), ("--error", error)):
        if path is not None:
            if not path or "\n" in path:
                raise ValueError(f"invalid {option} path: {path!r}")
            argv.append(f"{option}={path}")
    for option in extra_options:
        if not _OPTION.fullmatch(option) or "\n" in option:
            raise ValueError(f"extra sbatch options must look like --name[=value]: {option!r}")
        if option.split("=", 1)[0] in _RESERVED_OPTIONS:
            raise ValueError(f"{option.split('=', 1)[0]} cannot be passed as an extra option")
        argv.append(option)
    argv.append(script_path)
    return argv


def _positive(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return value


def scancel(job_id: str | int, *, signal: str | None = None) -> list[str]:
    argv = ["scancel"]
    if signal is not None:
        argv.append("--signal=" + _check(re.compile(r"^[A-Z0-9]{1,10}$"), signal, "signal"))
    argv.append(check_job_id(job_id))
    return argv


def job_hold(job_id: str | int) -> list[str]:
    """``scontrol hold <id>``: a pending job stays pending (priority 0) until released."""
    return ["scontrol", "hold", check_job_id(job_id)]


def job_release(job_id: str | int) -> list[str]:
    """``scontrol release <id>``: a held job may be scheduled again."""
    return ["scontrol", "release", check_job_id(job_id)]


NODE_STATES = ("drain", "resume", "undrain")


def node_update(node: str, state: str, reason: str | None = None) -> list[str]:
    """``scontrol update NodeName=<node> State=<DRAIN|RESUME|UNDRAIN> [Reason=<text>]``.

    Slurm requires a reason to drain; it is one argument, quoted by the transport.
    """
    if state not in NODE_STATES:
        raise ValueError(f"node state must be one of {', '.join(NODE_STATES)}, got {state!r}")
    argv = ["scontrol", "update", f"NodeName={check_hostlist(node)}", f"State={state.upper()}"]
    if state == "drain":
        if reason is None:
            raise ValueError("draining a node needs a reason")
        argv.append(f"Reason={check_free_text(reason, 'reason')}")
    elif reason is not None:
        argv.append(f"Reason={check_free_text(reason, 'reason')}")
    return argv
