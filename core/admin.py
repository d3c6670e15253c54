from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from core.admin_helpers import admin_link
from core.models import AuditEvent

admin.site.site_header = "Gantry operations"
admin.site.site_title = "Gantry admin"
admin.site.index_title = "Operator console"


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    """Append-only: operators read the log; nobody edits or deletes it here."""

    list_display = ["at", "actor_name", "action", "target_type", "target_repr"]
    list_filter = ["action", "target_type", ("at", admin.DateFieldListFilter)]
    search_fields = ["actor_name", "action", "target_repr", "target_id"]
    date_hierarchy = "at"
    list_select_related = ["actor"]
    readonly_fields = (
        "at",
        "actor_link",
        "actor_name",
        "action",
        "target_type",
        "target_id",
        "target_repr",
        "details",
    )
    fields = readonly_fields

    @admin.display(description="actor")
    def actor_link(self, obj: AuditEvent) -> str:
        return admin_link(obj.actor)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
