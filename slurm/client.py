"""High-level Slurm operations over one transport, used by the Django side.

Each method costs a fixed, small number of remote commands, independent of how
many nodes or jobs the cluster has. JSON output is preferred; when the cluster's
Slurm lacks ``--json`` (or gives a shape we cannot read) the client falls back to
the text forms and remembers that for its lifetime.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from slurm import commands
from slurm.errors import (
    SlurmCommandError,
    SlurmControllerUnavailable,
    SlurmNotFound,
    SlurmParseError,
    command_error,
)
from slurm.parsers import (
    ClusterInfo,
    Inventory,
    Partition,
    PendingStart,
    SlurmJob,
    SlurmNode,
    parse_config,
    parse_partitions,
    parse_sacct_text,
    parse_sbatch_parsable,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    parse_sinfo_json,
    parse_squeue_json,
    parse_squeue_start,
    parse_squeue_text,
    parse_topology,
    parse_version,
)

logger = logging.getLogger(__name__)


class CommandResult(Protocol):
    rc: int
    stdout: str
    stderr: str


class CommandRunner(Protocol):
    """What the client needs from a transport (``SshTransport`` or a test double)."""

    def exec(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        check: bool = True,
        max_output: int | None = None,
    ) -> Any: ...


# How far back find_jobs_by_tag searches accounting when no start is given.
DEFAULT_TAG_LOOKBACK = timedelta(days=30)


@dataclass
class TagLookup:
    """The Slurm jobs found per tag, and whether both squeue and sacct answered."""

    found: dict[str, list[SlurmJob]]
    accounting_ok: bool = True
    accounting_error: str = ""

    def proves_absent(self, tag: str) -> bool:
        """No Slurm job carries ``tag``, and both the queue and accounting said so."""
        return self.accounting_ok and not self.found.get(tag)


class SlurmClient:
    def __init__(self, transport: CommandRunner, *, prefer_json: bool = True) -> None:
        self.transport = transport
        # None: not tried yet; True/False once known for this cluster.
        self.json_supported: bool | None = None if prefer_json else False
        self.json_unsupported_reason: str | None = None

    # ------------------------------------------------------------ plumbing

    def _run(self, argv: list[str], *, timeout: float | None = None) -> str:
        return str(self.transport.exec(argv, timeout=timeout).stdout)

    def _json_or_text(self, json_call: Any, text_call: Any) -> Any:
        """Try the JSON form unless known unsupported; fall back to text once and remember."""
        if self.json_supported is not False:
            try:
                result = json_call()
            except (SlurmNotFound, SlurmControllerUnavailable):
                raise
            except (SlurmCommandError, SlurmParseError) as exc:
                self.json_supported = False
                self.json_unsupported_reason = str(exc)
                logger.warning("Slurm --json unusable, using text output from now on: %s", exc)
            else:
                self.json_supported = True
                return result
        return text_call()

    # ------------------------------------------------------------ cluster

    def version(self) -> str:
        return parse_version(self._run(commands.version()))

    def probe(self) -> ClusterInfo:
        """Version, cluster name, partitions, whether accounting (sacct) works.

        Raises ``SlurmNotFound`` when Slurm is not installed on the login host.
        """
        version = self.version()
        config = parse_config(self._run(commands.show_config()))
        partitions = tuple(self.partitions())
        accounting_error: str | None = None
        try:
            self._run(commands.accounting_check())
        except SlurmCommandError as exc:
            accounting_error = str(exc)
        json_supported: bool | None = self.json_supported
        if json_supported is None:
            try:
                parse_sinfo_json(self._run(commands.sinfo_json()))
                json_supported = self.json_supported = True
            except (SlurmNotFound, SlurmControllerUnavailable):
                raise
            except (SlurmCommandError, SlurmParseError) as exc:
                json_supported = self.json_supported = False
                self.json_unsupported_reason = str(exc)
        return ClusterInfo(
            slurm_version=version,
            cluster_name=config.get("ClusterName") or None,
            accounting_available=accounting_error is None,
            accounting_error=accounting_error,
            partitions=partitions,
            topology_plugin=config.get("TopologyPlugin") or None,
            json_supported=json_supported,
        )

    def nodes(self) -> list[SlurmNode]:
        """All nodes: one ``sinfo --json`` (or one ``scontrol -o show node``)."""
        return list(
            self._json_or_text(
                lambda: parse_sinfo_json(self._run(commands.sinfo_json())),
                lambda: parse_scontrol_nodes(self._run(commands.scontrol_show_nodes())),
            )
        )

    def partitions(self) -> list[Partition]:
        return parse_partitions(self._run(commands.scontrol_show_partitions()))

    def inventory(self) -> Inventory:
        """Nodes, partitions and switches in exactly three remote commands."""
        nodes = self.nodes()
        partitions = self.partitions()
        switches = parse_topology(self._run(commands.scontrol_show_topology()))
        return Inventory(nodes=tuple(nodes), partitions=tuple(partitions), switches=tuple(switches))

    # ------------------------------------------------------------ jobs

    def _queue(
        self, job_ids: Sequence[str] | None = None, name: str | None = None
    ) -> list[SlurmJob]:
        def from_json() -> list[SlurmJob]:
            return parse_squeue_json(self._run(commands.squeue_json()))

        def from_text() -> list[SlurmJob]:
            result = self.transport.exec(commands.squeue_text(job_ids, name=name), check=False)
            if result.rc != 0:
                # squeue -j with only unknown ids fails with "Invalid job id specified".
                if "invalid job id" in result.stderr.lower():
                    return []
                raise command_error(result.argv, result.rc, result.stdout, result.stderr)
            return parse_squeue_text(result.stdout)

        jobs: list[SlurmJob] = self._json_or_text(from_json, from_text)
        if job_ids is not None:
            wanted = set(job_ids)
            jobs = [job for job in jobs if job.job_id in wanted]
        if name is not None:
            jobs = [job for job in jobs if name in (job.name, job.comment)]
        return jobs

    def jobs_in_queue(self, job_ids: Iterable[str | int]) -> dict[str, SlurmJob]:
        """Jobs Slurm still holds (pending, running, recently finished): one squeue.

        A job missing from the result has left the queue: ask ``jobs_accounting``.
        """
        ids = [commands.check_job_id(job_id) for job_id in job_ids]
        if not ids:
            return {}
        # Slurm 22.05's squeue --json cannot filter: the whole queue would come back every
        # cycle. The text form filters on the controller, so only our jobs travel.
        result = self.transport.exec(commands.squeue_text(ids), check=False)
        if result.rc != 0:
            # squeue -j with only unknown ids fails with "Invalid job id specified".
            if "invalid job id" in result.stderr.lower():
                return {}
            raise command_error(result.argv, result.rc, result.stdout, result.stderr)
        wanted = set(ids)
        return {job.job_id: job for job in parse_squeue_text(result.stdout) if job.job_id in wanted}

    def jobs_accounting(
        self, job_ids: Iterable[str | int], *, start: datetime | None = None
    ) -> dict[str, SlurmJob]:
        """Accounting records (final states, exit codes): one sacct for all ids.

        Uses sacct's text form on purpose: Slurm 22.05's ``sacct --json`` reports
        ``exit_code`` SUCCESS/0 for a job that exited 3 (see the recorded
        ``sacct.json``), while ``-P`` text has the true ``3:0``.
        """
        ids = [commands.check_job_id(job_id) for job_id in job_ids]
        if not ids:
            return {}
        jobs = parse_sacct_text(self._run(commands.sacct_text(ids, start=start)))
        wanted = set(ids)
        return {job.job_id: job for job in jobs if job.job_id in wanted}

    def pending_starts(self, partitions: Iterable[str] | None = None) -> list[PendingStart]:
        """Every pending job of ``partitions`` with its expected start and priority: one
        ``squeue --start``, however many jobs wait (theirs and everyone else's, which the
        queue positions need)."""
        result = self.transport.exec(commands.squeue_start(partitions), check=False)
        if result.rc != 0:
            raise command_error(result.argv, result.rc, result.stdout, result.stderr)
        return parse_squeue_start(result.stdout)

    def job_details(self, job_id: str | int) -> SlurmJob | None:
        """``scontrol show job``: None once Slurm has forgotten the job."""
        result = self.transport.exec(commands.scontrol_show_job(job_id), check=False)
        if result.rc != 0:
            if "invalid job id" in result.stderr.lower():
                return None
            raise command_error(
                commands.scontrol_show_job(job_id), result.rc, result.stdout, result.stderr
            )
        jobs = parse_scontrol_jobs(result.stdout)
        return jobs[0] if jobs else None

    def jobs_by_tags(
        self, tags: Sequence[str], *, since: datetime | None = None, accounting: bool = True
    ) -> TagLookup:
        """Every Slurm job carrying one of ``tags`` (its name or comment): one squeue and
        (with ``accounting``) one sacct for all tags, whatever their number.

        What makes submission exactly-once: look before you sbatch, and prove a Slurm job
        absent only when both squeue and sacct answered. squeue failing raises; sacct
        failing is reported in the result (``accounting_ok`` False), not raised.
        """
        wanted = [commands.check_tag(tag) for tag in tags]
        lookup = TagLookup(found={tag: [] for tag in wanted})
        if not wanted:
            return lookup
        result = self.transport.exec(commands.squeue_text(names=wanted), check=False)
        if result.rc != 0:
            raise command_error(result.argv, result.rc, result.stdout, result.stderr)
        seen: dict[str, SlurmJob] = {job.job_id: job for job in parse_squeue_text(result.stdout)}
        if accounting:
            start = since or (datetime.now(UTC) - DEFAULT_TAG_LOOKBACK)
            try:
                accounted = self._run(commands.sacct_text(names=wanted, start=start))
                for job in parse_sacct_text(accounted):
                    seen.setdefault(job.job_id, job)
            except (SlurmCommandError, SlurmParseError) as exc:
                # The database (slurmdbd) down, or no accounting, or an answer we cannot
                # read: the queue still answered, but no absence may be proven on this.
                if isinstance(exc, SlurmNotFound):
                    raise
                lookup.accounting_ok = False
                lookup.accounting_error = str(exc)
        else:
            lookup.accounting_ok = False
            lookup.accounting_error = "this cluster has no accounting (sacct)"
        for job in sorted(seen.values(), key=lambda job: _job_sort_key(job.job_id)):
            for tag in set(wanted).intersection([job.name, job.comment]):
                lookup.found[tag].append(job)
        return lookup

    def find_jobs_by_tag(self, tag: str, *, since: datetime | None = None) -> list[SlurmJob]:
        """Every Slurm job carrying ``tag`` (in its name or comment): squeue + sacct.

        Without accounting (sacct failing) the queue is all that can be seen.
        """
        lookup = self.jobs_by_tags([tag], since=since)
        if not lookup.accounting_ok:
            logger.warning(
                "sacct unavailable while looking up tag %s: %s", tag, lookup.accounting_error
            )
        return lookup.found[tag]

    def submit(self, script_path: str, *, tag: str, **options: Any) -> str:
        """``sbatch --parsable`` tagged with ``tag``; returns the Slurm job id.

        Not idempotent by itself: call ``find_jobs_by_tag`` first when retrying.
        Options: see ``commands.sbatch_parsable``.
        """
        argv = commands.sbatch_parsable(script_path, tag=tag, **options)
        return parse_sbatch_parsable(self._run(argv))

    def hold(self, job_id: str | int) -> None:
        """``scontrol hold``: the pending job stays pending until released. Slurm accepts
        it for a running job too (and changes nothing then): callers check the state."""
        self._run(commands.job_hold(job_id))

    def release(self, job_id: str | int) -> None:
        """``scontrol release``; releasing a job that is not held is not an error."""
        self._run(commands.job_release(job_id))

    def cancel(self, job_id: str | int) -> None:
        """``scancel``; cancelling a job that already ended is not an error."""
        self._run(commands.scancel(job_id))

    # ------------------------------------------------------------ nodes

    def drain(self, node: str, reason: str) -> None:
        self._run(commands.node_update(node, "drain", reason))

    def resume(self, node: str) -> None:
        self._run(commands.node_update(node, "resume"))

    def undrain(self, node: str) -> None:
        self._run(commands.node_update(node, "undrain"))

    def node(self, name: str) -> SlurmNode | None:
        result = self.transport.exec(commands.scontrol_show_nodes(name), check=False)
        if result.rc != 0:
            # Slurm 22.05 prints "Node x not found" on stdout, newer ones on stderr.
            if "not found" in (result.stderr + result.stdout).lower():
                return None
            raise command_error(
                commands.scontrol_show_nodes(name), result.rc, result.stdout, result.stderr
            )
        nodes = parse_scontrol_nodes(result.stdout)
        return nodes[0] if nodes else None


def _job_sort_key(job_id: str) -> tuple[int, int]:
    main, _, task = job_id.partition("_")
    return (int(main), int(task) if task.isdigit() else -1)
