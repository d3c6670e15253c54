"""Map a Gantry user to their account on a cluster (or list / remove mappings)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from core.errors import ApplicationError
from nodes.access.identities import (
    cluster_identity_delete,
    cluster_identity_list,
    cluster_identity_set,
)
from nodes.models import Cluster


class Command(BaseCommand):
    help = (
        "Map a Gantry user to the cluster account their work runs as (audited, as the "
        "command line); --list shows the mappings, --remove drops one."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--cluster", required=True, help="the cluster's name in Gantry")
        parser.add_argument("--user", help="the Gantry user name")
        parser.add_argument("--account", help="the Unix user on the cluster")
        parser.add_argument("--remove", action="store_true", help="remove --user's mapping")
        parser.add_argument("--list", action="store_true", help="list the mappings")

    def handle(self, *args: Any, **options: Any) -> None:
        cluster = Cluster.objects.filter(name=options["cluster"]).first()
        if cluster is None:
            raise CommandError(f"no cluster named {options['cluster']!r}")
        if options["list"]:
            for identity in cluster_identity_list(cluster=cluster):
                self.stdout.write(f"{identity.user.get_username()} -> {identity.account}")
            return
        if not options["user"]:
            raise CommandError("--user is required")
        user = get_user_model().objects.filter(username=options["user"]).first()
        if user is None:
            raise CommandError(f"no Gantry user named {options['user']!r}")
        try:
            if options["remove"]:
                mapped = cluster_identity_list(cluster=cluster).filter(user=user).first()
                if mapped is not None:
                    cluster_identity_delete(actor=None, identity=mapped)
                self.stdout.write(f"{user.get_username()} has no account on {cluster.name} now")
                return
            if not options["account"]:
                raise CommandError("--account is required")
            identity = cluster_identity_set(
                actor=None, cluster=cluster, user=user, account=options["account"]
            )
        except ApplicationError as error:
            raise CommandError(error.message) from None
        self.stdout.write(
            f"{user.get_username()}'s work on {cluster.name} runs as {identity.account}"
        )
