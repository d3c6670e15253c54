"""Celery task names, in one place.

A service that must start work after its transaction commits sends the task by name
(``transaction.on_commit(lambda: task_send(JOB_SUBMIT, job_id))``), so services never
import task modules and task modules import their services: no import cycles.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

PING = "core.ping"
CLUSTER_SYNC = "nodes.cluster_sync"
CLUSTERS_SYNC_DUE = "nodes.clusters_sync_due"
# The signer queue's (nodes.access.signer): certificates and the CA's public key for web processes.
USER_CERTIFICATE_SIGN = "nodes.user_certificate_sign"
USER_CA_ENSURE = "nodes.user_ca_ensure"
JOB_SUBMIT = "jobs.submit"
DRILL_SUBMIT = "drills.submit"
# A person's cancel, hold or release of any kind's Slurm job, carried out as its account.
SLURM_REQUEST_CARRY_OUT = "runs.request_carry_out"
# A job's log tail read (bounded) as its account, for the page to show.
JOB_LOG_TAIL_READ = "jobs.log_tail_read"
CHECKPOINT_VERIFY = "drills.checkpoint_verify"
DRILL_POLICIES_APPLY = "drills.policies_apply"
ACCEPTANCE_STEP_SUBMIT = "acceptance.step_submit"
CLUSTER_RECONCILE = "watcher.cluster_reconcile"
CLUSTERS_RECONCILE_DUE = "watcher.clusters_reconcile_due"
STUDIES_ADVANCE = "studies.advance_all"
NOTIFICATIONS_COLLECT = "notifications.collect"
NOTIFICATION_DELIVER = "notifications.deliver"
# Beat: enqueue a health collection per cluster whose turn has come; one collection.
HEALTH_COLLECT = "health.collect"
HEALTH_COLLECT_CLUSTER = "health.collect_cluster"
METRICS_ROLLUP = "jobs.metrics_rollup"
# The overview's goodput table, computed again off the request path (console.overview).
OVERVIEW_GOODPUT_REFRESH = "console.overview_goodput_refresh"


def task_send(name: str, *args: Any) -> bool:
    """Enqueue task ``name``; False (logged) when the broker cannot take it now.

    Callers rely on a periodic task to pick up what could not be enqueued (the watcher
    re-enqueues queued jobs and drills, beat re-enqueues due syncs), so a Redis outage
    never turns into an error for the person who clicked.
    """
    from celery import current_app

    try:
        # Fire and forget: nothing waits for a result, and subscribing for one would make a
        # publish wait out the result backend's reconnect loop (seconds) while Redis is down.
        current_app.send_task(name, args=list(args), ignore_result=True)
    except Exception:
        logger.warning("could not enqueue %s%r; a periodic task will pick it up", name, args)
        return False
    return True
