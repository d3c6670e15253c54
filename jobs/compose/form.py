from __future__ import annotations

import json
from typing import Any

from django import forms

from jobs.compose.inventory import gpu_type_label, partition_label
from jobs.compose.presets import model_parameters, parameters_in_words
from nodes.models import Cluster
from trainer.config import PRESETS
from trainer.config import validate as trainer_config_validate


def _preset_choices() -> list[tuple[str, str]]:
    """``tiny — 0.1 M parameters``: each preset with its model size."""
    choices = []
    for name in PRESETS:
        size = parameters_in_words(model_parameters(trainer_config_validate({"preset": name})))
        choices.append((name, f"{name} — {size}"))
    return choices


def _json_object(raw: str | None, example: str) -> dict[str, Any]:
    text = (raw or "").strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as error:
        raise forms.ValidationError(f"not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise forms.ValidationError(f"must be a JSON object such as {example}")
    return value


class JobForm(forms.Form):
    """The submit form, built from the synced inventory
    (``jobs.compose.inventory.submit_inventory``): the partition and GPU type are selects of
    what the chosen cluster has, and the numbers carry the partition's bounds. What the
    cluster can run is checked by the same validation as the API (``jobs.validation``); its
    field errors are attached here by name.
    """

    cluster = forms.ModelChoiceField(queryset=Cluster.objects.all(), empty_label=None)
    name = forms.CharField(max_length=128)
    preset = forms.ChoiceField(choices=_preset_choices, initial="tiny")
    steps = forms.IntegerField(min_value=1, initial=200)
    batch_size = forms.IntegerField(
        min_value=1, required=False, help_text="per rank; empty: preset"
    )
    precision = forms.ChoiceField(choices=[("fp32", "fp32"), ("bf16", "bf16")], initial="fp32")
    strategy = forms.ChoiceField(
        choices=[
            ("ddp", "DDP — a full replica on every rank"),
            ("fsdp", "FSDP — parameters, gradients and optimizer state sharded over the ranks"),
        ],
        initial="ddp",
        required=False,
        label="Distribution",
    )
    checkpoint_every = forms.IntegerField(
        min_value=0, initial=50, help_text="steps; 0 = only at the end"
    )
    seed = forms.IntegerField(initial=0)
    extra_config = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": '{"lr": 0.001}'}),
        help_text="Other trainer keys as JSON (advanced).",
    )
    environment = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": '{"NCCL_DEBUG": "INFO"}'}),
        help_text="Extra environment variables for the ranks, as JSON (optional). Only knobs "
        "that load no code (OMP_NUM_THREADS, NCCL_DEBUG, TORCH_DISTRIBUTED_DEBUG, "
        "GANTRY_USER_*, ...) and what the cluster's operator allows.",
    )
    partition = forms.CharField(
        max_length=64,
        required=False,
        widget=forms.Select,
        help_text="nodes, idle nodes and GPU types of each partition",
    )
    nodes = forms.IntegerField(min_value=1, max_value=4096, initial=1)
    gpus_per_node = forms.IntegerField(min_value=0, max_value=64, initial=0)
    gpu_type = forms.CharField(max_length=64, required=False, widget=forms.Select, label="GPU type")
    tasks_per_node = forms.IntegerField(
        min_value=1, max_value=256, required=False, help_text="ranks per node; empty: one per GPU"
    )
    cpus_per_task = forms.IntegerField(min_value=1, max_value=1024, initial=1)
    memory_mb = forms.IntegerField(
        min_value=1, required=False, help_text="per node; empty: partition default"
    )
    time_limit_minutes = forms.IntegerField(min_value=1, initial=30)
    nodelist = forms.CharField(
        max_length=1024, required=False, help_text="e.g. n[1-2]; empty: Slurm chooses"
    )
    switches = forms.CharField(
        max_length=64, required=False, help_text="e.g. 1@10: at most 1 leaf, wait ≤10 min"
    )
    use_placement_advice = forms.BooleanField(
        required=False,
        label="Use the placement advice",
        help_text="fills node list and switches with the advice (fewest switches)",
    )
    job_id = forms.UUIDField(required=False, widget=forms.HiddenInput)
    # "Save as template": not part of the job.
    save_name = forms.CharField(max_length=128, required=False, label="Template name")
    save_shared = forms.BooleanField(
        required=False, label="Share with everyone", help_text="private to you when unticked"
    )

    def __init__(
        self, *args: Any, inventory: list[dict[str, Any]] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.inventory = inventory if inventory is not None else []
        default = next((c for c in self.inventory if c["is_default"]), None)
        if default is None:
            first = Cluster.objects.filter(is_default=True).first()
            default = {"id": first.pk} if first is not None else None
        if default is not None and "cluster" not in self.initial:
            self.fields["cluster"].initial = default["id"]
        self._bound_choices()

    # ------------------------------------------------------------ choices and bounds

    def chosen_cluster(self) -> dict[str, Any] | None:
        raw = self.data.get("cluster") if self.is_bound else None
        if raw in (None, ""):
            raw = self.initial.get("cluster", self.fields["cluster"].initial)
        wanted = str(raw.pk if isinstance(raw, Cluster) else raw)
        return next((c for c in self.inventory if str(c["id"]) == wanted), None)

    def chosen_partition(self) -> dict[str, Any] | None:
        cluster = self.chosen_cluster()
        if cluster is None:
            return None
        raw = self.data.get("partition") if self.is_bound else self.initial.get("partition")
        name = raw or cluster["default_partition"]
        partitions = cluster["partitions"]
        return next((p for p in partitions if p["name"] == name), None) or (
            partitions[0] if partitions and not raw else None
        )

    def _bound_choices(self) -> None:
        cluster = self.chosen_cluster()
        partitions = cluster["partitions"] if cluster else []
        choices = [(p["name"], partition_label(p)) for p in partitions]
        raw_partition = (
            self.data.get("partition") if self.is_bound else self.initial.get("partition")
        )
        if raw_partition and raw_partition not in {p["name"] for p in partitions}:
            # Kept visible, so the error next to it says why it cannot be used.
            choices.append((raw_partition, f"{raw_partition} (not a partition of this cluster)"))
        self.fields["partition"].widget.choices = choices
        partition = self.chosen_partition()
        if partition is not None and not self.is_bound and not self.initial.get("partition"):
            self.initial["partition"] = partition["name"]
        types = partition["gpu_types"] if partition else []
        gpu_choices = [("", "any type" if types else "no GPUs in this partition")]
        gpu_choices += [(t["name"], gpu_type_label(t)) for t in types]
        raw_type = self.data.get("gpu_type") if self.is_bound else self.initial.get("gpu_type")
        if raw_type and raw_type not in {t["name"] for t in types}:
            gpu_choices.append((raw_type, f"{raw_type} (not in this partition)"))
        self.fields["gpu_type"].widget.choices = gpu_choices
        if partition is not None:
            self._bounds(partition)

    def _bounds(self, partition: dict[str, Any]) -> None:
        """The partition's limits as the inputs' ``max``: the browser shows them at once,
        the server's validation says why when one is passed anyway."""
        limits = {
            "nodes": partition["nodes"],
            "gpus_per_node": partition["max_gpus_per_node"],
            "cpus_per_task": partition["max_cpus_per_node"],
            "memory_mb": partition["max_memory_mb"],
            "time_limit_minutes": partition["max_time_minutes"],
        }
        for name, limit in limits.items():
            if limit:
                self.fields[name].widget.attrs["max"] = limit

    # ------------------------------------------------------------ cleaning

    def clean_extra_config(self) -> dict[str, Any]:
        return _json_object(self.cleaned_data.get("extra_config"), '{"lr": 0.001}')

    def clean_environment(self) -> dict[str, Any]:
        return _json_object(self.cleaned_data.get("environment"), '{"NCCL_DEBUG": "INFO"}')

    def trainer_config(self) -> dict[str, Any]:
        data = self.cleaned_data
        config: dict[str, Any] = {
            "preset": data["preset"],
            "steps": data["steps"],
            "precision": data["precision"],
            "checkpoint_every": data["checkpoint_every"],
            "seed": data["seed"],
        }
        if data.get("batch_size"):
            config["batch_size"] = data["batch_size"]
        if data.get("strategy"):
            config["strategy"] = data["strategy"]
        config.update(data.get("extra_config") or {})
        return config

    def settings(self) -> dict[str, Any]:
        """The job's settings (``jobs.compose.settings``) as the form has them."""
        data = self.cleaned_data
        gpus = data["gpus_per_node"]
        return {
            "name": data["name"],
            "partition": data.get("partition") or data["cluster"].default_partition,
            "nodes": data["nodes"],
            "gpus_per_node": gpus,
            "gpu_type": data.get("gpu_type") or "",
            "tasks_per_node": data.get("tasks_per_node") or max(1, gpus),
            "cpus_per_task": data["cpus_per_task"],
            "memory_mb": data.get("memory_mb"),
            "time_limit_minutes": data["time_limit_minutes"],
            "nodelist": (data.get("nodelist") or "").strip(),
            "switches": (data.get("switches") or "").strip(),
            "config": self.trainer_config(),
            "environment": data.get("environment") or {},
            "use_placement_advice": bool(data.get("use_placement_advice")),
        }

    def attach_error(self, field: str, message: str) -> None:
        """Put a service's field error on the matching form field."""
        if field.startswith("settings."):
            field = field.split(".", 1)[1]
        if field.startswith("config."):
            key = field.split(".", 1)[1]
            target = key if key in self.fields and key not in {"name", "nodes"} else "extra_config"
            self.add_error(target, f"{key}: {message}" if target == "extra_config" else message)
        elif field in self.fields:
            self.add_error(field, message)
        else:
            self.add_error(None, f"{field}: {message}")
