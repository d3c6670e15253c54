"""The operator console for drills: drills (read-only), policies and budgets (through
their services), and each checkpoint's drills inline on its admin page."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from core.access import request_user
from core.admin_helpers import ServiceDeleteMixin, admin_link
from core.errors import ApplicationError
from drills.budgets import BUDGET_FIELDS, drill_budget_update
from drills.models import DrillBudget, DrillPolicy, RestoreDrill
from drills.policies import drill_policy_update
from drills.services import restore_drill_cancel, restore_drill_delete
from jobs.admin import CheckpointAdmin
from jobs.models import Checkpoint


class RestoreDrillInline(admin.TabularInline):
    model = RestoreDrill
    extra = 0
    can_delete = False
    readonly_fields = (
        "created_at",
        "state",
        "verdict",
        "reason",
        "steps",
        "allocation_key",
    )
    fields = readonly_fields
    show_change_link = True
    max_num = 0


# The checkpoint's admin page lists its drills; jobs (a lower layer) cannot name them.
admin.site.unregister(Checkpoint)


@admin.register(Checkpoint)
class CheckpointWithDrillsAdmin(CheckpointAdmin):
    inlines = [*CheckpointAdmin.inlines, RestoreDrillInline]


@admin.register(RestoreDrill)
class RestoreDrillAdmin(ServiceDeleteMixin, admin.ModelAdmin):
    """Read-only; cancel through the service; only finished drills may be deleted."""

    delete_service = staticmethod(restore_drill_delete)
    delete_argument = "drill"
    actions = ["cancel_drills"]
    list_display = [
        "short_id",
        "checkpoint_link",
        "state",
        "verdict",
        "attestation",
        "reason_short",
        "steps",
        "allocation_key",
        "load_s",
        "created_at",
    ]
    list_filter = ["state", "verdict", "attestation", "reason_code"]
    search_fields = ["=id", "checkpoint__job__name", "reason", "=slurm_job_id"]
    date_hierarchy = "created_at"
    list_select_related = ["checkpoint", "checkpoint__job"]
    readonly_fields = [
        "id",
        "checkpoint",
        "requested_by",
        "attestation",
        "verifier_account",
        "steps",
        "allocation",
        "allocation_key",
        "gpus",
        "time_limit_minutes",
        "state",
        "verdict",
        "reason",
        "reason_code",
        "evidence",
        "slurm_job_id",
        "integrity_s",
        "load_s",
        "steps_s",
        "queue_wait_s",
        "created_at",
        "submitted_at",
        "started_at",
        "finished_at",
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: RestoreDrill | None = None) -> bool:
        if obj is not None and not obj.is_final:
            return False
        return super().has_delete_permission(request, obj)

    @admin.action(description="Cancel the selected drills (scancel; audited)")
    def cancel_drills(self, request: HttpRequest, queryset: QuerySet[RestoreDrill]) -> None:
        for drill in queryset:
            try:
                outcome = restore_drill_cancel(actor=request_user(request), drill=drill)
                self.message_user(request, f"{drill}: {outcome}")
            except ApplicationError as error:
                self.message_user(request, f"{drill}: {error.message}", level=messages.ERROR)

    @admin.display(description="id")
    def short_id(self, obj: RestoreDrill) -> str:
        return str(obj.id)[:8]

    @admin.display(description="checkpoint")
    def checkpoint_link(self, obj: RestoreDrill) -> str:
        return admin_link(obj.checkpoint)

    @admin.display(description="reason")
    def reason_short(self, obj: RestoreDrill) -> str:
        return (obj.reason[:80] + "…") if len(obj.reason) > 80 else obj.reason


@admin.register(DrillPolicy)
class DrillPolicyAdmin(admin.ModelAdmin):
    list_display = [
        "cluster",
        "enabled",
        "running_every_hours",
        "drill_final_checkpoint",
        "max_in_flight",
        "steps",
        "updated_by",
        "updated_at",
    ]
    list_filter = ["enabled", "drill_final_checkpoint"]
    readonly_fields = ["updated_at", "updated_by", "final_since"]

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        # Switch a policy off instead: the change is then validated and audited.
        return False

    def save_model(
        self, request: HttpRequest, obj: DrillPolicy, form: object, change: bool
    ) -> None:
        # Through the service, so the change is validated and audited like the API's.
        drill_policy_update(
            actor=request_user(request),
            cluster=obj.cluster,
            enabled=obj.enabled,
            running_every_hours=obj.running_every_hours,
            drill_final_checkpoint=obj.drill_final_checkpoint,
            max_in_flight=obj.max_in_flight,
            steps=obj.steps,
        )
        if obj.pk:
            obj.refresh_from_db()


@admin.register(DrillBudget)
class DrillBudgetAdmin(admin.ModelAdmin):
    """Per cluster, per owner: active drills, GPUs at once, GPU-hours a day. Saved through
    the service (validated, audited); a cluster without one has the defaults."""

    list_display = ["cluster", *BUDGET_FIELDS, "updated_by", "updated_at"]
    readonly_fields = ["updated_at", "updated_by"]

    def get_readonly_fields(
        self, request: HttpRequest, obj: DrillBudget | None = None
    ) -> list[str]:
        # The cluster is fixed once the budget exists: another cluster's is its own row.
        fixed = ["cluster"] if obj is not None and obj.pk else []
        return [*fixed, *self.readonly_fields]

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        # Set the numbers instead: the change is then validated and audited.
        return False

    def save_model(
        self, request: HttpRequest, obj: DrillBudget, form: object, change: bool
    ) -> None:
        # Through the service, so the change is validated and audited like the API's.
        saved = drill_budget_update(
            actor=request_user(request),
            cluster=obj.cluster,
            **{key: getattr(obj, key) for key in BUDGET_FIELDS},
        )
        obj.pk = saved.pk
        obj.refresh_from_db()
