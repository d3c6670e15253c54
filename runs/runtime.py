"""What a job looks like on the cluster: run directory, the shipped trainer, the sbatch script.

Pure functions plus the uploader and the per-account area set-up; no Django models are
imported here, so the script a preview shows is byte for byte the script that runs.
"""

from __future__ import annotations

import logging
import posixpath
import re
import shlex
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import trainer
from nodes.environment import NAME as ENV_NAME
from nodes.environment import environment_name_refused
from slurm.errors import SftpError

logger = logging.getLogger(__name__)

TRAINER_SOURCE = Path(trainer.__file__).resolve().parent
# How long the service account's read grant (one setfacl over a few directories) may take.
GRANT_TIMEOUT_S = 60


# A cluster account, as it appears in paths (the same rule as a certificate principal).
ACCOUNT_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")


def user_area(workdir: str, account: str) -> str:
    """A cluster account's own area under the work directory (0700, owned by it)."""
    if not ACCOUNT_NAME.fullmatch(account):
        raise ValueError(f"invalid cluster account {account!r}")
    return f"{workdir.rstrip('/')}/users/{account}"


def run_dir(workdir: str, job_id: str, account: str = "") -> str:
    """Where a job's files live: ``<workdir>/users/<account>/runs/<id>`` for a job that runs
    as ``account``; ``<workdir>/runs/<id>`` for one that runs as the service account."""
    if account:
        return f"{user_area(workdir, account)}/runs/{job_id}"
    return f"{workdir.rstrip('/')}/runs/{job_id}"


def drill_dir(workdir: str, job_id: str, drill_id: str, account: str = "") -> str:
    return f"{run_dir(workdir, job_id, account)}/drills/{drill_id}"


def trainer_dir(workdir: str, digest: str) -> str:
    """Content-addressed: one directory per trainer version, uploaded once."""
    return f"{workdir.rstrip('/')}/trainer/{digest[:20]}"


@dataclass(frozen=True)
class ScriptSpec:
    """Everything the sbatch script needs, as plain values."""

    job_id: str
    job_name: str
    run_dir: str
    trainer_dir: str
    python: str
    partition: str
    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    gpus_per_node: int
    gpu_type: str
    memory_mb: int | None
    time_limit_minutes: int
    nodelist: str
    switches: str
    trainer_args: tuple[str, ...]
    output_name: str = "slurm-%j.out"
    environment: tuple[tuple[str, str], ...] = ()
    # Each rank also writes its own output to ``rank-<slurm id>-<rank>.out`` in the run
    # directory (the Slurm output file still gets every rank's lines, as before).
    rank_output: bool = False
    # Nodes Slurm must not use (a checked node list expression).
    exclude: str = ""
    # The nodes whole (``--exclusive``): no other job shares them while this one runs (an
    # acceptance step judges its nodes; co-located work must not turn into a verdict).
    exclusive: bool = False
    # What the cluster's operator allows on top of the default environment allow-list
    # (``Cluster.extra_allowed_environment``); the script refuses any other name.
    allowed_environment: tuple[str, ...] = ()


# Run by bash in each task: the command ("$@") with its output copied, as it comes, to the
# rank's file in the run directory ("$0"); pipefail keeps the command's exit status.
RANK_OUTPUT_PROGRAM = (
    'set -o pipefail; "$@" 2>&1 | tee -a "$0/rank-$SLURM_JOB_ID-$SLURM_PROCID.out"'
)

# How each rank starts the trainer, so that nothing of the account's runs before it.
# ``-I`` (isolated; implies -E and -s): no PYTHON* variable is read (PYTHONPATH,
# PYTHONSTARTUP, PYTHONHOME, PYTHONUSERBASE...), the user's site-packages (usercustomize,
# .pth files under ~/.local) is not added, and neither is the working directory (the
# account's own run directory), so no file there shadows a module. ``-E -s`` alone would
# still put the working directory first on sys.path for ``-c``. As -I ignores PYTHONPATH,
# the shipped trainer's directory comes as the first argument and this bootstrap puts it
# on sys.path, then runs the package exactly as ``python -m trainer`` does. ``-u`` stands
# for PYTHONUNBUFFERED, which -I ignores.
TRAINER_BOOTSTRAP = (
    "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); "
    'runpy.run_module("trainer", run_name="__main__", alter_sys=True)'
)
PYTHON_FLAGS = ("-I", "-u")
# The shells: ``-p`` (privileged mode) runs neither $BASH_ENV nor $ENV, imports no shell
# functions (BASH_FUNC_*) and ignores SHELLOPTS, BASHOPTS, CDPATH and GLOBIGNORE from the
# environment; --noprofile/--norc for good measure (a non-interactive shell reads neither).
# The batch script unsets BASH_ENV and ENV too, so no later shell of the job sees them.
SCRIPT_SHEBANG = "#!/bin/bash -p"
RANK_SHELL = ("/bin/bash", "--noprofile", "--norc", "-p", "-c")


class EnvironmentRefused(ValueError):
    """The job's environment names a variable the policy (``nodes.environment``) refuses:
    found when the script is rendered (a job or template saved before the policy, or a
    cluster whose operator took a name back). Nothing is sent to Slurm."""

    code = "environment_refused"


def _check_environment(spec: ScriptSpec) -> None:
    """Validated on the way in (``jobs.validation``); checked again here, where a name
    meets the shell and the ranks, with the same policy."""
    for name, _ in spec.environment:
        why = environment_name_refused(name, spec.allowed_environment)
        if why:
            shown = name if isinstance(name, str) and ENV_NAME.fullmatch(name) else repr(name)
            raise EnvironmentRefused(f"the job's environment is not allowed: {shown} {why}")


def _rank_command(spec: ScriptSpec) -> list[str]:
    """The srun line(s) that start the ranks."""
    quote = shlex.quote
    trainer_command = " ".join(
        [
            quote(spec.python),
            *PYTHON_FLAGS,
            "-c",
            quote(TRAINER_BOOTSTRAP),
            quote(spec.trainer_dir),
            *(quote(arg) for arg in spec.trainer_args),
        ]
    )
    if not spec.rank_output:
        return [f"srun --export=ALL --kill-on-bad-exit=1 {trainer_command}"]
    return [
        "# Each rank's output also goes to its own file (the rank's exit status stays).",
        f"srun --export=ALL --kill-on-bad-exit=1 {' '.join(RANK_SHELL)} "
        f"{quote(RANK_OUTPUT_PROGRAM)} {quote(spec.run_dir)} {trainer_command}",
    ]


# The script records how it ended (any exit) in gantry-exit-<slurm id>.json, without
# changing its exit status. Nothing here comes from the job's input.
EXIT_RECORD_LINES = (
    "gantry_signal=null",
    "# Unix seconds with nanoseconds where date knows %N; whole seconds elsewhere.",
    "gantry_now() {",
    '  t=$(date +%s.%N 2>/dev/null) || t=""',
    '  case "$t" in "" | *[!0-9.]*) date +%s ;; *) echo "$t" ;; esac',
    "}",
    "gantry_started=$(gantry_now)",
    "# Record how the script ended (any exit), without changing its exit status.",
    "gantry_exit() {",
    "  rc=$?",
    "  set +e",
    '  { printf \'{"slurm_job_id": "%s", "exit_code": %d, "signal": %s, '
    '"started": %s, "ended": %s}\\n\' "$SLURM_JOB_ID" "$rc" "$gantry_signal" '
    '"$gantry_started" "$(gantry_now)" '
    '> "$gantry_run/.gantry-exit.tmp" '
    '&& mv -f "$gantry_run/.gantry-exit.tmp" "$gantry_run/gantry-exit-$SLURM_JOB_ID.json"; '
    "} 2>/dev/null",
    '  exit "$rc"',
    "}",
    "trap gantry_exit EXIT",
    'trap \'gantry_signal="\\"TERM\\""; exit 143\' TERM',
)

# Where rank 0 listens (MASTER_ADDR/MASTER_PORT), from Slurm's own view of the allocation.
RENDEZVOUS_LINES = (
    "# Rank 0 listens on the first node; node names are not always DNS names.",
    'first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
    'MASTER_ADDR=$(scontrol show node "$first_node" | tr " " "\\n" '
    "| sed -n 's/^NodeAddr=//p' | head -n 1)",
    'export MASTER_ADDR="${MASTER_ADDR:-$first_node}"',
    "# 20000-29999: clear of well-known service ports and of the ephemeral range.",
    "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))",
    'case "$MASTER_ADDR" in 127.*|localhost) export GLOO_SOCKET_IFNAME=lo ;; esac',
    'echo "gantry: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, master $MASTER_ADDR:$MASTER_PORT"',
)


def render_sbatch(spec: ScriptSpec) -> str:
    """The job script. Resources are #SBATCH lines so the file on the cluster tells all.

    It records how it ended (``gantry-exit-<slurm id>.json`` in the run directory: exit
    code, ``TERM`` when Slurm stopped it, and when the script started and ended, in unix
    seconds with nanoseconds), so a cluster without accounting still tells Gantry how each
    job finished.
    """
    quote = shlex.quote
    _check_environment(spec)
    lines = [
        SCRIPT_SHEBANG,
        f"# Gantry job {spec.job_id}: {spec.job_name.replace(chr(10), ' ')}",
        f"#SBATCH --partition={spec.partition}",
        f"#SBATCH --nodes={spec.nodes}",
        f"#SBATCH --ntasks-per-node={spec.tasks_per_node}",
        f"#SBATCH --cpus-per-task={spec.cpus_per_task}",
        f"#SBATCH --time={spec.time_limit_minutes}",
        f"#SBATCH --output={spec.run_dir}/{spec.output_name}",
        f"#SBATCH --chdir={spec.run_dir}",
        "#SBATCH --export=ALL",
        # Never rerun by Slurm (after a node failure it would restart the script from the
        # top, from step 0, in the same run directory): Gantry's recovery resumes from the
        # newest proven checkpoint instead, leaving the failed node out.
        "#SBATCH --no-requeue",
    ]
    if spec.gpus_per_node:
        gpus = f"{spec.gpu_type}:{spec.gpus_per_node}" if spec.gpu_type else str(spec.gpus_per_node)
        lines.append(f"#SBATCH --gpus-per-node={gpus}")
    if spec.memory_mb:
        lines.append(f"#SBATCH --mem={spec.memory_mb}M")
    if spec.nodelist:
        lines.append(f"#SBATCH --nodelist={spec.nodelist}")
    if spec.switches:
        lines.append(f"#SBATCH --switches={spec.switches}")
    if spec.exclude:
        lines.append(f"#SBATCH --exclude={spec.exclude}")
    if spec.exclusive:
        lines.append("#SBATCH --exclusive")
    lines += [
        "",
        "set -euo pipefail",
        "# No later shell of this job runs a start-up file named by the environment.",
        "unset BASH_ENV ENV",
        f"gantry_run={quote(spec.run_dir)}",
        *EXIT_RECORD_LINES,
        *(f"export {name}={quote(value)}" for name, value in spec.environment),
        *RENDEZVOUS_LINES,
        "# If one rank fails, end the others at once instead of leaving them waiting.",
        *_rank_command(spec),
        "",
    ]
    return "\n".join(lines)


class FileTransport(Protocol):
    def exists(self, path: str) -> bool: ...
    def makedirs(self, path: str, mode: int = 0o755) -> None: ...
    def put_bytes(self, path: str, data: bytes, mode: int = 0o644) -> None: ...


_uploaded: set[tuple[int, str]] = set()
_upload_lock = threading.Lock()


class UserAreaError(Exception):
    """A cluster account's area cannot be used (not its own, not a directory, cannot be
    made): the message says what the cluster's admin can do."""


class ExecResultLike(Protocol):
    @property
    def rc(self) -> int: ...
    @property
    def stderr(self) -> str: ...


class GrantTransport(Protocol):
    def exec(
        self, argv: Sequence[str], *, timeout: float | None = None, check: bool = True
    ) -> ExecResultLike: ...


class AreaTransport(FileTransport, GrantTransport, Protocol):
    def lstat(self, path: str) -> StatLike | None: ...
    def chmod(self, path: str, mode: int) -> None: ...


class StatLike(Protocol):
    @property
    def is_dir(self) -> bool: ...
    @property
    def is_link(self) -> bool: ...


_areas_ready: set[tuple[int, str]] = set()


def service_read_grant(
    own: GrantTransport, *, area: str, directory: str = "", service_account: str
) -> bool:
    """As the area's owner: let the cluster's service account list and read ``area`` and
    every directory from it down to ``directory`` (``u:<service>:rX``), and what is made
    in them later (the same as a default ACL), so the watcher's batched reader
    (``runs.rundir_batch``) reads them in one command as the service account. No one else
    gains anything: the area stays 0700 to its group and to others. setfacl recomputes the
    ACL mask, which a ``chmod`` or a directory made with mode 0700 leaves at nothing (that
    would void every named entry, the drill verifier's included). argv only, no shell.

    Best effort: False (logged) where it fails (no setfacl, a file system without ACLs);
    the watcher then lists that account's directories as the account, as before."""
    top = area.rstrip("/")
    paths = [top]
    if directory:
        normal = posixpath.normpath(directory)
        if normal != directory.rstrip("/") or not normal.startswith(top + "/"):
            raise ValueError(f"{directory} is not inside the area {area}")
        parts = normal[len(top) + 1 :].split("/")
        paths += [posixpath.join(top, *parts[:depth]) for depth in range(1, len(parts) + 1)]
    entry = f"u:{service_account}:rX"
    argv = ["setfacl", "-m", f"{entry},d:{entry}", "--", *paths]
    result = own.exec(argv, check=False, timeout=GRANT_TIMEOUT_S)
    if result.rc != 0:
        logger.warning(
            "could not let %s read %s (setfacl exited %s: %s); its run directories are "
            "listed as their owner",
            service_account,
            paths[-1],
            result.rc,
            (result.stderr or "").strip()[:300],
        )
        return False
    return True


def user_area_ensure(
    shared: AreaTransport,
    own: AreaTransport,
    workdir: str,
    account: str,
    *,
    service_account: str = "",
) -> str:
    """Make sure ``account``'s area exists, is a real directory, is its own and is 0700,
    and (given ``service_account``) that the service account may read it
    (``service_read_grant``, after the chmod, which would void it).

    ``shared``: the service account (it owns the work directory and makes ``users/``
    world-writable with the sticky bit, like /tmp, so each account can make its own entry
    and remove no one else's); ``own``: the account itself. Owning the area is proven by
    setting its mode, which only the owner may: an area another account made in its name
    is refused. Once per process and account; returns the area."""
    area = user_area(workdir, account)
    key = (id(own), area)
    if key in _areas_ready:
        return area
    users = area.rsplit("/", 1)[0]
    try:
        found = own.lstat(area)
        if found is None:
            if shared.lstat(users) is None:
                shared.makedirs(users)
                shared.chmod(users, 0o1777)
            own.makedirs(area, mode=0o700)
            found = own.lstat(area)
        if found is None or found.is_link or not found.is_dir:
            raise UserAreaError(f"{area} is not a directory of {account}'s own")
        own.chmod(area, 0o700)
    except SftpError as error:
        # Permanent (permission denied, not a directory); a dropped link is not caught.
        raise UserAreaError(
            f"cannot set up {area} as {account} ({error}); the cluster's admin can create it "
            f"owned by {account} with mode 0700, or make {users} mode 1777"
        ) from error
    if service_account and service_account != account:
        service_read_grant(own, area=area, service_account=service_account)
    _areas_ready.add(key)
    return area


def trainer_files() -> list[tuple[str, bytes]]:
    files = []
    for path in sorted(TRAINER_SOURCE.rglob("*")):
        if path.is_file() and path.suffix in {".py", ".md"} and "__pycache__" not in path.parts:
            files.append((path.relative_to(TRAINER_SOURCE).as_posix(), path.read_bytes()))
    return files


def trainer_upload(
    transport: FileTransport, target: str, files: list[tuple[str, bytes]], digest: str
) -> str:
    """Ship ``files`` (relative path, bytes) to ``<target>/trainer`` unless the
    ``.complete`` marker, written last, says they are there (a half-finished upload is
    redone). Returns the directory to put on PYTHONPATH."""
    key = (id(transport), target)
    with _upload_lock:
        if key in _uploaded:
            return target
        marker = f"{target}/.complete"
        if not transport.exists(marker):
            package = f"{target}/trainer"
            transport.makedirs(package)
            for relative, data in files:
                if "/" in relative:
                    transport.makedirs(f"{package}/{relative.rsplit('/', 1)[0]}")
                transport.put_bytes(f"{package}/{relative}", data)
            transport.put_bytes(marker, f"{digest}\n".encode())
        _uploaded.add(key)
    return target


def trainer_ensure_uploaded(transport: FileTransport, workdir: str) -> str:
    """Ship the current trainer to ``<workdir>/trainer/<digest>/trainer`` unless it is
    there. Returns the directory to put on PYTHONPATH."""
    digest = trainer.source_digest()
    return trainer_upload(transport, trainer_dir(workdir, digest), trainer_files(), digest)
