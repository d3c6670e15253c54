"""Admin of per-user cluster identities: operators map Gantry users to cluster accounts.
Saving and deleting go through ``nodes.access.identities`` (validated, audited). Imported by
``nodes.admin``."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from core.access import request_user
from core.admin_helpers import ServiceDeleteMixin, admin_changelist_link
from core.errors import ApplicationError
from nodes.access.identities import (
    cluster_identity_delete,
    cluster_identity_set,
    cluster_user_auth_set,
    cluster_user_ca_ensure,
    sshd_config_line,
    sshd_config_lines,
    trusted_ca_file,
    trusted_ca_keys,
)
from nodes.models import Cluster, ClusterIdentity


class ClusterIdentityForm(forms.ModelForm):
    class Meta:
        model = ClusterIdentity
        fields = ["cluster", "user", "account"]

    def __init__(self, *args: Any, request: HttpRequest | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.request = request
        self.saved: ClusterIdentity | None = None

    def _post_clean(self) -> None:
        # The service validates, checks uniqueness and saves in clean().
        return

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        try:
            self.saved = cluster_identity_set(
                actor=request_user(self.request) if self.request else None,
                cluster=data["cluster"],
                user=data["user"],
                account=data["account"],
            )
        except ApplicationError as error:
            field = getattr(error, "field", None)
            message = getattr(error, "why", error.message)
            raise forms.ValidationError(
                {field: message} if field in self.fields else error.message
            ) from None
        return data


@admin.register(ClusterIdentity)
class ClusterIdentityAdmin(ServiceDeleteMixin, admin.ModelAdmin):
    """Which cluster account each user's work runs as. A user without one cannot submit
    on that cluster. Changes are audited (``cluster_identity.set`` / ``.delete``)."""

    delete_service = staticmethod(cluster_identity_delete)
    delete_argument = "identity"
    list_display = ["user", "cluster", "account", "updated_at"]
    list_filter = ["cluster"]
    search_fields = ["user__username", "account", "cluster__name"]
    list_select_related = ["cluster", "user"]
    readonly_fields = ["public_key", "created_at", "updated_at"]

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        base = super().get_form(request, obj, change=change, form=ClusterIdentityForm, **kwargs)

        class BoundForm(base):  # type: ignore[valid-type,misc]
            def __init__(self, *args: Any, **kw: Any) -> None:
                super().__init__(*args, request=request, **kw)

        return BoundForm

    def save_model(
        self, request: HttpRequest, obj: ClusterIdentity, form: Any, change: bool
    ) -> None:
        # cluster_identity_set saved it in the form's clean(); point the admin at that row.
        obj.pk = form.saved.pk
        obj.refresh_from_db()


def user_ca_panel(cluster: Cluster) -> str:
    """The CA's public key(s) and the sshd lines, for the cluster's admin page."""
    if cluster.user_auth != Cluster.UserAuth.CERTIFICATE:
        return "— (this cluster does not use certificates)"
    if not cluster.user_ca_public_key:
        return "not created yet: use the action “Create the user CA”"
    return format_html(
        "On the login node, put in <code>{}</code>:<pre>{}</pre>"
        "install scripts/gantry-principals as <code>/usr/local/sbin/gantry-principals</code> "
        "(root, mode 755) and add to its sshd_config:<pre>{}</pre>",
        trusted_ca_file(cluster),
        "\n".join(trusted_ca_keys(cluster)),
        "\n".join(sshd_config_lines(cluster)),
    )


class ClusterIdentityActions:
    """The cluster admin's part of identities: the CA panel, the link to the mappings, and
    the actions that create the CA or change the mode (through the services, audited)."""

    @admin.display(description="user CA (certificates)")
    def user_ca(self, obj: Cluster) -> str:
        return user_ca_panel(obj)

    @admin.display(description="identities")
    def identities_link(self, obj: Cluster) -> str:
        return admin_changelist_link(
            ClusterIdentity, "who runs as which account", cluster__id__exact=obj.pk
        )

    @admin.action(description="Create the user CA (certificates) if missing")
    def create_user_ca(self, request: HttpRequest, queryset: QuerySet[Cluster]) -> None:
        for cluster in queryset:
            try:
                cluster_user_ca_ensure(actor=request_user(request), cluster=cluster)
            except ApplicationError as error:
                messages.error(request, f"{cluster.name}: {error.message}")
                continue
            messages.info(request, f"{cluster.name}: {sshd_config_line(cluster)}")

    def _user_auth(self, request: HttpRequest, queryset: QuerySet[Cluster], mode: str) -> None:
        for cluster in queryset:
            cluster_user_auth_set(actor=request_user(request), cluster=cluster, user_auth=mode)
            messages.info(request, f"{cluster.name}: {Cluster.UserAuth(mode).label}.")

    @admin.action(description="Jobs run as the researcher, with SSH certificates (default)")
    def use_certificates(self, request: HttpRequest, queryset: QuerySet[Cluster]) -> None:
        self._user_auth(request, queryset, Cluster.UserAuth.CERTIFICATE)

    @admin.action(description="Jobs run as the researcher, with per-user keys (no CA)")
    def use_user_keys(self, request: HttpRequest, queryset: QuerySet[Cluster]) -> None:
        self._user_auth(request, queryset, Cluster.UserAuth.USER_KEYS)

    @admin.action(description="Legacy: everything runs as the service account")
    def use_service_account(self, request: HttpRequest, queryset: QuerySet[Cluster]) -> None:
        self._user_auth(request, queryset, Cluster.UserAuth.SERVICE_ACCOUNT)
