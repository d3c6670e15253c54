"""Template filters for goodput and work at risk: durations and ratios in words."""

from __future__ import annotations

from django import template

from jobs.goodput.ledger import format_duration

register = template.Library()


@register.filter
def duration(seconds: float | None) -> str:
    """``{{ 5400|duration }}`` → ``1.5 h`` (see ``jobs.goodput.ledger.format_duration``)."""
    return format_duration(seconds)


@register.filter
def ratio_percent(ratio: float | None) -> str:
    """``{{ 0.912|ratio_percent }}`` → ``91.2%``; ``—`` for None."""
    return "—" if ratio is None else f"{100 * ratio:.1f}%"
