"""Show (creating it if missing) a cluster's user CA: its public key(s) and the sshd lines."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from nodes.access.identities import (
    cluster_user_ca_ensure,
    sshd_config_lines,
    trusted_ca_file,
    trusted_ca_keys,
)
from nodes.models import Cluster


class Command(BaseCommand):
    help = (
        "Print the public key of a cluster's user CA (created if missing, audited) and the "
        "lines its login node's sshd_config needs. The private key is never printed."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--cluster", required=True, help="the cluster's name in Gantry")
        parser.add_argument(
            "--public-key", action="store_true", help="print only the public key line"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        cluster = Cluster.objects.filter(name=options["cluster"]).first()
        if cluster is None:
            raise CommandError(f"no cluster named {options['cluster']!r}")
        if cluster.user_auth != Cluster.UserAuth.CERTIFICATE:
            raise CommandError(f"{cluster.name} does not use certificates ({cluster.user_auth})")
        public = cluster_user_ca_ensure(actor=None, cluster=cluster)
        if options["public_key"]:
            # The key Gantry signs with (during a rotation the next one is trusted too).
            self.stdout.write(public)
            return
        self.stdout.write(f"Put these lines in {trusted_ca_file(cluster)} on the login node:")
        self.stdout.write("\n".join(trusted_ca_keys(cluster)))
        self.stdout.write(
            "install scripts/gantry-principals as /usr/local/sbin/gantry-principals (root, "
            "mode 755) and add to its sshd_config (then reload sshd):"
        )
        self.stdout.write("\n".join(sshd_config_lines(cluster)))
