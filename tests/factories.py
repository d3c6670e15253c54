from __future__ import annotations

from typing import Any

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from core.models import ApiToken
from core.roles import roles_sync
from jobs.models import Checkpoint, Job
from nodes.models import Cluster, Gpu, Node, Partition, Switch


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.org")
    password = factory.django.Password("correct-horse-battery")

    @factory.post_generation
    def role(self, create: bool, extracted: str | None, **kwargs: object) -> None:
        if create and extracted:
            if not Group.objects.filter(name=extracted).exists():
                # A transactional test flushed the tables, the migration's groups with them.
                roles_sync()
            self.groups.add(Group.objects.get(name=extracted))


def legacy_api_token(*, user: Any, key: str, name: str = "converted") -> ApiToken:
    """A legacy token for DRF authtoken ``key``, as migration core 0004 makes one (directly
    in the database, as that migration does: no audit event)."""
    return ApiToken.objects.create(
        user=user,
        name=name,
        prefix=key[: ApiToken.LEGACY_SHOWN_PREFIX_LENGTH],
        key_hash=ApiToken.hash_secret(key),
        legacy=True,
    )


# The test personas' accounts on every cluster (the dev cluster has these Unix users):
# jobs run as their submitter's account, so a persona without one could not submit.
PERSONA_ACCOUNTS = {"rita-researcher": "alice", "rob-researcher": "bob", "olivia-operator": "carol"}
# A stand-in user CA public key for clusters no test connects to as a user.
FAKE_USER_CA = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGFudHJ5IHRlc3QgdXNlciBDQSBub3QgYSBrZXkhISE= fake"
)


def map_personas(*, cluster: Cluster | None = None, user: Any = None) -> None:
    """Map the personas to their accounts: ``user`` on every cluster, or every persona on
    ``cluster`` (directly in the database, as a fixture: no audit event)."""
    from nodes.models import ClusterIdentity

    User = get_user_model()
    users = [user] if user is not None else list(User.objects.filter(username__in=PERSONA_ACCOUNTS))
    clusters = [cluster] if cluster is not None else list(Cluster.objects.all())
    for someone in users:
        account = PERSONA_ACCOUNTS.get(someone.get_username())
        if account is None:
            continue
        for each in clusters:
            if each.ssh_user != account:
                ClusterIdentity.objects.get_or_create(
                    cluster=each, user=someone, defaults={"account": account}
                )


class ClusterFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Cluster
        skip_postgeneration_save = True

    name = factory.Sequence(lambda n: f"cluster{n}")
    ssh_host = "127.0.0.1"
    ssh_port = factory.Sequence(lambda n: 20000 + n)
    ssh_user = "gantry"
    ssh_key_name = "id_test"
    workdir = "/srv/gantry"
    python = "/usr/bin/python3"
    default_partition = "batch"
    user_ca_public_key = FAKE_USER_CA

    @factory.post_generation
    def personas(self, create: bool, extracted: bool | None, **kwargs: object) -> None:
        # Pass personas=False for a cluster nobody is mapped on.
        if create and extracted is not False:
            map_personas(cluster=self)


class PartitionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Partition

    cluster = factory.SubFactory(ClusterFactory)
    name = "batch"
    max_time_minutes = 60


class SwitchFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Switch

    cluster = factory.SubFactory(ClusterFactory)
    name = factory.Sequence(lambda n: f"leaf{n}")


class NodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Node

    cluster = factory.SubFactory(ClusterFactory)
    name = factory.Sequence(lambda n: f"n{n}")
    state = Node.State.IDLE
    cpus_total = 2
    memory_mb = 4000
    partitions = factory.LazyFunction(lambda: ["batch"])


class GpuFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Gpu

    node = factory.SubFactory(NodeFactory)
    index = factory.Sequence(lambda n: n % 8)
    gpu_type = "a100"
    state = Gpu.State.FREE


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job

    owner = factory.SubFactory(UserFactory, role="researchers")
    cluster = factory.SubFactory(ClusterFactory)
    name = factory.Sequence(lambda n: f"job-{n}")
    partition = "batch"
    config = factory.LazyFunction(lambda: {"preset": "tiny"})


class CheckpointFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Checkpoint

    job = factory.SubFactory(JobFactory)
    step = factory.Sequence(lambda n: (n + 1) * 100)
    path = factory.LazyAttribute(lambda c: f"/runs/{c.job.id}/checkpoints/step-{c.step:06d}")
