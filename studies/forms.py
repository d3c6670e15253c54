from __future__ import annotations

from typing import Any

from django import forms

from nodes.models import Cluster
from studies.models import ScalingStudy
from trainer.config import PRESETS


class StudyForm(forms.Form):
    """The new-study form; validation against the cluster happens in the service."""

    cluster = forms.ModelChoiceField(queryset=Cluster.objects.all(), empty_label=None)
    name = forms.CharField(max_length=128)
    kind = forms.ChoiceField(choices=ScalingStudy.Kind.choices, initial="strong")
    scales = forms.CharField(initial="1,2", help_text="rank counts, e.g. 1,2,4")
    preset = forms.ChoiceField(choices=[(name, name) for name in PRESETS], initial="tiny")
    batch_size = forms.IntegerField(
        min_value=1, initial=16, help_text="strong: global batch (fixed); weak: per-rank batch"
    )
    warmup_steps = forms.IntegerField(min_value=0, initial=5, help_text="not measured")
    measured_steps = forms.IntegerField(min_value=1, initial=30)
    partition = forms.CharField(
        max_length=64, required=False, help_text="empty: the cluster's default"
    )
    ranks_per_node = forms.IntegerField(min_value=1, max_value=256, initial=1)
    gpus_per_rank = forms.IntegerField(min_value=0, max_value=1, initial=1)
    time_limit_minutes = forms.IntegerField(min_value=1, initial=15)
    use_placement = forms.BooleanField(
        required=False, initial=True, label="Use placement advice (fewest switches)"
    )
    target_requested = forms.BooleanField(required=False, label="Report time to the quality target")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        default = Cluster.objects.filter(is_default=True).first()
        if default is not None:
            self.fields["cluster"].initial = default.pk

    def attach_error(self, field: str, message: str) -> None:
        if field in self.fields:
            self.add_error(field, message)
        else:
            self.add_error(None, f"{field}: {message}")
