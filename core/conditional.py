"""Conditional responses for what browsers and clients poll: an ETag computed from what the
response shows, ``304 Not Modified`` when the client already holds that version (Django's
``get_conditional_response``), and ``Cache-Control: private, no-cache`` so that the browser
keeps its copy but asks again on every poll (its ``fetch`` then sends ``If-None-Match`` by
itself) and no shared cache keeps a person's page.

A view reads what it shows (the cheap part), derives the ETag from it, and renders (the
expensive part) only when the client's copy is stale.
"""

from __future__ import annotations

import functools
import hashlib
import time

from django.http import HttpRequest, HttpResponseBase
from django.utils.cache import get_conditional_response, patch_cache_control


def etag_for(*parts: object) -> str:
    """A strong ETag for a response that shows exactly ``parts`` (their ``repr``)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=16).hexdigest()
    return f'"{digest}"'


@functools.cache
def static_release() -> str:
    """An ETag part for whole pages: which static files (CSS, scripts, by their hashed
    names) they link to, so a deploy that changed them never revalidates an old copy."""
    from django.contrib.staticfiles.storage import staticfiles_storage

    hashed = getattr(staticfiles_storage, "hashed_files", None) or {}
    return etag_for(sorted(hashed.items()))


def this_minute() -> int:
    """An ETag part for responses with relative times in words ("proven 3 minutes ago"):
    the client's copy goes stale once a minute, as those words do."""
    return int(time.time() // 60)


def not_modified(request: HttpRequest, etag: str) -> HttpResponseBase | None:
    """A 304 when the request's ``If-None-Match`` names ``etag``; None otherwise, and
    always None while the session holds a message to show (the page after an action, which
    the browser may revalidate: its copy has no message)."""
    if _messages_waiting(request):
        return None
    response = get_conditional_response(request, etag=etag)
    if response is not None:
        revalidate(response, etag)
    return response


def _messages_waiting(request: HttpRequest) -> bool:
    # len() reads the stored messages without marking them shown.
    storage = getattr(request, "_messages", None)
    return storage is not None and len(storage) > 0


def revalidate(response: HttpResponseBase, etag: str) -> HttpResponseBase:
    """``response`` with its ETag, to be revalidated on every use."""
    response["ETag"] = etag
    patch_cache_control(response, private=True, no_cache=True)
    return response
