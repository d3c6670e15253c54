"""Django-free Slurm adapter: SSH transport, command builders, parsers, client.

Layers (each importable on its own): ``errors`` -> ``hostlist``/``units`` ->
``parsers`` -> ``commands`` -> ``transport`` -> ``client``.
"""
