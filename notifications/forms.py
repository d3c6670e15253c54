from __future__ import annotations

from typing import Any

from django import forms

from core.roles import is_operator
from core.types import User
from nodes.models import Cluster
from notifications.models import Subscription
from notifications.services import NAME_MAX_LENGTH, URL_MAX_LENGTH
from notifications.topics import OPERATOR_TOPICS, Topic


class SubscriptionForm(forms.Form):
    """The new-subscription form; operators also see the cluster topics."""

    name = forms.CharField(max_length=NAME_MAX_LENGTH, help_text="e.g. “team Slack relay”")
    channel = forms.ChoiceField(choices=Subscription.Channel.choices, initial="webhook")
    url = forms.CharField(
        required=False,
        max_length=URL_MAX_LENGTH,
        label="Webhook URL",
        help_text="http(s), public addresses only; empty for email",
        widget=forms.URLInput(attrs={"placeholder": "https://hooks.example.org/gantry"}),
    )
    topics = forms.MultipleChoiceField(choices=(), widget=forms.CheckboxSelectMultiple)
    cluster = forms.ModelChoiceField(
        queryset=Cluster.objects.none(),
        required=False,
        empty_label="every cluster",
        help_text="narrows the cluster topics",
    )

    def __init__(self, *args: Any, user: User, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        operator = is_operator(user)
        topics = self.fields["topics"]
        assert isinstance(topics, forms.MultipleChoiceField)
        topics.choices = [
            (value, label)
            for value, label in Topic.choices
            if operator or value not in OPERATOR_TOPICS
        ]
        cluster = self.fields["cluster"]
        assert isinstance(cluster, forms.ModelChoiceField)
        if operator:
            cluster.queryset = Cluster.objects.order_by("name")
        else:
            del self.fields["cluster"]

    def attach_error(self, field: str, message: str) -> None:
        """Put a service's FieldError on the field the person filled in."""
        if field in self.fields:
            self.add_error(field, message)
        else:
            self.add_error(None, f"{field}: {message}")
