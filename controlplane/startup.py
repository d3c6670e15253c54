"""Turn configuration mistakes into one clear line instead of a stack trace."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def configuration_guard(start: Callable[[], T]) -> T:
    from django.core.exceptions import ImproperlyConfigured
    from django.db.utils import OperationalError

    try:
        return start()
    except ImproperlyConfigured as error:
        print(f"gantry: configuration error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except OperationalError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        print(
            f"gantry: cannot use the database ({first_line}); check DATABASE_URL.",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
