from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from core.access import request_user
from core.admin_helpers import admin_link
from core.models import ApiToken, AuditEvent
from core.services import api_token_revoke_by_operator

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


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Read-only: people make their tokens at /account/tokens/; an operator may revoke any
    (one that leaked, one of someone who left). The secret is not here: only its hash is kept.
    No new key is made here any more: ``legacy`` marks the keys operators once made in the
    admin (DRF authtokens), converted by migration core 0004.
    """

    list_display = [
        "name",
        "user",
        "prefix",
        "legacy",
        "created_at",
        "expires_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = [
        "legacy",
        ("revoked_at", admin.EmptyFieldListFilter),
        ("expires_at", admin.EmptyFieldListFilter),
    ]
    search_fields = ["name", "prefix", "user__username"]
    list_select_related = ["user"]
    readonly_fields = (
        "user",
        "name",
        "prefix",
        "legacy",
        "created_at",
        "expires_at",
        "last_used_at",
        "revoked_at",
    )
    fields = readonly_fields
    actions = ["revoke"]

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        tokens = list(queryset)
        for token in tokens:
            api_token_revoke_by_operator(actor=request_user(request), token=token)
        self.message_user(request, f"{len(tokens)} token(s) revoked.", messages.SUCCESS)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
