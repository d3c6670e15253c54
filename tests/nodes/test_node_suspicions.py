"""A node's page shows suspicion evidence (other people's job ids, steps, losses) to
operators only: a researcher sees that the node is suspected and how much, never another
person's run in it. The personas: an operator and two researchers."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from recovery_support import crash_incident

from factories import ClusterFactory, JobFactory, NodeFactory
from recovery.models import SuspectNode
from recovery.selectors import node_suspicions_for_user

pytestmark = pytest.mark.django_db

# What another researcher's incident wrote about the node: a job id, a step, a loss.
EVIDENCE = "job 771234: rank(s) 3 on rack9-n2 slower than peers at step 48213, loss 1.9375"


@pytest.fixture
def suspected(researcher: Any, other_researcher: Any) -> Any:
    """rack9-n2, suspected in an incident of the other researcher's run (open) and in one
    of the researcher's own (cleared)."""
    cluster = ClusterFactory()
    node = NodeFactory(cluster=cluster, name="rack9-n2")
    theirs = JobFactory(
        owner=other_researcher, cluster=cluster, name="rob-secret-run", slurm_job_id="771234"
    )
    SuspectNode.objects.create(node=node, incident=crash_incident(theirs), evidence=EVIDENCE)
    mine = JobFactory(owner=researcher, cluster=cluster, slurm_job_id="771235")
    SuspectNode.objects.create(
        node=node,
        incident=crash_incident(mine),
        evidence="job 771235: srun reported task 0 first",
        cleared_at=mine.created_at,
    )
    return node


def _page(user: Any, node: Any) -> str:
    client = Client()
    client.force_login(user)
    answer = client.get(f"/nodes/{node.pk}/")
    assert answer.status_code == 200
    return answer.content.decode()


def test_an_operator_sees_the_evidence_and_the_runs(operator: Any, suspected: Any) -> None:
    page = _page(operator, suspected)
    assert 'data-testid="node-incidents"' in page
    assert EVIDENCE in page and "rob-secret-run" in page
    assert "Suspected: 1 open suspicion from the runs of 1 owner" in page


@pytest.mark.parametrize("who", ["researcher", "other_researcher"])
def test_a_researcher_sees_that_it_is_suspected_not_the_evidence(
    who: str, suspected: Any, request: pytest.FixtureRequest
) -> None:
    page = _page(request.getfixturevalue(who), suspected)
    assert "Suspected: 1 open suspicion from the runs of 1 owner" in page
    assert "1 cleared by operators" in page
    assert "The evidence (other people's runs) is shown to operators." in page
    assert 'data-testid="node-incidents"' not in page
    for secret in ("771234", "48213", "1.9375", "rob-secret-run", "771235"):
        assert secret not in page, secret


def test_the_selector_gives_a_researcher_counts_only(
    researcher: Any, operator: Any, suspected: Any
) -> None:
    mine = node_suspicions_for_user(user=researcher, node=suspected)
    assert (mine.open, mine.cleared, mine.owners) == (1, 1, 1)
    assert mine.rows == [] and not mine.shows_evidence
    theirs = node_suspicions_for_user(user=operator, node=suspected)
    assert len(theirs.rows) == 2 and theirs.shows_evidence


def test_a_node_nobody_suspected_says_so(researcher: Any) -> None:
    node = NodeFactory(name="rack9-n3")
    page = _page(researcher, node)
    assert 'data-testid="node-incidents-empty"' in page and "Suspected" not in page
