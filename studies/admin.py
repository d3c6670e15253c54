from __future__ import annotations

from django.contrib import admin

from studies.models import ScalingStudy, StudyPoint


class StudyPointInline(admin.TabularInline):
    model = StudyPoint
    extra = 0
    can_delete = False
    fields = ("ranks", "nodes", "tasks_per_node", "per_rank_batch", "global_batch", "job")
    readonly_fields = fields
    show_change_link = True


@admin.register(ScalingStudy)
class ScalingStudyAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "kind",
        "scales",
        "owner",
        "cluster",
        "partition",
        "batch_size",
        "measured_steps",
        "created_at",
    )
    list_filter = ("kind", "cluster")
    search_fields = ("name", "owner__username")
    readonly_fields = ("created_at",)
    raw_id_fields = ("owner",)
    inlines = [StudyPointInline]


@admin.register(StudyPoint)
class StudyPointAdmin(admin.ModelAdmin):
    list_display = ("study", "ranks", "nodes", "tasks_per_node", "global_batch", "job")
    list_filter = ("study__kind",)
    search_fields = ("study__name",)
    raw_id_fields = ("study", "job")
