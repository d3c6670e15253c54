from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from core.access import request_user
from core.admin_helpers import ServiceDeleteMixin, admin_changelist_link, admin_link
from core.errors import ApplicationError
from jobs.models import Checkpoint, Job, JobEvent, MetricPoint
from jobs.services import job_cancel, job_delete

# What Slurm and the trainer own: shown, never edited by hand.
JOB_OBSERVED_FIELDS = [
    "id",
    "state",
    "state_reason",
    "slurm_job_id",
    "allocated_nodes",
    "exit_code",
    "submit_attempts",
    "last_step",
    "total_steps",
    "metrics_offset",
    "acceptance",
    "created_at",
    "submitted_at",
    "started_at",
    "ended_at",
    "last_seen_in_slurm_at",
    "updated_at",
]


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    can_delete = False
    readonly_fields = (
        "at",
        "kind",
        "from_state",
        "to_state",
        "message",
    )
    fields = readonly_fields
    max_num = 0


class CheckpointInline(admin.TabularInline):
    model = Checkpoint
    extra = 0
    can_delete = False
    readonly_fields = (
        "step",
        "size_bytes",
        "file_count",
        "world_size",
        "integrity",
        "last_proven_at",
    )
    fields = readonly_fields
    show_change_link = True
    max_num = 0


@admin.register(Job)
class JobAdmin(ServiceDeleteMixin, admin.ModelAdmin):
    """Read-only: a job is changed only through the services (submit, cancel, resume), which
    validate, audit and act on Slurm. Deleting is for jobs that never reached Slurm."""

    delete_service = staticmethod(job_delete)
    delete_argument = "job"
    actions = ["cancel_jobs"]
    list_display = [
        "name",
        "short_id",
        "owner",
        "cluster_link",
        "state",
        "slurm_job_id",
        "resources",
        "allocated_nodes",
        "progress_display",
        "created_at",
    ]
    list_filter = ["state", "cluster", "partition", ("owner", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["name", "=id", "=slurm_job_id", "owner__username", "allocated_nodes"]
    date_hierarchy = "created_at"
    list_select_related = ["owner", "cluster"]
    readonly_fields = [*JOB_OBSERVED_FIELDS, "parent_link", "metrics_link"]
    raw_id_fields = ["owner", "parent", "resume_from"]
    inlines = [JobEventInline, CheckpointInline]
    fieldsets = [
        (None, {"fields": ["id", "name", "owner", "cluster", "config"]}),
        (
            "Requested resources",
            {
                "fields": [
                    "partition",
                    "nodes",
                    "tasks_per_node",
                    "gpus_per_node",
                    "gpu_type",
                    "cpus_per_task",
                    "memory_mb",
                    "time_limit_minutes",
                    "nodelist_requested",
                    "switches_requested",
                    "environment",
                ]
            },
        ),
        (
            "In Slurm",
            {
                "fields": [
                    "state",
                    "state_reason",
                    "slurm_job_id",
                    "allocated_nodes",
                    "exit_code",
                    "submit_attempts",
                    "created_at",
                    "submitted_at",
                    "started_at",
                    "ended_at",
                    "last_seen_in_slurm_at",
                ]
            },
        ),
        (
            "Training",
            {
                "fields": [
                    "last_step",
                    "total_steps",
                    "metrics_offset",
                    "metrics_link",
                    "acceptance",
                ]
            },
        ),
        ("Lineage", {"fields": ["parent", "parent_link", "resume_from"]}),
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Jobs are submitted through the form or the API, which validate and submit them.
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        if obj is not None and (obj.slurm_job_id or not obj.is_final):
            return False
        return super().has_delete_permission(request, obj)

    @admin.action(description="Cancel the selected jobs (scancel; audited)")
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        for job in queryset:
            try:
                outcome = job_cancel(actor=request_user(request), job=job)
                self.message_user(request, f"{job}: {outcome}")
            except ApplicationError as error:
                self.message_user(request, f"{job}: {error.message}", level=messages.ERROR)

    @admin.display(description="id")
    def short_id(self, obj: Job) -> str:
        return str(obj.id)[:8]

    @admin.display(description="cluster", ordering="cluster__name")
    def cluster_link(self, obj: Job) -> str:
        return admin_link(obj.cluster, obj.cluster.name)

    @admin.display(description="resources")
    def resources(self, obj: Job) -> str:
        gpus = f" × {obj.gpus_per_node} GPU" if obj.gpus_per_node else ""
        return f"{obj.nodes} node{'s' if obj.nodes != 1 else ''}{gpus} · {obj.partition}"

    @admin.display(description="progress")
    def progress_display(self, obj: Job) -> str:
        if obj.total_steps and obj.last_step is not None:
            return f"{obj.last_step}/{obj.total_steps}"
        return "–"

    @admin.display(description="resumed from job")
    def parent_link(self, obj: Job) -> str:
        return admin_link(obj.parent)

    @admin.display(description="metric points")
    def metrics_link(self, obj: Job) -> str:
        return admin_changelist_link(MetricPoint, "show metric points", job__id__exact=obj.pk)


@admin.register(JobEvent)
class JobEventAdmin(admin.ModelAdmin):
    list_display = ["at", "job_link", "kind", "from_state", "to_state", "message"]
    list_filter = ["kind", "to_state"]
    search_fields = ["=job__id", "job__name", "message"]
    date_hierarchy = "at"
    list_select_related = ["job"]
    readonly_fields = ["job", "at", "kind", "from_state", "to_state", "message"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    @admin.display(description="job")
    def job_link(self, obj: JobEvent) -> str:
        return admin_link(obj.job)


@admin.register(MetricPoint)
class MetricPointAdmin(admin.ModelAdmin):
    list_display = [
        "job",
        "step",
        "wall_time",
        "loss",
        "samples_per_s",
        "tokens_per_s",
        "step_time_s",
    ]
    search_fields = ["=job__id"]
    list_select_related = ["job"]
    show_full_result_count = False
    readonly_fields = [
        "job",
        "step",
        "wall_time",
        "elapsed_s",
        "loss",
        "samples_per_s",
        "tokens_per_s",
        "step_time_s",
        "data_time_s",
        "checkpoint_blocking_s",
        "world_size",
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = [
        "__str__",
        "job_link",
        "step",
        "size_bytes",
        "file_count",
        "world_size",
        "integrity",
        "last_proven_at",
    ]
    list_filter = ["integrity", "job__cluster"]
    search_fields = ["=job__id", "job__name", "path"]
    list_select_related = ["job"]
    readonly_fields = [
        "job",
        "step",
        "path",
        "size_bytes",
        "file_count",
        "state_keys",
        "world_size",
        "manifest",
        "integrity",
        "integrity_detail",
        "integrity_checked_at",
        "saved_at",
        "registered_at",
        "last_proven_at",
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        # Checkpoint records are the history of what a job wrote and what drills proved.
        return False

    @admin.display(description="job")
    def job_link(self, obj: Checkpoint) -> str:
        return admin_link(obj.job)
