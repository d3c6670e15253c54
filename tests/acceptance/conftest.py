"""Fixtures of the acceptance tests (``acceptance_support``)."""

from __future__ import annotations

from acceptance_support import login_node

__all__ = ["login_node"]
