from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """Pages that combine apps, and the Prometheus exporter. No tables of its own."""

    name = "console"
    verbose_name = "Console"
