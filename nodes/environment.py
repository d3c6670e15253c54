"""Which environment variables a researcher may set for a job's ranks: an allow-list.

Jobs run as each researcher's own cluster account, templates are shared, and a drill runs
with the job's environment: a variable a person sets must never load code (a library, a
shell start-up file, a Python hook, a plugin) into the job of whoever runs it. So only
the names in ``DEFAULT_ALLOWED`` (knobs that load nothing) pass; an operator may allow
more on one cluster (``Cluster.extra_allowed_environment``: exact names or ``PREFIX*``
patterns), but never a name of the hard-deny set (``hard_denied``), which is checked
first, whatever a pattern says.

Pure Python, no Django: the cluster model's validator, ``jobs.validation`` (every submit
path) and ``runs.runtime`` (the batch script, rendered again at submit-task time) all ask
here, so there is one policy.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# A variable name as the batch script exports it (checked whole, with fullmatch).
NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,63}")
# An operator's entry: an exact name, or a prefix of at least two characters and ``*``.
PATTERN = re.compile(r"[A-Z_][A-Z0-9_]{1,62}\*|[A-Z_][A-Z0-9_]{0,63}")
MAX_EXTRA_ENTRIES = 64

# Knobs that load no code and name no file: what any researcher may set.
DEFAULT_ALLOWED: frozenset[str] = frozenset(
    {
        # threads
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "TOKENIZERS_PARALLELISM",
        # NCCL tuning and logging (never its plugins, config file or dump files)
        "NCCL_DEBUG",
        "NCCL_DEBUG_SUBSYS",
        "NCCL_ALGO",
        "NCCL_PROTO",
        "NCCL_MIN_NCHANNELS",
        "NCCL_MAX_NCHANNELS",
        "NCCL_MIN_CTAS",
        "NCCL_MAX_CTAS",
        "NCCL_NTHREADS",
        "NCCL_BUFFSIZE",
        "NCCL_P2P_LEVEL",
        "NCCL_P2P_DISABLE",
        "NCCL_SHM_DISABLE",
        "NCCL_NET_GDR_LEVEL",
        "NCCL_NET_GDR_READ",
        "NCCL_IB_DISABLE",
        "NCCL_IB_HCA",
        "NCCL_IB_TIMEOUT",
        "NCCL_IB_RETRY_CNT",
        "NCCL_IB_GID_INDEX",
        "NCCL_IB_TC",
        "NCCL_IB_SL",
        "NCCL_SOCKET_IFNAME",
        "NCCL_SOCKET_NTHREADS",
        "NCCL_NSOCKS_PERTHREAD",
        "NCCL_CROSS_NIC",
        "NCCL_NVLS_ENABLE",
        "NCCL_CUMEM_ENABLE",
        "NCCL_COLLNET_ENABLE",
        "NCCL_LAUNCH_MODE",
        "NCCL_CHECKS_DISABLE",
        "NCCL_ASYNC_ERROR_HANDLING",
        "NCCL_BLOCKING_WAIT",
        # PyTorch diagnostics and CUDA behaviour
        "TORCH_DISTRIBUTED_DEBUG",
        "TORCH_CPP_LOG_LEVEL",
        "TORCH_SHOW_CPP_STACKTRACES",
        "TORCH_LOGS",
        "TORCH_USE_CUDA_DSA",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "TORCH_NCCL_BLOCKING_WAIT",
        "TORCH_NCCL_TRACE_BUFFER_SIZE",
        "TORCH_NCCL_ENABLE_MONITORING",
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
        "TORCH_NCCL_AVOID_RECORD_STREAMS",
        "TORCH_NCCL_HIGH_PRIORITY",
        "CUDA_LAUNCH_BLOCKING",
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "CUDA_MODULE_LOADING",
        "CUBLAS_WORKSPACE_CONFIG",
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_NO_CUDA_MEMORY_CACHING",
        # tracking and hub flags (off-line, quiet)
        "WANDB_MODE",
        "WANDB_SILENT",
        "WANDB_DISABLED",
        "HF_HUB_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_HUB_DISABLE_TELEMETRY",
        # the bundled trainer's own knobs (trainer/SCHEMA.md)
        "TRAINER_NUM_THREADS",
        "TRAINER_CKPT_THREADS",
        "TRAINER_HARD_EXIT",
        "TRAINER_FAULT",
    }
)
# Prefixes any researcher may use for their own values (``GANTRY_USER_RUN_TAG``).
DEFAULT_ALLOWED_PREFIXES: tuple[str, ...] = ("GANTRY_USER_",)

# ---------------------------------------------------------------- the hard-deny set
# Never allowed, not even by an operator. Each entry: why, in words a researcher reads.
_LOADS_CODE = "makes a program load code or a library"
_SHELL = "changes what the shell runs or reads at start"
_SET_BY_GANTRY = "is set by Gantry or Slurm"
_NAMES_A_PATH = "names a file, directory, program or search path to load from"

HARD_DENIED_NAMES: dict[str, str] = {
    **dict.fromkeys(("BASH_ENV", "ENV"), "names a file every shell runs at start"),
    "PATH": "chooses which programs run",
    **dict.fromkeys(
        (
            "IFS",
            "SHELLOPTS",
            "BASHOPTS",
            "CDPATH",
            "GLOBIGNORE",
            "PS4",
            "PROMPT_COMMAND",
            "SHELL",
            "HOME",
        ),
        _SHELL,
    ),
    **dict.fromkeys(
        (
            "PERL5OPT",
            "PERL5LIB",
            "PERLLIB",
            "PERL5DB",
            "RUBYOPT",
            "RUBYLIB",
            "NODE_OPTIONS",
            "NODE_PATH",
            "JAVA_TOOL_OPTIONS",
            "_JAVA_OPTIONS",
            "JDK_JAVA_OPTIONS",
            "CLASSPATH",
            "GCONV_PATH",
            "LOCPATH",
            "NLSPATH",
            "HOSTALIASES",
            "GLIBC_TUNABLES",
            "NCCL_CONF_FILE",
            "EDITOR",
            "VISUAL",
            "PAGER",
            "BROWSER",
        ),
        _LOADS_CODE,
    ),
    # The node probe's programs (trainer/probe.py): set by whoever starts the probe (an
    # operator, the dev cluster's stand-in), never by a researcher's job.
    **dict.fromkeys(("GANTRY_NVIDIA_SMI", "GANTRY_DMESG"), "names a program to run"),
    **dict.fromkeys(
        (
            "MASTER_ADDR",
            "MASTER_PORT",
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "GLOO_SOCKET_IFNAME",
            "CUDA_VISIBLE_DEVICES",
        ),
        _SET_BY_GANTRY,
    ),
}
HARD_DENIED_PREFIXES: tuple[tuple[str, str], ...] = (
    ("LD_", "is read by the dynamic loader (libraries, audit modules)"),
    ("DYLD_", "is read by the dynamic loader (libraries, audit modules)"),
    ("PYTHON", "changes what Python imports or runs before the trainer"),
    ("BASH", _SHELL),
    ("SLURM", _SET_BY_GANTRY),
    ("PERL", _LOADS_CODE),
    ("RUBY", _LOADS_CODE),
    ("JAVA", _LOADS_CODE),
    ("GIT_", _LOADS_CODE),
    ("OPENSSL_", _LOADS_CODE),
    ("XDG_", _NAMES_A_PATH),
)
HARD_DENIED_PARTS: tuple[tuple[str, str], ...] = (
    ("PRELOAD", "preloads a library"),
    ("PLUGIN", "loads a plugin library"),
    ("INJECTION", "injects a library"),
    ("AUDIT", "loads an audit library"),
    ("PATH", _NAMES_A_PATH),
    ("LIBRARY", _NAMES_A_PATH),
    ("COMMAND", "names a command to run"),
)
HARD_DENIED_SUFFIXES: tuple[tuple[str, str], ...] = tuple(
    (suffix, _NAMES_A_PATH)
    for suffix in ("_FILE", "_DIR", "_DIRS", "_HOME", "_CACHE", "_LIB", "_LIBS", "_ROOT")
) + tuple((suffix, _LOADS_CODE) for suffix in ("_CMD", "_EXEC", "_OPTIONS", "_OPTS"))


def hard_denied(name: str) -> str | None:
    """Why ``name`` may never be set for a job, even where an operator allows it; None
    when it is not in the hard-deny set."""
    if name in HARD_DENIED_NAMES:
        return HARD_DENIED_NAMES[name]
    for prefix, why in HARD_DENIED_PREFIXES:
        if name.startswith(prefix):
            return why
    for part, why in HARD_DENIED_PARTS:
        if part in name:
            return why
    for suffix, why in HARD_DENIED_SUFFIXES:
        if name.endswith(suffix):
            return why
    return None


def default_allowed(name: str) -> bool:
    """``name`` passes on every cluster (the default allow-list, not hard-denied)."""
    allowed = name in DEFAULT_ALLOWED or name.startswith(DEFAULT_ALLOWED_PREFIXES)
    return allowed and hard_denied(name) is None


def _matches(name: str, entries: Iterable[str]) -> bool:
    for entry in entries:
        if not isinstance(entry, str) or not PATTERN.fullmatch(entry):
            # A malformed stored entry allows nothing (fail closed).
            continue
        if entry.endswith("*") and name.startswith(entry[:-1]):
            return True
        if entry == name:
            return True
    return False


def environment_name_refused(name: object, extra_allowed: Iterable[str] = ()) -> str | None:
    """Why a job may not set variable ``name`` on a cluster that also allows
    ``extra_allowed`` (its operator's entries); None when it may."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        return "is not a variable name (A-Z, 0-9, _; at most 64)"
    why = hard_denied(name)
    if why:
        return f"is never allowed: it {why}"
    if default_allowed(name):
        return None
    if _matches(name, extra_allowed):
        return None
    return (
        "is not on the list of variables jobs may set (knobs that load no code, such as "
        "OMP_NUM_THREADS, NCCL_DEBUG or GANTRY_USER_*); an operator may allow it on this "
        "cluster"
    )


def extra_allowed_problems(entries: object) -> list[str]:
    """What is wrong with an operator's ``extra_allowed_environment`` (empty: nothing).
    An entry that could only ever allow hard-denied names is refused too, so the list
    says what it really allows."""
    if not isinstance(entries, list):
        return ["must be a list of variable names or PREFIX* patterns"]
    if len(entries) > MAX_EXTRA_ENTRIES:
        return [f"at most {MAX_EXTRA_ENTRIES} entries"]
    problems = []
    for entry in entries:
        if not isinstance(entry, str) or not PATTERN.fullmatch(entry):
            problems.append(f"{entry!r} is not a NAME or a PREFIX* pattern (A-Z, 0-9, _)")
            continue
        why = hard_denied(entry.rstrip("*"))
        if why:
            problems.append(f"{entry} cannot be allowed: it {why}")
    return problems
