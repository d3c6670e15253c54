"""Pages of one's own account: personal API tokens."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from core.access import request_user
from core.errors import FieldError
from core.forms import ApiTokenForm
from core.selectors import api_token_list_for_user
from core.services import api_token_create, api_token_revoke


def _render(
    request: HttpRequest, form: ApiTokenForm, created: dict[str, Any] | None = None
) -> HttpResponse:
    now = timezone.now()
    tokens = [
        {"token": token, "status": token.status_at(now)}
        for token in api_token_list_for_user(user=request_user(request))
    ]
    context = {"form": form, "tokens": tokens, "created": created}
    return render(request, "core/api_tokens.html", context)


# never_cache: the answer to a create holds the secret; no browser or proxy cache keeps it.
@never_cache
@login_required
def api_token_list_page(request: HttpRequest) -> HttpResponse:
    """The list and the create form; a successful create answers with the secret, once.

    The secret is rendered into this one response (not put in the session and redirected
    to), so it is never written anywhere on the server.
    """
    if request.method != "POST":
        return _render(request, ApiTokenForm())
    form = ApiTokenForm(request.POST)
    if form.is_valid():
        try:
            token, secret = api_token_create(
                user=request_user(request),
                name=form.cleaned_data["name"],
                expires_at=form.expires_at(),
            )
        except FieldError as error:
            form.attach_error(error.field, error.why)
        else:
            return _render(request, ApiTokenForm(), {"token": token, "secret": secret})
    return _render(request, form)


@never_cache
@login_required
@require_POST
def api_token_revoke_action(request: HttpRequest) -> HttpResponse:
    token = api_token_revoke(user=request_user(request), token_id=request.POST.get("token_id"))
    messages.success(request, f"Token “{token.name}” ({token.prefix}…) is revoked.")
    return HttpResponseRedirect(reverse("api-token-list"))
