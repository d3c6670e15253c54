"""Jobs: squeue and sacct (JSON and text), scontrol show job."""

from __future__ import annotations

import json
from typing import Any

from slurm.hostlist import expand
from slurm.parsers.common import (
    as_dict,
    as_text,
    guarded,
    load_json,
    normalise_job_state,
    parse_kv_records,
)
from slurm.parsers.inventory import kv_time, split_fields
from slurm.parsers.models import FINAL_JOB_STATES, SlurmJob
from slurm.units import (
    json_number,
    parse_gres,
    parse_slurm_time,
    parse_timestamp,
    parse_tres,
    tres_gpu_count,
)

# ---------------------------------------------------------------- jobs


def _exit_from_wait_status(value: Any) -> tuple[int | None, int | None]:
    """squeue's raw wait status -> (exit code, signal)."""
    number = json_number(value)
    if number is None:
        return None, None
    return (number >> 8) & 0xFF, (number & 0x7F) or None


def _exit_from_json_object(value: Any) -> tuple[int | None, int | None]:
    """sacct's ``{"status": ..., "return_code": n, "signal": {"signal_id": s}}``."""
    if not isinstance(value, dict):
        return _exit_from_wait_status(value)
    return_code = json_number(value.get("return_code"))
    signal_info = value.get("signal")
    signal = json_number(signal_info.get("signal_id")) if isinstance(signal_info, dict) else None
    status = value.get("status")
    statuses = status if isinstance(status, list) else [status]
    if not signal and any(str(item).upper() == "SIGNALED" for item in statuses) and return_code:
        # Older shapes put the signal number in return_code for SIGNALED.
        signal, return_code = return_code, None
    return return_code, signal or None


def _gpus_per_node(tres_per_node: str | None) -> int | None:
    entries = [entry for entry in parse_gres(tres_per_node) if entry.is_gpu]
    return sum(entry.count for entry in entries) if entries else None


def _job_from_squeue_json(item: dict[str, Any]) -> SlurmJob:
    job_id = json_number(item.get("job_id"))
    if job_id is None:
        raise ValueError("job without job_id")
    array_task = json_number(item.get("array_task_id"))
    array_job = json_number(item.get("array_job_id"))
    shown_id = f"{array_job}_{array_task}" if array_job and array_task is not None else str(job_id)
    state, _flags = normalise_job_state(item.get("job_state"))
    node_expr = as_text(item.get("nodes")) or ""
    tres = parse_tres(as_text(item.get("tres_alloc_str")))
    exit_code, signal = (None, None)
    if state in FINAL_JOB_STATES:
        exit_code, signal = _exit_from_json_object(item.get("exit_code"))
    return SlurmJob(
        job_id=shown_id,
        name=as_text(item.get("name")),
        comment=as_text(item.get("comment")),
        state=state,
        reason=as_text(item.get("state_reason")),
        nodes=tuple(expand(node_expr)),
        node_list_expr=node_expr,
        partition=as_text(item.get("partition")),
        user=as_text(item.get("user_name")),
        account=as_text(item.get("account")),
        submit_time=parse_timestamp(item.get("submit_time")),
        # For pending jobs Slurm gives an estimate, for running ones the limit: drop them.
        start_time=parse_timestamp(item.get("start_time")) if state != "PENDING" else None,
        end_time=parse_timestamp(item.get("end_time")) if state in FINAL_JOB_STATES else None,
        time_limit_minutes=json_number(item.get("time_limit")),
        exit_code=exit_code,
        signal=signal,
        alloc_tres=tres,
        gpus=tres_gpu_count(tres) if tres else None,
        gpus_per_node=_gpus_per_node(as_text(item.get("tres_per_node"))),
        working_directory=as_text(item.get("current_working_directory")),
        stdout_path=as_text(item.get("standard_output")),
        source="squeue",
    )


def parse_squeue_json(text: str) -> list[SlurmJob]:
    """``squeue --json`` -> jobs (Slurm 22.05 ignores filters with --json: filter after)."""
    items = load_json(text, "squeue --json", "jobs")
    return [
        guarded(
            "a job in squeue --json",
            json.dumps(item)[:300],
            _job_from_squeue_json,
            item,
        )
        for item in items
    ]


def _tres_list_to_dict(value: Any) -> dict[str, str]:
    """sacct JSON ``[{"type": "gres", "name": "gpu", "count": 2}, ...]`` -> TRES dict."""
    if isinstance(value, str):
        return parse_tres(value)
    result: dict[str, str] = {}
    if not isinstance(value, list):
        return result
    for entry in value:
        if not isinstance(entry, dict) or not entry.get("type"):
            continue
        key = str(entry["type"])
        if entry.get("name"):
            key = f"{key}/{entry['name']}"
        count = json_number(entry.get("count"))
        if count is None:
            continue
        result[key] = f"{count}M" if key == "mem" else str(count)
    return result


def _job_from_sacct_json(item: dict[str, Any]) -> SlurmJob:
    job_id = json_number(item.get("job_id"))
    if job_id is None:
        raise ValueError("job without job_id")
    array = as_dict(item.get("array"))
    array_task = json_number(array.get("task_id"))
    array_job = json_number(array.get("job_id"))
    shown_id = f"{array_job}_{array_task}" if array_job and array_task is not None else str(job_id)
    state_info = item.get("state")
    if isinstance(state_info, dict):
        state, _flags = normalise_job_state(state_info.get("current"))
        reason = as_text(state_info.get("reason"))
    else:
        state, _flags = normalise_job_state(state_info)
        reason = None
    times = as_dict(item.get("time"))
    limit = times.get("limit")
    comment = item.get("comment")
    node_expr = as_text(item.get("nodes")) or ""
    if node_expr == "None assigned":
        node_expr = ""
    tres_block = as_dict(item.get("tres"))
    tres = _tres_list_to_dict(tres_block.get("allocated"))
    exit_code, signal = _exit_from_json_object(item.get("exit_code"))
    if state not in FINAL_JOB_STATES:
        exit_code, signal = None, None
    return SlurmJob(
        job_id=shown_id,
        name=as_text(item.get("name")),
        comment=as_text(comment.get("job")) if isinstance(comment, dict) else as_text(comment),
        state=state,
        reason=reason,
        nodes=tuple(expand(node_expr)),
        node_list_expr=node_expr,
        partition=as_text(item.get("partition")),
        user=as_text(item.get("user")),
        account=as_text(item.get("account")),
        submit_time=parse_timestamp(times.get("submission")),
        start_time=parse_timestamp(times.get("start")),
        end_time=parse_timestamp(times.get("end")),
        time_limit_minutes=json_number(limit),
        exit_code=exit_code,
        signal=signal,
        alloc_tres=tres,
        gpus=tres_gpu_count(tres) if tres else None,
        working_directory=as_text(item.get("working_directory")),
        source="sacct",
    )


def parse_sacct_json(text: str) -> list[SlurmJob]:
    """``sacct --json`` -> one SlurmJob per job (steps are ignored)."""
    items = load_json(text, "sacct --json", "jobs")
    return [
        guarded(
            "a job in sacct --json",
            json.dumps(item)[:300],
            _job_from_sacct_json,
            item,
        )
        for item in items
    ]


# ``squeue -h -o`` fields of commands.squeue_text(): id, name, user, partition, state,
# reason, elapsed, limit, node count, node list, tres-per-node, start, submit.
SQUEUE_TEXT_FORMAT = "%i|%j|%u|%P|%T|%r|%M|%l|%D|%N|%b|%S|%V"
# ``sacct -P -n -o`` fields of commands.sacct_text().
SACCT_TEXT_FIELDS = (
    "JobID",
    "JobName",
    "User",
    "Account",
    "Partition",
    "State",
    "ExitCode",
    "Elapsed",
    "Submit",
    "Start",
    "End",
    "NodeList",
    "AllocTRES",
    "ReqTRES",
    "Timelimit",
)


def _job_from_squeue_fields(fields: list[str]) -> SlurmJob:
    (job_id, name, user, partition, state_text, reason, _elapsed, limit, _count, nodes,
     tres_per_node, start, submit) = (item.strip() for item in fields)  # fmt: skip
    state, _flags = normalise_job_state(state_text)
    node_expr = as_text(nodes) or ""
    return SlurmJob(
        job_id=job_id,
        name=as_text(name),
        state=state,
        reason=as_text(reason),
        nodes=tuple(expand(node_expr)),
        node_list_expr=node_expr,
        partition=as_text(partition),
        user=as_text(user),
        submit_time=kv_time(submit),
        start_time=kv_time(start) if state != "PENDING" else None,
        time_limit_minutes=parse_slurm_time(limit),
        gpus_per_node=_gpus_per_node(as_text(tres_per_node)),
        source="squeue",
    )


def parse_squeue_text(text: str) -> list[SlurmJob]:
    """Output of ``commands.squeue_text()`` -> jobs (a pending job's start is an estimate: None)."""
    jobs: list[SlurmJob] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = split_fields(line, 13, 1, "squeue text line")
        jobs.append(guarded("squeue text line", line, _job_from_squeue_fields, fields))
    return jobs


def _exit_text(text: str) -> tuple[int | None, int | None]:
    """sacct/scontrol ``ExitCode=3:0`` -> (3, None); ``0:15`` -> (0, 15)."""
    code, sep, sig = text.strip().partition(":")
    if not sep or not code.isdigit() or not sig.isdigit():
        return None, None
    return int(code), (int(sig) or None)


def _job_from_sacct_fields(fields: list[str]) -> SlurmJob:
    (job_id, name, user, account, partition, state_text, exit_text, _elapsed, submit, start,
     end, nodes, alloc_tres, _req_tres, limit) = (item.strip() for item in fields)  # fmt: skip
    state, _flags = normalise_job_state(state_text)
    exit_code, signal = _exit_text(exit_text) if state in FINAL_JOB_STATES else (None, None)
    node_expr = as_text(nodes) or ""
    if node_expr == "None assigned":
        node_expr = ""
    tres = parse_tres(alloc_tres)
    return SlurmJob(
        job_id=job_id,
        name=as_text(name),
        state=state,
        nodes=tuple(expand(node_expr)),
        node_list_expr=node_expr,
        partition=as_text(partition),
        user=as_text(user),
        account=as_text(account),
        submit_time=kv_time(submit),
        start_time=kv_time(start),
        end_time=kv_time(end),
        time_limit_minutes=parse_slurm_time(limit),
        exit_code=exit_code,
        signal=signal,
        alloc_tres=tres,
        gpus=tres_gpu_count(tres) if tres else None,
        source="sacct",
    )


def parse_sacct_text(text: str) -> list[SlurmJob]:
    """Output of ``commands.sacct_text()`` (``-P -n``) -> jobs; step lines are skipped."""
    jobs: list[SlurmJob] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = split_fields(line, len(SACCT_TEXT_FIELDS), 1, "sacct text line")
        if "." in fields[0]:
            continue
        if fields[0] == "JobID":
            continue
        jobs.append(guarded("sacct text line", line, _job_from_sacct_fields, fields))
    return jobs


def _job_from_kv(pairs: dict[str, str]) -> SlurmJob:
    state, _flags = normalise_job_state(pairs.get("JobState"))
    node_expr = as_text(pairs.get("NodeList")) or ""
    tres = parse_tres(pairs.get("AllocTRES") or pairs.get("TRES"))
    exit_code, signal = (None, None)
    if state in FINAL_JOB_STATES:
        exit_code, signal = _exit_text(pairs.get("ExitCode", ""))
    if not node_expr:
        # Before allocation TRES= is the request, not an allocation.
        tres = {}
    user = as_text(pairs.get("UserId"))
    return SlurmJob(
        job_id=pairs["JobId"],
        name=as_text(pairs.get("JobName")),
        comment=as_text(pairs.get("Comment")),
        state=state,
        reason=as_text(pairs.get("Reason")),
        nodes=tuple(expand(node_expr)),
        node_list_expr=node_expr,
        partition=as_text(pairs.get("Partition")),
        user=user.split("(", 1)[0] if user else None,
        account=as_text(pairs.get("Account")),
        submit_time=kv_time(pairs.get("SubmitTime")),
        start_time=kv_time(pairs.get("StartTime")) if node_expr else None,
        end_time=kv_time(pairs.get("EndTime")) if state in FINAL_JOB_STATES else None,
        time_limit_minutes=parse_slurm_time(pairs.get("TimeLimit")),
        exit_code=exit_code,
        signal=signal,
        alloc_tres=tres,
        gpus=tres_gpu_count(tres) if tres else None,
        gpus_per_node=_gpus_per_node(as_text(pairs.get("TresPerNode"))),
        working_directory=as_text(pairs.get("WorkDir")),
        stdout_path=as_text(pairs.get("StdOut")),
        source="scontrol",
    )


def parse_scontrol_jobs(text: str) -> list[SlurmJob]:
    """``scontrol show job [-o] [id]`` -> jobs. Times are local cluster time taken as UTC
    unless the command ran with ``SLURM_TIME_FORMAT=%s`` (commands.scontrol_show_job does)."""
    records = guarded("scontrol show job", text, parse_kv_records, text, "JobId")
    return [
        guarded(
            "a job in scontrol show job",
            str(record)[:300],
            _job_from_kv,
            record,
        )
        for record in records
    ]
