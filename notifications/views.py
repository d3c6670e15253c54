"""Pages of one's own account: notification subscriptions and their recent deliveries."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from core.access import request_user
from core.errors import FieldError
from notifications.forms import SubscriptionForm
from notifications.selectors import delivery_list_for_user, subscription_list_for_user
from notifications.services import email_enabled, subscription_create, subscription_remove

RECENT_DELIVERIES = 30


def _render(
    request: HttpRequest, form: SubscriptionForm, created: dict[str, Any] | None = None
) -> HttpResponse:
    context = {
        "form": form,
        "subscriptions": subscription_list_for_user(user=request_user(request)),
        "deliveries": delivery_list_for_user(user=request_user(request))[:RECENT_DELIVERIES],
        "created": created,
        "email_enabled": email_enabled(),
    }
    return render(request, "notifications/subscriptions.html", context)


# never_cache: the answer to a create holds the webhook's secret; no cache keeps it.
@never_cache
@login_required
def subscription_list_page(request: HttpRequest) -> HttpResponse:
    """The list, the recent deliveries and the create form; a webhook's create answers
    with its signing secret, once (rendered into this response, never stored in clear)."""
    if request.method != "POST":
        return _render(request, SubscriptionForm(user=request_user(request)))
    form = SubscriptionForm(request.POST, user=request_user(request))
    if form.is_valid():
        try:
            subscription, secret = subscription_create(
                user=request_user(request),
                name=form.cleaned_data["name"],
                channel=form.cleaned_data["channel"],
                url=form.cleaned_data["url"],
                topics=form.cleaned_data["topics"],
                cluster=form.cleaned_data.get("cluster"),
            )
        except FieldError as error:
            form.attach_error(error.field, error.why)
        else:
            created = {"subscription": subscription, "secret": secret}
            return _render(request, SubscriptionForm(user=request_user(request)), created)
    return _render(request, form)


@never_cache
@login_required
@require_POST
def subscription_remove_action(request: HttpRequest) -> HttpResponse:
    subscription = subscription_remove(
        user=request_user(request), subscription_id=request.POST.get("subscription_id")
    )
    messages.success(request, f"Subscription “{subscription.name}” is removed.")
    return HttpResponseRedirect(reverse("notification-subscription-list"))
