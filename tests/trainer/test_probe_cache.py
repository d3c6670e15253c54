"""The health probe imports torch again only when torch's files changed or its kept answer
is ten minutes old (``trainer.probe``: the hook gives it a file of its own to keep it in)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainer import probe


@pytest.fixture
def imports(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []

    def versions() -> dict[str, Any]:
        calls.append(1)
        return {"torch": f"2.13.0+cpu-{len(calls)}", "torch_cuda": None}

    monkeypatch.setattr(probe, "_torch_versions", versions)
    monkeypatch.setattr(probe, "_torch_files_key", lambda: ["python", "/torch", [1, 2, 3, 4]])
    return calls


def test_torch_is_imported_once_while_its_files_and_the_answer_hold(
    tmp_path: Path, imports: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = str(tmp_path / ".torch-n1.json")
    first = probe._cached_torch_versions(cache, 1000.0)
    assert probe._cached_torch_versions(cache, 1000.0 + probe.TORCH_CACHE_SECONDS - 1) == first
    assert len(imports) == 1
    assert (tmp_path / ".torch-n1.json").stat().st_mode & 0o777 == 0o600
    # Ten minutes on, torch is imported again.
    later = probe._cached_torch_versions(cache, 1000.0 + probe.TORCH_CACHE_SECONDS)
    assert len(imports) == 2 and later != first
    # Another torch in its place (a file of the package changed): imported again at once.
    monkeypatch.setattr(probe, "_torch_files_key", lambda: ["python", "/torch", [1, 2, 9, 4]])
    probe._cached_torch_versions(cache, 1000.0 + probe.TORCH_CACHE_SECONDS + 1)
    assert len(imports) == 3


@pytest.mark.parametrize(
    "kept", ["not json", json.dumps([1]), json.dumps({"key": None, "at": 1, "found": {}})]
)
def test_a_kept_answer_that_does_not_parse_or_match_is_not_used(
    tmp_path: Path, imports: list[int], kept: str
) -> None:
    cache = tmp_path / ".torch-n1.json"
    cache.write_text(kept)
    assert probe._cached_torch_versions(str(cache), 5.0)["torch"] == "2.13.0+cpu-1"
    assert len(imports) == 1


def test_without_a_cache_file_the_probe_imports_torch_every_time(
    imports: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(probe.TORCH_CACHE_ENV, raising=False)
    probe.stack()
    probe.stack()
    assert len(imports) == 2


def test_the_files_key_names_the_torch_that_would_be_imported() -> None:
    key = probe._torch_files_key()
    assert key is not None and key[1].endswith("torch")
    assert all(isinstance(part, list) and len(part) == 4 for part in key[2:])
