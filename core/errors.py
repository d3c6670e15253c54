"""One error shape for every API failure: ``{"message": str, "extra": {...}}``."""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

logger = logging.getLogger(__name__)


class ApplicationError(Exception):
    """A refusal a user can act on, raised by services; becomes HTTP 400 (or ``status``)."""

    status_code = 400

    def __init__(
        self, message: str, *, extra: dict[str, Any] | None = None, status_code: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.extra = extra or {}
        if status_code is not None:
            self.status_code = status_code


class FieldError(ApplicationError):
    """A refusal about one input field: ``extra = {"fields": {field: [why]}}``."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}", extra={"fields": {field: [why]}})
        self.field = field
        self.why = why


class ConflictError(ApplicationError):
    status_code = 409


def _flatten_messages(detail: Any) -> Any:
    if isinstance(detail, list):
        return [_flatten_messages(item) for item in detail]
    if isinstance(detail, dict):
        return {key: _flatten_messages(value) for key, value in detail.items()}
    return str(detail)


def _first_message(fields: Any, prefix: str = "") -> str | None:
    if isinstance(fields, dict):
        for key, value in fields.items():
            name = key if key != "non_field_errors" else ""
            found = _first_message(value, f"{prefix}.{name}" if prefix and name else prefix or name)
            if found:
                return found
    elif isinstance(fields, list):
        for item in fields:
            found = _first_message(item, prefix)
            if found:
                return found
    elif fields:
        return f"{prefix}: {fields}" if prefix else str(fields)
    return None


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(
            exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        )
    if isinstance(exc, ApplicationError):
        return Response({"message": exc.message, "extra": exc.extra}, status=exc.status_code)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()

    response = drf_exception_handler(exc, context)
    if response is None:
        logger.exception("Unhandled error in %s", context.get("view"), exc_info=exc)
        return Response(
            {"message": "Internal server error; it has been logged.", "extra": {}},
            status=status.HTTP_500_INTERNAL_SERVER_ERROR,
        )

    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten_messages(exc.detail)
        if not isinstance(fields, dict):
            fields = {"non_field_errors": fields}
        first = _first_message(fields) or "Invalid input."
        response.data = {"message": f"Invalid input: {first}", "extra": {"fields": fields}}
    else:
        detail = getattr(exc, "detail", None)
        message = str(detail) if detail is not None else str(exc)
        extra: dict[str, Any] = {}
        wait = getattr(exc, "wait", None)
        if isinstance(exc, exceptions.Throttled) and wait is not None:
            extra["retry_after_s"] = int(wait)
        response.data = {"message": message, "extra": extra}
    return response


def _wants_json(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if _wants_json(request):
        return JsonResponse({"message": "Not found.", "extra": {"path": request.path}}, status=404)
    return render(request, "errors/404.html", status=404)


def handler403(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if _wants_json(request):
        return JsonResponse(
            {"message": "You do not have permission to perform this action.", "extra": {}},
            status=403,
        )
    reason = str(exception) if isinstance(exception, DjangoPermissionDenied) else ""
    return render(request, "errors/403.html", {"reason": reason}, status=403)


def handler400(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if _wants_json(request):
        return JsonResponse({"message": "Bad request.", "extra": {}}, status=400)
    return render(request, "errors/400.html", status=400)


def handler500(request: HttpRequest) -> HttpResponse:
    if _wants_json(request):
        return JsonResponse(
            {"message": "Internal server error; it has been logged.", "extra": {}}, status=500
        )
    return render(request, "errors/500.html", status=500)
