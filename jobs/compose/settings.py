"""A job's settings as one plain dict: the body of a submit request without the cluster.

The API's submit, templates, "run again" and the form all meet here: a job's settings are
read back from its row (``job_settings``), a dict of settings becomes a ``JobRequest``
(``job_request_from_values``) and the form's fields (``form_initial``), and settings from
outside are checked for shape before ``jobs.validation`` checks them against the cluster.
"""

from __future__ import annotations

import json
from typing import Any

from core.errors import FieldError
from jobs.models import Job
from jobs.recovery_settings import recovery_overrides_validate
from jobs.validation import JobRequest
from nodes.models import Cluster
from trainer.config import ConfigError
from trainer.config import validate as trainer_config_validate

# The settings keys, with their type and bounds (the same as the submit API's serializer).
INTEGER_BOUNDS: dict[str, tuple[int, int]] = {
    "nodes": (1, 4096),
    "gpus_per_node": (0, 64),
    "tasks_per_node": (1, 256),
    "cpus_per_task": (1, 1024),
    "memory_mb": (1, 2**31 - 1),
    "time_limit_minutes": (1, 525600),
}
TEXT_LENGTHS: dict[str, int] = {
    "name": 128,
    "partition": 64,
    "gpu_type": 64,
    "nodelist": 1024,
    "switches": 64,
    "exclude": 1024,
}
OPTIONAL_INTEGERS = ("tasks_per_node", "memory_mb")
SETTINGS_KEYS = (
    *TEXT_LENGTHS,
    *INTEGER_BOUNDS,
    "config",
    "environment",
    "use_placement_advice",
    "recovery",
)
# The trainer keys the form has fields of; the rest of a config goes to "extra_config".
FORM_CONFIG_KEYS = (
    "preset",
    "steps",
    "batch_size",
    "precision",
    "strategy",
    "checkpoint_every",
    "seed",
)


def compact_config(config: dict[str, Any]) -> dict[str, Any]:
    """The keys of a (full) trainer config that differ from what its preset and the
    defaults give: what a person chose, not every default the trainer filled in."""
    preset = config.get("preset")
    try:
        base = trainer_config_validate({"preset": preset} if preset else {}).to_dict()
    except ConfigError:
        return dict(config)
    compact: dict[str, Any] = {"preset": preset} if preset else {}
    for key, value in config.items():
        if key == "preset" or base.get(key) == value:
            continue
        if key == "data" and isinstance(value, dict) and isinstance(base.get("data"), dict):
            changed = {k: v for k, v in value.items() if base["data"].get(k) != v}
            if changed:
                compact["data"] = changed
            continue
        compact[key] = value
    return compact


def job_settings(job: Job) -> dict[str, Any]:
    """What ``job`` was submitted with, as settings: to run it again or keep as a template.
    A fresh run: the checkpoint it resumed from, if any, is not part of it."""
    return {
        "name": job.name,
        "partition": job.partition,
        "nodes": job.nodes,
        "gpus_per_node": job.gpus_per_node,
        "gpu_type": job.gpu_type,
        "tasks_per_node": job.tasks_per_node,
        "cpus_per_task": job.cpus_per_task,
        "memory_mb": job.memory_mb,
        "time_limit_minutes": job.time_limit_minutes,
        "nodelist": job.nodelist_requested,
        "switches": job.switches_requested,
        "exclude": job.exclude_nodes,
        "config": compact_config(dict(job.config or {})),
        "environment": dict(job.environment or {}),
        "use_placement_advice": False,
        "recovery": dict(job.recovery or {}),
    }


def settings_clean(settings: Any) -> dict[str, Any]:
    """Refuse (FieldError on ``settings.<key>``) settings of the wrong shape; return them
    with every key present. What the cluster can run is checked later, by validation."""
    if not isinstance(settings, dict):
        raise FieldError("settings", "must be an object")
    unknown = sorted(set(settings) - set(SETTINGS_KEYS))
    if unknown:
        raise FieldError(f"settings.{unknown[0]}", "unknown setting")
    clean: dict[str, Any] = {}
    for key, length in TEXT_LENGTHS.items():
        value = settings.get(key, "")
        if not isinstance(value, str) or len(value) > length:
            raise FieldError(f"settings.{key}", f"a string of at most {length} characters")
        clean[key] = value
    for key, (low, high) in INTEGER_BOUNDS.items():
        value = settings.get(key)
        if value is None and key in OPTIONAL_INTEGERS:
            clean[key] = None
            continue
        if value is None:
            value = {"nodes": 1, "gpus_per_node": 0, "cpus_per_task": 1}.get(key, 30)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise FieldError(f"settings.{key}", f"an integer from {low} to {high}")
        clean[key] = value
    for key in ("config", "environment"):
        value = settings.get(key) or {}
        if not isinstance(value, dict):
            raise FieldError(f"settings.{key}", "must be an object")
        clean[key] = dict(value)
    advice = settings.get("use_placement_advice", False)
    if not isinstance(advice, bool):
        raise FieldError("settings.use_placement_advice", "must be true or false")
    clean["use_placement_advice"] = advice
    try:
        clean["recovery"] = recovery_overrides_validate(settings.get("recovery"))
    except FieldError as error:
        raise FieldError("settings.recovery", error.why) from None
    return clean


def job_request_from_values(
    values: dict[str, Any], *, cluster: Cluster | None = None
) -> JobRequest:
    """A submit request's values (the API's body, a template's settings) as a JobRequest.

    ``cluster`` given wins; else ``values["cluster"]`` names one; else the default cluster.
    """
    if cluster is None:
        name = values.get("cluster")
        if name:
            cluster = Cluster.objects.filter(name=name).first()
            if cluster is None:
                raise FieldError("cluster", f"no cluster named {name!r}")
        else:
            cluster = Cluster.objects.filter(is_default=True).first()
            if cluster is None:
                raise FieldError("cluster", "no default cluster; name one")
    config = dict(values.get("config") or {})
    if values.get("preset"):
        config.setdefault("preset", values["preset"])
    gpus = values.get("gpus_per_node") or 0
    return JobRequest(
        cluster=cluster,
        name=values.get("name") or "",
        config=config,
        partition=values.get("partition") or cluster.default_partition,
        nodes=values.get("nodes") or 1,
        gpus_per_node=gpus,
        gpu_type=values.get("gpu_type") or "",
        tasks_per_node=values.get("tasks_per_node") or max(1, gpus),
        cpus_per_task=values.get("cpus_per_task") or 1,
        memory_mb=values.get("memory_mb"),
        time_limit_minutes=values.get("time_limit_minutes") or 30,
        nodelist=values.get("nodelist") or "",
        switches=values.get("switches") or "",
        environment=dict(values.get("environment") or {}),
        exclude=values.get("exclude") or "",
        recovery=dict(values.get("recovery") or {}),
    )


def form_initial(settings: dict[str, Any], *, cluster: Cluster | None) -> dict[str, Any]:
    """The submit form's initial values for these settings (run again, a template)."""
    config = dict(settings.get("config") or {})
    initial: dict[str, Any] = {
        key: settings.get(key)
        for key in (*TEXT_LENGTHS, *INTEGER_BOUNDS)
        if settings.get(key) not in (None, "")
    }
    initial["use_placement_advice"] = bool(settings.get("use_placement_advice"))
    if cluster is not None:
        initial["cluster"] = cluster.pk
    for key in FORM_CONFIG_KEYS:
        if key in config:
            initial[key] = config.pop(key)
    if config:
        initial["extra_config"] = json.dumps(config, sort_keys=True)
    if settings.get("environment"):
        initial["environment"] = json.dumps(settings["environment"], sort_keys=True)
    return initial
