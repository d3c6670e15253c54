from django.apps import AppConfig


class RecoveryConfig(AppConfig):
    """Automatic recovery on proof: incidents, the cluster's recovery policy, suspect nodes."""

    name = "recovery"
    verbose_name = "Recovery"
