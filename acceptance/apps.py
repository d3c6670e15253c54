from django.apps import AppConfig


class AcceptanceConfig(AppConfig):
    """Acceptance runs of an allocation and the certificates they issue."""

    name = "acceptance"
    verbose_name = "Acceptance"
