"""Django-free Slurm adapter: SSH transport, command builders, parsers, client.

Layers (each importable on its own): ``errors`` -> ``hostlist``/``units`` ->
``parsers`` -> ``commands``; ``certificates`` (the user CA, short-lived certificates) ->
``connect`` -> ``sftp`` -> ``transport`` (with the per-identity pool) -> ``client``.
"""
