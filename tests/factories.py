from __future__ import annotations

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

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


class ClusterFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Cluster

    name = factory.Sequence(lambda n: f"cluster{n}")
    ssh_host = "127.0.0.1"
    ssh_port = factory.Sequence(lambda n: 20000 + n)
    ssh_user = "gantry"
    ssh_key_name = "id_test"
    workdir = "/srv/gantry"
    python = "/usr/bin/python3"
    default_partition = "batch"


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
