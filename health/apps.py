from django.apps import AppConfig


class HealthConfig(AppConfig):
    """GPU and node health from probes, and software-stack drift."""

    name = "health"
    verbose_name = "Health"
