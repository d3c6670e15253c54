"""``manage.py cluster_add`` sets the cluster's drill verifier from ``--verifier`` or the
env file's ``GANTRY_CLUSTER_VERIFIER`` (so ``make run`` registers the dev cluster with its
verifier and its drills count as proof), validated and audited."""

from __future__ import annotations

import pytest
from django.core.management import CommandError

from core.models import AuditEvent
from factories import ClusterFactory
from nodes.management.commands.cluster_add import _set_verifier

pytestmark = pytest.mark.django_db


def test_the_verifier_is_set_and_audited() -> None:
    cluster = ClusterFactory(ssh_user="svc")
    _set_verifier(cluster, "gantry-verify")
    cluster.refresh_from_db()
    assert cluster.verifier_account == "gantry-verify"
    event = AuditEvent.objects.get(action="cluster.update")
    assert event.details["after"] == {"verifier_account": "gantry-verify"}


def test_the_service_account_is_refused_as_the_verifier() -> None:
    cluster = ClusterFactory(ssh_user="svc")
    with pytest.raises(CommandError, match="verifier 'svc'"):
        _set_verifier(cluster, "svc")
    cluster.refresh_from_db()
    assert cluster.verifier_account == ""
