"""Rotate a cluster's user CA in two steps (``nodes.access.ca_rotation``): a new CA the login nodes
trust beside the old one, then ``--finish``: Gantry signs with the new one, the old goes."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from core.errors import ApplicationError
from nodes.access.ca_rotation import cluster_user_ca_rotate, cluster_user_ca_rotate_finish
from nodes.access.identities import trusted_ca_file
from nodes.models import Cluster


class Command(BaseCommand):
    help = (
        "Rotate a cluster's user CA (audited). Without --finish: make the next CA and print "
        "both public key lines for the login nodes' TrustedUserCAKeys file (Gantry keeps "
        "signing with the current one). With --finish, once every login node trusts both: "
        "sign with the new CA and print the one line the file keeps. Run it where the "
        "Celery workers run (it reads the CA keys); private keys are never printed."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--cluster", required=True, help="the cluster's name in Gantry")
        parser.add_argument(
            "--finish",
            action="store_true",
            help="sign with the new CA from now on and stop trusting the old one",
        )
        parser.add_argument(
            "--public-keys", action="store_true", help="print only the trusted public key lines"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        cluster = Cluster.objects.filter(name=options["cluster"]).first()
        if cluster is None:
            raise CommandError(f"no cluster named {options['cluster']!r}")
        try:
            if options["finish"]:
                lines = cluster_user_ca_rotate_finish(actor=None, cluster=cluster)
            else:
                lines = cluster_user_ca_rotate(actor=None, cluster=cluster)
        except ApplicationError as error:
            raise CommandError(error.message) from None
        if options["public_keys"]:
            self.stdout.write("\n".join(lines))
            return
        where = trusted_ca_file(cluster)
        if options["finish"]:
            self.stdout.write(f"Gantry signs with the new CA now. {where} keeps only:")
            self.stdout.write("\n".join(lines))
            self.stdout.write("Remove the old line from it on every login node.")
            return
        self.stdout.write(
            f"Put both lines in {where} on every login node (Gantry still signs with the "
            "first), then run this again with --finish:"
        )
        self.stdout.write("\n".join(lines))
