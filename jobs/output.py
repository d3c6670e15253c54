"""A job's whole output, streamed from the cluster over SFTP, with HTTP range requests:
the Slurm output file (``slurm-<id>.out``) and each rank's own (``rank-<id>-<rank>.out``,
written by the batch script, ``runs.runtime``).

Paths are built from Gantry's own values only: the run directory (the cluster's work
directory, the job's UUID and its validated account), the Slurm job id (digits, checked
again here) and a rank number below the job's world size. Nothing a request sends becomes
part of a path.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase

from core.errors import ApplicationError
from jobs.lifecycle import JOBS
from jobs.models import Job
from runs.lifecycle import slurm_error_as_application_error
from slurm import commands as slurm_commands
from slurm import errors as slurm_errors

# Bytes per SFTP read while streaming: the web process never holds more than this (twice,
# while the pieces are joined). Each read sends all its 32 KiB requests at once, so a
# larger chunk is fewer round trips: 256 KiB streamed 4.5 MiB/s, 4 MiB 37 MiB/s on the dev
# cluster (bench/log_stream_bench.py).
CHUNK_BYTES = 4 * 1024 * 1024
# At most this many rank files are listed (and stat'ed) for one job.
MAX_RANK_FILES = 256
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


@dataclass(frozen=True)
class OutputFile:
    name: str
    path: str
    rank: int | None


def _slurm_id(job: Job) -> str:
    if not job.slurm_job_id:
        raise ApplicationError("No output yet: the job has no Slurm job.", status_code=404)
    # Digits (and an array task): checked here too, where it becomes part of a path.
    return slurm_commands.check_job_id(job.slurm_job_id)


def rank_file_name(slurm_job_id: str, rank: int) -> str:
    return f"rank-{slurm_job_id}-{rank}.out"


def job_output_file(job: Job, *, rank: int | None = None) -> OutputFile:
    """The job's Slurm output, or rank ``rank``'s (0 ≤ rank < world size)."""
    slurm_id = _slurm_id(job)
    directory = JOBS.run_directory(job)
    if rank is None:
        name = f"slurm-{slurm_id}.out"
    else:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < job.world_size:
            raise ApplicationError(f"The job has no rank {rank}.", status_code=404)
        name = rank_file_name(slurm_id, rank)
    return OutputFile(name=name, path=f"{directory}/{name}", rank=rank)


def job_rank_outputs(job: Job) -> list[dict[str, Any]]:
    """The per-rank output files the job's run directory holds, with their sizes: one
    listing and one stat per file (at most ``MAX_RANK_FILES``)."""
    slurm_id = _slurm_id(job)
    pattern = re.compile(rf"^rank-{re.escape(slurm_id)}-(\d{{1,6}})\.out$")
    directory = JOBS.run_directory(job)
    transport = JOBS.transport_of(job)
    try:
        names = transport.listdir(directory)
        ranks = sorted(int(match.group(1)) for name in names if (match := pattern.fullmatch(name)))
        files = []
        for rank in [r for r in ranks if r < job.world_size][:MAX_RANK_FILES]:
            found = job_output_file(job, rank=rank)
            stat = transport.stat(found.path)
            files.append({"rank": rank, "name": found.name, "size": stat.size if stat else 0})
    except slurm_errors.RemoteFileNotFound:
        return []
    except slurm_errors.SlurmError as error:
        raise slurm_error_as_application_error("Could not list the output files", error) from None
    return files


class RangeNotSatisfiable(Exception):
    pass


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The inclusive byte range a ``Range`` header asks for within ``size`` bytes; None
    without one. One range of bytes only (``bytes=a-b``, ``bytes=a-``, ``bytes=-n``);
    anything else, or a range outside the file, raises RangeNotSatisfiable (416)."""
    if header is None or not header.strip():
        return None
    match = _RANGE.fullmatch(header.strip())
    if match is None:
        raise RangeNotSatisfiable(
            "one range of bytes, e.g. bytes=0-1023, bytes=4096- or bytes=-500"
        )
    first, last = match.groups()
    if not first and not last:
        raise RangeNotSatisfiable("a range needs a start or a length")
    if not first:
        length = int(last)
        if length == 0 or size == 0:
            raise RangeNotSatisfiable("an empty suffix range")
        return max(0, size - length), size - 1
    start = int(first)
    end = size - 1 if not last else min(int(last), size - 1)
    if last and int(last) < start:
        raise RangeNotSatisfiable("the range ends before it starts")
    if start >= size:
        raise RangeNotSatisfiable(f"the file has {size} bytes")
    return start, end


def _chunks(transport: Any, path: str, start: int, end: int) -> Iterator[bytes]:
    """Bytes ``start``..``end`` of ``path``, one SFTP read of at most CHUNK_BYTES at a time."""
    offset = start
    while offset <= end:
        data = transport.read_from(path, offset, min(CHUNK_BYTES, end - offset + 1))
        if not data:
            # The file shrank meanwhile (it never does: Slurm appends); stop short.
            return
        offset += len(data)
        yield data


def _not_satisfiable(size: int, why: str) -> HttpResponse:
    response = JsonResponse(
        {"message": f"Range not satisfiable: {why}.", "extra": {"size": size}}, status=416
    )
    response["Content-Range"] = f"bytes */{size}"
    return response


def job_output_response(
    *, job: Job, rank: int | None, range_header: str | None
) -> HttpResponseBase:
    """The output file as a download: 200 with the whole file, 206 with the asked range
    (``Content-Range``), 416 for a range the file cannot satisfy; 404 while there is none."""
    found = job_output_file(job, rank=rank)
    transport = JOBS.transport_of(job)
    try:
        stat = transport.stat(found.path)
    except slurm_errors.SlurmError as error:
        raise slurm_error_as_application_error("Could not read the output", error) from None
    if stat is None:
        raise ApplicationError(f"No output yet: {found.name} does not exist.", status_code=404)
    size = stat.size
    try:
        wanted = byte_range(range_header, size)
    except RangeNotSatisfiable as refused:
        return _not_satisfiable(size, str(refused))
    start, end = wanted if wanted is not None else (0, size - 1)
    response = StreamingHttpResponse(
        _chunks(transport, found.path, start, end) if size else iter(()),
        status=206 if wanted is not None else 200,
        content_type="text/plain; charset=utf-8",
    )
    response["Content-Length"] = str(end - start + 1 if size else 0)
    response["Accept-Ranges"] = "bytes"
    if wanted is not None:
        response["Content-Range"] = f"bytes {start}-{end}/{size}"
    response["Content-Disposition"] = f'attachment; filename="{found.name}"'
    response["Cache-Control"] = "private, no-store"
    return response
