"""Job templates (a job's settings under a name, private or shared) and "run again".

Reads: ``job_template_list_for_user`` / ``job_template_get_for_user``, the one access rule
for templates: its owner and operators see a private template, everyone with a role sees
a shared one; anyone else gets the same not-found as for a template that does not exist.
Changing or deleting one is ``core.access.can_act`` (owner or operator). Submitting from a
shared template submits as the person who clicks, on their own account; someone else's
template that sets environment variables is never applied unseen: the submitter confirms
that environment (``template_environment_to_confirm``).

Writes validate the settings against the cluster (as a submit would), run in one
transaction and write one audit event each.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.http import Http404

from core.access import is_own, require_can_act
from core.audit import AuditAction, audit_event_record
from core.errors import FieldError
from core.roles import is_operator, is_researcher
from core.types import User
from jobs.compose.settings import job_request_from_values, job_settings, settings_clean
from jobs.lifecycle import job_event
from jobs.models import Job, JobEvent, JobTemplate
from jobs.placement import job_request_with_advice
from jobs.services import job_submit
from jobs.validation import CONTROL_CHARACTERS, job_request_validate
from nodes.models import Cluster

NAME_MAX_LENGTH = 128
DESCRIPTION_MAX_LENGTH = 512

# ---------------------------------------------------------------- reads


def job_template_list_for_user(*, user: User) -> QuerySet[JobTemplate]:
    """Templates ``user`` may see: their own and the shared ones; operators see all."""
    templates = JobTemplate.objects.select_related("owner", "cluster")
    if is_operator(user):
        return templates
    if not getattr(user, "is_authenticated", False) or not is_researcher(user):
        return templates.none()
    return templates.filter(Q(owner_id=user.pk) | Q(shared=True))


def job_template_get_for_user(*, user: User, template_id: Any) -> JobTemplate:
    """The one access check for a template: Http404 both for a missing template and for
    someone else's private one."""
    try:
        return job_template_list_for_user(user=user).get(pk=int(template_id))
    except (JobTemplate.DoesNotExist, ValueError, TypeError):
        raise Http404("No such template.") from None


# ---------------------------------------------------------------- writes


def _clean_name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise FieldError("name", "a name is required")
    name = name.strip()
    if len(name) > NAME_MAX_LENGTH:
        raise FieldError("name", f"at most {NAME_MAX_LENGTH} characters")
    if CONTROL_CHARACTERS.search(name):
        raise FieldError("name", "must not contain control characters such as newlines")
    return name


def _clean_description(description: Any) -> str:
    if not isinstance(description, str):
        raise FieldError("description", "must be text")
    if len(description) > DESCRIPTION_MAX_LENGTH:
        raise FieldError("description", f"at most {DESCRIPTION_MAX_LENGTH} characters")
    return description.strip()


def _checked_settings(settings: Any, cluster: Cluster) -> dict[str, Any]:
    """Settings of the right shape that the cluster can run (as a submit would check)."""
    clean = settings_clean(settings)
    if not clean["name"]:
        raise FieldError("settings.name", "the job name is required")
    job_request_validate(job_request_from_values(clean, cluster=cluster))
    return clean


def _require_role(user: User) -> None:
    if not is_researcher(user):
        raise PermissionDenied("You need the researcher or operator role to keep templates.")


def _save(template: JobTemplate, *, update_fields: list[str] | None = None) -> None:
    try:
        with transaction.atomic():
            template.save(update_fields=update_fields)
    except IntegrityError:
        raise FieldError("name", f"you have a template named {template.name!r} already") from None


def job_template_create(
    *,
    user: User,
    name: str,
    cluster: Cluster,
    settings: dict[str, Any],
    shared: bool = False,
    description: str = "",
    source_job: Job | None = None,
) -> JobTemplate:
    """A new template of ``user``'s, audited. Refused (FieldError) when the name is taken
    by another of their templates or the cluster cannot run the settings."""
    _require_role(user)
    template = JobTemplate(
        owner=user,
        name=_clean_name(name),
        description=_clean_description(description),
        shared=bool(shared),
        cluster=cluster,
        settings=_checked_settings(settings, cluster),
        source_job=source_job,
    )
    with transaction.atomic():
        _save(template)
        audit_event_record(
            actor=user,
            action=AuditAction.JOB_TEMPLATE_CREATE,
            target=template,
            details={
                "name": template.name,
                "shared": template.shared,
                "cluster": cluster.name,
                "source_job": str(source_job.id) if source_job else None,
            },
        )
    return template


def job_template_from_job(
    *, user: User, job: Job, name: str, shared: bool = False, description: str = ""
) -> JobTemplate:
    """Keep the settings of a job ``user`` may see as a template of theirs."""
    return job_template_create(
        user=user,
        name=name,
        cluster=job.cluster,
        settings=job_settings(job),
        shared=shared,
        description=description,
        source_job=job,
    )


def job_template_update(
    *,
    actor: User,
    template: JobTemplate,
    name: str | None = None,
    description: str | None = None,
    shared: bool | None = None,
    settings: dict[str, Any] | None = None,
) -> JobTemplate:
    """Change a template (owner or operator), audited with what changed."""
    require_can_act(actor, owner_id=template.owner_id, what="change this template")
    changed: dict[str, Any] = {}
    if name is not None and _clean_name(name) != template.name:
        template.name = changed["name"] = _clean_name(name)
    if description is not None and _clean_description(description) != template.description:
        template.description = changed["description"] = _clean_description(description)
    if shared is not None and bool(shared) != template.shared:
        template.shared = changed["shared"] = bool(shared)
    if settings is not None:
        if template.cluster is None:
            raise FieldError("cluster", "the template's cluster was removed")
        clean = _checked_settings(settings, template.cluster)
        if clean != template.settings:
            template.settings = clean
            changed["settings"] = sorted(clean)
    if not changed:
        return template
    with transaction.atomic():
        # The keys of ``changed`` are the changed fields' names.
        _save(template, update_fields=[*changed, "updated_at"])
        audit_event_record(
            actor=actor, action=AuditAction.JOB_TEMPLATE_UPDATE, target=template, details=changed
        )
    return template


def job_template_delete(*, actor: User, template: JobTemplate) -> None:
    """Delete a template (owner or operator), audited. Jobs made from it stay."""
    require_can_act(actor, owner_id=template.owner_id, what="delete this template")
    with transaction.atomic():
        audit_event_record(
            actor=actor,
            action=AuditAction.JOB_TEMPLATE_DELETE,
            target=template,
            details={"name": template.name, "owner": template.owner.get_username()},
        )
        template.delete()


def _submit_settings(
    *, user: User, cluster: Cluster, settings: dict[str, Any], origin: dict[str, Any]
) -> Job:
    request = job_request_from_values(settings, cluster=cluster)
    if settings.get("use_placement_advice"):
        request, _advice = job_request_with_advice(request)
    return job_submit(user=user, request=request, origin=origin)


def template_environment_to_confirm(*, user: User, template: JobTemplate) -> dict[str, str]:
    """The environment ``user`` must see and confirm before a job is submitted from
    ``template``: someone else's template's variables (they would apply to ``user``'s own
    job, on ``user``'s account); empty for one's own template or one without any."""
    if is_own(user, owner_id=template.owner_id):
        return {}
    environment = (template.settings or {}).get("environment") or {}
    return dict(environment) if isinstance(environment, dict) else {}


def _check_confirmed_environment(
    *, user: User, template: JobTemplate, settings: dict[str, Any], confirmed: Any
) -> None:
    """Refuse unless ``confirmed`` is the environment the job would get, where it must be
    confirmed (someone else's template) or was sent (the template may have changed since
    the caller read it)."""
    environment = settings.get("environment") or {}
    required = bool(template_environment_to_confirm(user=user, template=template))
    if confirmed is None and not required:
        return
    if confirmed != environment:
        names = ", ".join(sorted(environment)) or "none"
        raise FieldError(
            "confirm_environment",
            f"the template “{template.name}” of {template.owner.get_username()} sets "
            f"environment variables for your job ({names}); read them (the template's "
            "job.environment) and send the same object as confirm_environment to submit "
            "with them",
        )


def job_template_submit(
    *,
    user: User,
    template: JobTemplate,
    name: str | None = None,
    confirm_environment: dict[str, Any] | None = None,
) -> Job:
    """Submit a job with a template's settings, as ``user`` (who may see it: their own or
    a shared one), validated like any submit. ``name`` replaces the job name. Someone
    else's template that sets environment variables needs ``confirm_environment`` equal
    to them (a 400 on that field otherwise)."""
    if template.cluster is None:
        raise FieldError("cluster", "the template's cluster was removed; make a new template")
    settings = settings_clean(template.settings)
    _check_confirmed_environment(
        user=user, template=template, settings=settings, confirmed=confirm_environment
    )
    if name is not None:
        settings["name"] = name
    job = _submit_settings(
        user=user, cluster=template.cluster, settings=settings, origin={"template": template.pk}
    )
    job_event(job, JobEvent.Kind.TEMPLATE, message=f"submitted from template “{template.name}”")
    return job


def job_run_again(*, user: User, job: Job, name: str | None = None) -> Job:
    """A fresh job with the settings of ``job`` (one ``user`` may see), as ``user``."""
    settings = job_settings(job)
    if name is not None:
        settings["name"] = name
    new = _submit_settings(
        user=user, cluster=job.cluster, settings=settings, origin={"run_again_of": str(job.id)}
    )
    job_event(new, JobEvent.Kind.RUN_AGAIN, message=f"the settings of {job.name} ({job.id})")
    return new
