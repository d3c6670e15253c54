"""Why a job is pending, in plain words: Slurm's pending reason codes explained.

The watcher stores Slurm's reason in ``Job.state_reason`` as squeue gives it: usually a
bare code (``Resources``), sometimes with detail after a comma
(``ReqNodeNotAvail, UnavailableNodes:n[1-2]``) or in parentheses as squeue's text output
prints it. Pure functions, no Django: any text in, words out, never an exception.
"""

from __future__ import annotations

import re

# The explanations of the codes a person meets most, keyed by the code in lower case
# (Slurm's spelling varies between versions: JobHeldUser, "launch failed requeued held").
_EXPLANATIONS: dict[str, str] = {
    "none": (
        "Slurm has not given a reason yet: the scheduler has not looked at the job since it "
        "was submitted."
    ),
    "resources": (
        "Waiting for resources: the nodes or GPUs it asks for are in use now. It starts as "
        "soon as enough of them free up."
    ),
    "priority": (
        "Other jobs with a higher priority are ahead of it for the same resources. It starts "
        "when they have started and its resources are free."
    ),
    "dependency": "Waiting for a job it depends on to reach the required state.",
    "dependencyneversatisfied": (
        "A job it depends on ended in a way that can never satisfy the dependency: this job "
        "will never start. Cancel it (and fix the dependency if you resubmit)."
    ),
    "reqnodenotavail": (
        "A node it needs is not available: down, drained, or reserved for something else. "
        "It waits until the node returns."
    ),
    "reserved for maintenance": (
        "The nodes it needs are reserved for maintenance. It starts after the maintenance "
        "window, if its time limit still fits."
    ),
    "nodedown": "A node it needs is down. It waits until the node is back.",
    "partitionnodelimit": (
        "It asks for more nodes (or fewer) than the partition allows per job: it will not "
        "start as requested. Ask for a node count within the partition's limits."
    ),
    "partitiontimelimit": (
        "Its time limit is longer than the partition's maximum: it will not start as "
        "requested. Ask for a shorter time limit."
    ),
    "partitiondown": "The partition is down: no job starts in it until an operator brings it up.",
    "partitioninactive": "The partition is inactive: no job starts in it until it is enabled.",
    "partitionconfig": (
        "It asks for something the partition's configuration does not allow (a node list, "
        "an account or a QOS the partition refuses)."
    ),
    "jobhelduser": "Held by its owner (scontrol hold): it stays pending until it is released.",
    "jobheldadmin": "Held by an administrator: it stays pending until an operator releases it.",
    "held": "Held: it stays pending until it is released.",
    "beginning": "Its requested start time (--begin) is still in the future.",
    "begintime": "Its requested start time (--begin) is still in the future.",
    "launch failed requeued held": (
        "Slurm could not launch it on its nodes, requeued it and held it: an operator should "
        "look at the node, then release the job."
    ),
    "jobholdmaxrequeue": (
        "It was requeued too many times and is held: an operator must release it."
    ),
    "badconstraints": (
        "No node in the partition can meet its constraints (features, GPU type, memory or "
        "node list) as configured: it will not start as requested. Loosen the request."
    ),
    "invalidqos": (
        "Its QOS (quality of service) is not valid for its account or partition: it will not "
        "start. Resubmit with a valid QOS."
    ),
    "invalidaccount": (
        "Its account is not valid (unknown, or not allowed on this partition): it will not "
        "start. Resubmit with a valid account."
    ),
    "qosmaxjobsperuserlimit": (
        "The QOS allows each user only so many running jobs at once, and the owner is at "
        "that limit. It starts when one of the owner's running jobs ends."
    ),
    "qosmaxsubmitjobperuserlimit": (
        "The QOS allows each user only so many submitted jobs at once, and the owner is at "
        "that limit."
    ),
    "qosmaxgresperuser": (
        "The QOS caps the GPUs (GRES) one user may hold at once, and the owner's running "
        "jobs use them. It starts when enough of them free up."
    ),
    "qosgrpgres": (
        "The QOS's group limit on GPUs (GRES) is reached by all jobs under that QOS. It "
        "starts when enough of them free up."
    ),
    "assocgrpgres": (
        "The account's group limit on GPUs (GRES) is reached by the jobs of that account. "
        "It starts when enough of them free up."
    ),
    "assocmaxjobslimit": (
        "The account allows only so many running jobs at once per user, and that limit is "
        "reached. It starts when one of them ends."
    ),
    "assocgrpjobslimit": (
        "The account's group limit on running jobs is reached. It starts when one of them ends."
    ),
    "qosjoblimit": "The QOS's limit on jobs is reached. It starts when usage drops.",
    "qosresourcelimit": "A resource limit of the QOS is reached. It starts when usage drops.",
    "qostimelimit": (
        "Its time limit is longer than the QOS allows: it will not start as requested."
    ),
    "qosusagethreshold": (
        "The QOS's usage threshold is exceeded (fair-share usage). It waits for usage to decay."
    ),
    "reservation": "Waiting for its advance reservation to start.",
    "licenses": "Waiting for licenses it asked for to become available.",
    "cleaning": "It was requeued and Slurm is still cleaning up after its previous run.",
    "prolog": "The node prolog is running: it starts as soon as the prolog finishes.",
    "configuring": "Its nodes are booting or being configured: it starts once they are up.",
    "powerup": "Its nodes are being powered up: it starts once they are up.",
    "nodeconfig": "Its nodes are being reconfigured: it starts once they are ready.",
    "frontenddown": "The Slurm front end node is down: no job starts until it is back.",
    "systemfailure": "Slurm hit a system failure scheduling it: ask an operator.",
    "deadline": "Its deadline (--deadline) cannot be met: Slurm will not start it.",
    "jobarraytasklimit": (
        "The job array's limit on tasks running at once (%N) is reached. It starts when "
        "another task of the array ends."
    ),
    "burstbufferresources": "Waiting for burst buffer resources.",
    "burstbufferstagein": "Slurm is staging in its burst buffer data.",
    "waitingforscheduling": "Waiting for the scheduler to consider it: nothing is wrong yet.",
    "scheddefault": "Waiting for the scheduler to consider it: nothing is wrong yet.",
    "inactivelimit": "It reached the inactivity limit.",
}

# squeue's text output can give ReqNodeNotAvail in long form.
_LONG_FORMS: dict[str, str] = {
    "nodes required for job are down, drained or reserved for jobs in higher priority "
    "partitions": "reqnodenotavail",
}

# Words for the resource named in a QOS*/Assoc* limit code, most specific first.
_LIMIT_RESOURCES: tuple[tuple[str, str], ...] = (
    ("gresrunminutes", "GPU (GRES) minutes of running jobs"),
    ("cpurunminutes", "CPU minutes of running jobs"),
    ("memrunminutes", "memory minutes of running jobs"),
    ("noderunminutes", "node minutes of running jobs"),
    ("gres", "GPUs (GRES)"),
    ("cpu", "CPUs"),
    ("node", "nodes"),
    ("mem", "memory"),
    ("submit", "submitted jobs"),
    ("jobs", "running jobs"),
    ("wall", "run time"),
    ("billing", "billing units"),
    ("energy", "energy"),
    ("license", "licenses"),
)

_DETAIL_LABELS: dict[str, str] = {"unavailablenodes": "Unavailable nodes"}


def pending_reason_parts(reason: str | None) -> tuple[str, str]:
    """``"(ReqNodeNotAvail, UnavailableNodes:n[1-2])"`` -> ``("ReqNodeNotAvail",
    "UnavailableNodes:n[1-2]")``; empty or missing -> ``("None", "")``."""
    text = " ".join(str(reason or "").split())
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1].strip()
    if not text:
        return "None", ""
    if text.lower() in _LONG_FORMS:
        return text, ""
    code, _comma, detail = text.partition(",")
    return code.strip() or "None", detail.strip()


def _limit_explained(code: str) -> str | None:
    """A QOS*/Assoc* limit code not in the table, decoded from its parts: ``QOSGrpCpuLimit``
    is the QOS's group limit on CPUs, ``AssocMaxWallDurationPerJobLimit`` the account's
    per-job limit on run time."""
    match = re.match(r"^(qos|assoc)(grp|max|min)?(.+)$", code.lower())
    if match is None:
        return None
    scope, kind, rest = match.groups()
    owner = "the QOS's" if scope == "qos" else "the account's"
    what = next((words for key, words in _LIMIT_RESOURCES if key in rest), "resources")
    if kind == "min":
        return f"It asks for less than {owner} minimum of {what}: it will not start as requested."
    if "perjob" in rest:
        return (
            f"It asks for more than {owner} per-job limit on {what} allows: it will not start "
            "as requested."
        )
    if kind == "grp":
        limit = f"group limit on {what}, shared by all jobs under it"
    elif "peruser" in rest:
        limit = f"per-user limit on {what}"
    else:
        limit = f"limit on {what}"
    return f"A limit is reached: {owner} {limit}. It starts when usage under that limit drops."


def pending_reason_explained(reason: str | None) -> str:
    """Slurm's pending reason in plain words; an unknown code reads ``Slurm says: <code>``.

    Only string operations and lookups: no input makes it raise.
    """
    code, detail = pending_reason_parts(reason)
    lowered = code.lower()
    key = _LONG_FORMS.get(lowered, lowered)
    # "ReqNodeNotAvail, Reserved for maintenance": the detail is the more precise reason.
    if key == "reqnodenotavail" and detail.lower() in _EXPLANATIONS:
        key, detail = detail.lower(), ""
    explanation = _EXPLANATIONS.get(key) or _limit_explained(key)
    if explanation is None:
        return f"Slurm says: {code}, {detail}" if detail else f"Slurm says: {code}"
    if detail:
        label, colon, value = detail.partition(":")
        if colon and label.strip().lower() in _DETAIL_LABELS:
            detail = f"{_DETAIL_LABELS[label.strip().lower()]}: {value.strip()}"
        explanation = f"{explanation} ({detail})"
    return explanation


def pending_reason(reason: str | None) -> dict[str, str]:
    """``{"code": ..., "explanation": ...}`` for the API and the page."""
    code, _detail = pending_reason_parts(reason)
    return {"code": code, "explanation": pending_reason_explained(reason)}
