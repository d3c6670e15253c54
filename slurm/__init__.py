"""Gantry's Slurm adapter: a library beside the trainer, with no Django and no Gantry app
(the import contract in pyproject.toml holds it to that). SSH transport, Slurm command
builders, parsers, the client.

Layers (each importable on its own): ``errors`` -> ``hostlist``/``units`` ->
``parsers`` -> ``commands``; ``certificates`` (the user CA, short-lived certificates) ->
``connect`` -> ``sftp`` -> ``transport`` (with the per-identity pool) -> ``client``.
The parsers are tested against real outputs recorded per Slurm version
(``tests/slurm/data/slurm-<version>/``: every test of a recording runs once per version
folder found there).
"""
