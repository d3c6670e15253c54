from __future__ import annotations

from datetime import datetime, time, timedelta

from django import forms
from django.utils import timezone

from core.services import MAX_LIFETIME, NAME_MAX_LENGTH


class ApiTokenForm(forms.Form):
    """The new-token form. Expiry: a number of days, or a date, or neither (no expiry)."""

    name = forms.CharField(
        max_length=NAME_MAX_LENGTH, help_text="What uses it, e.g. “laptop” or “sweep script”"
    )
    expires_in_days = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_LIFETIME.days,
        label="Expires in (days)",
        help_text=f"1–{MAX_LIFETIME.days}; empty and no date: never expires",
    )
    expires_on = forms.DateField(
        required=False,
        label="or expires on",
        help_text="a date, YYYY-MM-DD; the token stops working at the start of that day",
        widget=forms.DateInput(attrs={"type": "date"}),
    )

    def clean(self) -> dict:
        cleaned = super().clean() or {}
        days = cleaned.get("expires_in_days")
        day = cleaned.get("expires_on")
        if days is not None and day is not None:
            self.add_error("expires_on", "Give a number of days or a date, not both.")
        elif day is not None and day <= timezone.localdate():
            self.add_error("expires_on", "The date must be after today.")
        return cleaned

    def expires_at(self) -> datetime | None:
        days = self.cleaned_data.get("expires_in_days")
        if days is not None:
            return timezone.now() + timedelta(days=days)
        day = self.cleaned_data.get("expires_on")
        if day is not None:
            return timezone.make_aware(datetime.combine(day, time.min))
        return None

    def attach_error(self, field: str, message: str) -> None:
        """Put a service's FieldError on the field the person filled in."""
        if field == "expires_at":
            field = "expires_on" if self.cleaned_data.get("expires_on") else "expires_in_days"
        if field in self.fields:
            self.add_error(field, message)
        else:
            self.add_error(None, f"{field}: {message}")
