"""Set where a cluster's health probes are collected from (``HealthSource``), from the
command line: --env-file (GANTRY_CLUSTER_NAME, GANTRY_CLUSTER_HEALTH_DIR, as written by
scripts/devcluster) or the options. Validated and audited like an operator's change (the
actor is Gantry's command line)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from core.errors import ApplicationError
from health.operators import health_source_update
from nodes.management.commands.cluster_add import read_env_file
from nodes.models import Cluster


class Command(BaseCommand):
    help = "Set a cluster's health directory (where its health-check hook writes <node>.json)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--env-file", type=Path, help="KEY=value file with GANTRY_CLUSTER_*")
        parser.add_argument("--cluster", help="the cluster's name in Gantry")
        parser.add_argument("--directory", help="the health directory (GANTRY_CLUSTER_HEALTH_DIR)")
        parser.add_argument("--interval", type=int, help="collect every so many seconds")
        parser.add_argument("--disable", action="store_true", help="stop collecting")

    def handle(self, *args: Any, **options: Any) -> None:
        env: dict[str, str] = {}
        if options["env_file"]:
            if not options["env_file"].exists():
                raise CommandError(f"{options['env_file']} does not exist")
            env = read_env_file(options["env_file"])
        name = options["cluster"] or env.get("GANTRY_CLUSTER_NAME", "")
        cluster = Cluster.objects.filter(name=name).first()
        if cluster is None:
            raise CommandError(f"no cluster named {name!r} (register it with cluster_add)")
        values: dict[str, Any] = {"enabled": not options["disable"]}
        directory = options["directory"] or env.get("GANTRY_CLUSTER_HEALTH_DIR", "")
        if directory:
            values["directory"] = directory
        if options["interval"] is not None:
            values["interval_seconds"] = options["interval"]
        try:
            source = health_source_update(actor=None, cluster=cluster, system=True, **values)
        except ApplicationError as error:
            raise CommandError(error.message) from None
        state = "enabled" if source.enabled else "disabled"
        self.stdout.write(
            f"cluster {cluster.name}: health probes from {source.directory} every "
            f"{source.interval_seconds} s ({state})"
        )
