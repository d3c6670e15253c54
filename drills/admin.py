"""The operator console for drills: drills (read-only), policies (through the service),
and each checkpoint's drills inline on its admin page."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from core.admin_helpers import admin_link
from drills.models import DrillPolicy, RestoreDrill
from drills.policies import drill_policy_update
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
class RestoreDrillAdmin(admin.ModelAdmin):
    list_display = [
        "short_id",
        "checkpoint_link",
        "state",
        "verdict",
        "reason_short",
        "steps",
        "allocation_key",
        "load_s",
        "created_at",
    ]
    list_filter = ["state", "verdict", "reason_code"]
    search_fields = ["=id", "checkpoint__job__name", "reason", "=slurm_job_id"]
    date_hierarchy = "created_at"
    list_select_related = ["checkpoint", "checkpoint__job"]
    readonly_fields = [
        "id",
        "checkpoint",
        "requested_by",
        "steps",
        "allocation",
        "allocation_key",
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

    def save_model(
        self, request: HttpRequest, obj: DrillPolicy, form: object, change: bool
    ) -> None:
        # Through the service, so the change is validated and audited like the API's.
        drill_policy_update(
            actor=request.user,
            cluster=obj.cluster,
            enabled=obj.enabled,
            running_every_hours=obj.running_every_hours,
            drill_final_checkpoint=obj.drill_final_checkpoint,
            max_in_flight=obj.max_in_flight,
            steps=obj.steps,
        )
        if obj.pk:
            obj.refresh_from_db()
