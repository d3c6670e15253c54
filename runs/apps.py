from django.apps import AppConfig


class RunsConfig(AppConfig):
    """The engine for anything Gantry runs as a Slurm job. No tables of its own."""

    name = "runs"
    verbose_name = "Slurm runs"
