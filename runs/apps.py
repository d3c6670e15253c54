from django.apps import AppConfig


class RunsConfig(AppConfig):
    """The engine for anything Gantry runs as a Slurm job. One table of its own: requests
    to act on a Slurm job (``SlurmRequest``), for every kind."""

    name = "runs"
    verbose_name = "Slurm runs"
