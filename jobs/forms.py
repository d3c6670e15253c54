from __future__ import annotations

import json
from typing import Any

from django import forms

from nodes.models import Cluster
from trainer.config import PRESETS


class JobForm(forms.Form):
    """The submit form. Validation against the cluster happens in the service; its
    field errors are attached here by name."""

    cluster = forms.ModelChoiceField(queryset=Cluster.objects.all(), empty_label=None)
    name = forms.CharField(max_length=128)
    preset = forms.ChoiceField(choices=[(name, name) for name in PRESETS], initial="tiny")
    steps = forms.IntegerField(min_value=1, initial=200)
    batch_size = forms.IntegerField(
        min_value=1, required=False, help_text="per rank; empty: preset"
    )
    precision = forms.ChoiceField(choices=[("fp32", "fp32"), ("bf16", "bf16")], initial="fp32")
    checkpoint_every = forms.IntegerField(
        min_value=0, initial=50, help_text="steps; 0 = only at the end"
    )
    seed = forms.IntegerField(initial=0)
    extra_config = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": '{"lr": 0.001}'}),
        help_text="Other trainer keys as JSON (advanced).",
    )
    partition = forms.CharField(
        max_length=64, required=False, help_text="empty: the cluster's default"
    )
    nodes = forms.IntegerField(min_value=1, max_value=4096, initial=1)
    gpus_per_node = forms.IntegerField(min_value=0, max_value=64, initial=0)
    gpu_type = forms.CharField(max_length=64, required=False)
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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        default = Cluster.objects.filter(is_default=True).first()
        if default is not None:
            self.fields["cluster"].initial = default.pk

    def clean_extra_config(self) -> dict[str, Any]:
        raw = (self.cleaned_data.get("extra_config") or "").strip()
        if not raw:
            return {}
        try:
            value = json.loads(raw)
        except ValueError as error:
            raise forms.ValidationError(f"not valid JSON: {error}") from None
        if not isinstance(value, dict):
            raise forms.ValidationError('must be a JSON object such as {"lr": 0.001}')
        return value

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
        config.update(data.get("extra_config") or {})
        return config

    def attach_error(self, field: str, message: str) -> None:
        """Put a service's field error on the matching form field."""
        if field.startswith("config."):
            key = field.split(".", 1)[1]
            target = key if key in self.fields and key not in {"name", "nodes"} else "extra_config"
            self.add_error(target, f"{key}: {message}" if target == "extra_config" else message)
        elif field in self.fields:
            self.add_error(field, message)
        else:
            self.add_error(None, f"{field}: {message}")
