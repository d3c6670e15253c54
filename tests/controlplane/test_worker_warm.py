"""A production worker warms at start (``controlplane.gunicorn_conf``): every template is
compiled and kept by the cached loader and every view imported before its first request,
so a worker replaced after ``max_requests`` answers its first requests as fast as any."""

from __future__ import annotations

from django.template import engines

from controlplane import gunicorn_conf


def test_a_started_worker_has_every_template_compiled() -> None:
    engine = engines["django"].engine  # type: ignore[attr-defined]
    (loader,) = engine.template_loaders
    loader.reset()
    assert not loader.get_template_cache
    gunicorn_conf._warm()
    kept = set(loader.get_template_cache)
    for name in ("jobs/job_detail.html", "jobs/_job_rows.html", "overview.html", "base.html"):
        assert name in kept, sorted(kept)[:20]
    assert len(kept) > 50
