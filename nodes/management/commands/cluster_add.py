"""Register (or update) a cluster from the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from core.errors import ApplicationError
from nodes.registration import cluster_register
from nodes.sync import cluster_sync


def read_env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        values[key.strip()] = value.strip().strip("'\"")
    return values


class Command(BaseCommand):
    help = (
        "Register a Slurm cluster: connect over SSH, show and pin the host key, probe Slurm. "
        "Either --env-file (as written by scripts/devcluster) or the individual options."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--env-file", type=Path, help="KEY=value file with GANTRY_CLUSTER_*")
        parser.add_argument("--name")
        parser.add_argument("--host")
        parser.add_argument("--port", type=int, default=None)
        parser.add_argument("--user")
        parser.add_argument("--key-file", type=Path, help="private key to copy (kept 0600)")
        parser.add_argument("--workdir", help="Gantry's work directory on the cluster")
        parser.add_argument("--python", help="the Python (with torch) to run the trainer")
        parser.add_argument("--default-partition", default=None)
        parser.add_argument(
            "--fingerprint", help="expected host key fingerprint (SHA256:...); refused if different"
        )
        parser.add_argument(
            "--trust-on-first-use",
            action="store_true",
            help="without --fingerprint: pin whatever host key the server presents now",
        )
        parser.add_argument(
            "--user-auth",
            choices=["certificate", "user_keys", "service_account"],
            help="how Gantry acts as users there (a new cluster: certificate; service_account "
            "is the legacy single-account mode, only when chosen)",
        )
        parser.add_argument(
            "--verifier",
            default=None,
            help="the account restore drills that count as proof run as (GANTRY_CLUSTER_VERIFIER)",
        )
        parser.add_argument("--default", action="store_true", help="make it the default cluster")
        parser.add_argument("--sync", action="store_true", help="sync the inventory right away")

    def handle(self, *args: Any, **options: Any) -> None:
        env: dict[str, str] = {}
        if options["env_file"]:
            if not options["env_file"].exists():
                raise CommandError(f"{options['env_file']} does not exist")
            env = read_env_file(options["env_file"])

        def pick(option: str, key: str, required: bool = True) -> str:
            value = options.get(option)
            if value in (None, ""):
                value = env.get(key, "")
            if required and not value:
                raise CommandError(f"--{option.replace('_', '-')} (or {key}) is required")
            return str(value)

        key_file = Path(pick("key_file", "GANTRY_CLUSTER_KEY"))
        try:
            private_key = key_file.read_text()
        except OSError as error:
            raise CommandError(
                f"cannot read the private key {key_file}: {error.strerror}"
            ) from None
        try:
            port = int(pick("port", "GANTRY_CLUSTER_PORT", required=False) or 22)
        except ValueError:
            raise CommandError("--port must be a number") from None
        try:
            registration = cluster_register(
                actor=None,
                name=pick("name", "GANTRY_CLUSTER_NAME"),
                ssh_host=pick("host", "GANTRY_CLUSTER_HOST"),
                ssh_port=port,
                ssh_user=pick("user", "GANTRY_CLUSTER_USER"),
                private_key=private_key,
                workdir=pick("workdir", "GANTRY_CLUSTER_WORKDIR"),
                python=pick("python", "GANTRY_CLUSTER_PYTHON"),
                default_partition=pick(
                    "default_partition", "GANTRY_CLUSTER_DEFAULT_PARTITION", required=False
                ),
                expected_fingerprint=pick(
                    "fingerprint", "GANTRY_CLUSTER_HOST_FINGERPRINT", required=False
                )
                or None,
                is_default=options["default"],
                update_existing=True,
                sync=False,
                trust_on_first_use=options["trust_on_first_use"],
                user_auth=options["user_auth"],
            )
        except ApplicationError as error:
            raise CommandError(error.message) from None
        cluster = registration.cluster
        verifier = pick("verifier", "GANTRY_CLUSTER_VERIFIER", required=False)
        if verifier and verifier != cluster.verifier_account:
            _set_verifier(cluster, verifier)
        info = registration.info
        verb = "registered" if registration.created else "updated"
        self.stdout.write(
            f"cluster {cluster.name} {verb}: {cluster.ssh_user}@{cluster.ssh_host}:"
            f"{cluster.ssh_port}, host key {cluster.host_key_type} "
            f"{registration.fingerprint_seen} (pinned)"
        )
        partitions = ", ".join(p.name + ("*" if p.default else "") for p in info.partitions)
        accounting = "available" if info.accounting_available else "NOT available"
        self.stdout.write(
            f"Slurm {info.slurm_version}, cluster name {info.cluster_name}, "
            f"partitions {partitions}, accounting {accounting}"
        )
        self.stdout.write(f"users' work runs via: {cluster.user_auth}")
        if options["sync"]:
            result = cluster_sync(cluster_id=cluster.pk)
            if not result.ok:
                raise CommandError(f"sync failed: {result.error}")
            self.stdout.write(f"synced: {result.nodes_seen} nodes")


def _set_verifier(cluster: Any, account: str) -> None:
    """The cluster's drill verifier (``Cluster.verifier_account``), validated like an
    operator's change and audited as Gantry's own (the command line)."""
    from django.core.exceptions import ValidationError
    from django.db import transaction

    from core.audit import AuditAction, audit_event_record

    before = cluster.verifier_account
    cluster.verifier_account = account
    others = [field.name for field in cluster._meta.fields if field.name != "verifier_account"]
    try:
        cluster.clean_fields(exclude=others)
        cluster.clean()
    except ValidationError as error:
        raise CommandError(f"verifier {account!r}: {'; '.join(error.messages)}") from None
    with transaction.atomic():
        cluster.save(update_fields=["verifier_account"])
        audit_event_record(
            actor=None,
            action=AuditAction.CLUSTER_UPDATE,
            target=cluster,
            details={
                "before": {"verifier_account": before},
                "after": {"verifier_account": account},
            },
        )
