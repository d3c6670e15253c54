from __future__ import annotations

from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from controlplane.env import (
    database_from_url,
    envbool,
    envfloat,
    envint,
    envlist,
    envsecret,
    envstr,
    redis_url,
)


def test_envbool_accepts_the_usual_spellings() -> None:
    assert envbool("X", False, environ={"X": "yes"}) is True
    assert envbool("X", True, environ={"X": "OFF"}) is False
    assert envbool("X", True, environ={}) is True


def test_envbool_refuses_anything_else_naming_the_variable() -> None:
    with pytest.raises(ImproperlyConfigured, match=r"DEBUG='maybe' is not a boolean"):
        envbool("DEBUG", False, environ={"DEBUG": "maybe"})


def test_envfloat_refuses_non_numbers_non_finite_and_out_of_range() -> None:
    assert envfloat("F", 0.5, environ={}) == 0.5
    assert envfloat("F", 0.5, minimum=0.2, environ={"F": " 0.25 "}) == 0.25
    for raw, why in (("soon", "not a number"), ("nan", "not a finite"), ("inf", "not a finite")):
        with pytest.raises(ImproperlyConfigured, match=f"F={raw!r} is {why}"):
            envfloat("F", 0.5, environ={"F": raw})
    with pytest.raises(ImproperlyConfigured, match=r"below the minimum of 0\.2"):
        envfloat("F", 0.5, minimum=0.2, environ={"F": "0.1"})
    with pytest.raises(ImproperlyConfigured, match="above the maximum of 60"):
        envfloat("F", 0.5, maximum=60, environ={"F": "61"})


def test_envint_refuses_non_integers_and_out_of_range() -> None:
    with pytest.raises(
        ImproperlyConfigured, match=r"GANTRY_SYNC_INTERVAL='fast' is not an integer"
    ):
        envint("GANTRY_SYNC_INTERVAL", 30, environ={"GANTRY_SYNC_INTERVAL": "fast"})
    with pytest.raises(ImproperlyConfigured, match="below the minimum of 2"):
        envint("GANTRY_SYNC_INTERVAL", 30, minimum=2, environ={"GANTRY_SYNC_INTERVAL": "1"})
    with pytest.raises(ImproperlyConfigured, match="above the maximum of 10"):
        envint("N", 1, maximum=10, environ={"N": "11"})
    assert envint("N", 7, environ={}) == 7
    assert envint("N", 7, environ={"N": " 12 "}) == 12


def test_envlist_splits_and_trims() -> None:
    assert envlist("H", [], environ={"H": "a.example, b.example,,"}) == ["a.example", "b.example"]
    assert envlist("H", ["x"], environ={}) == ["x"]


def test_envstr_without_default_says_what_is_missing() -> None:
    with pytest.raises(ImproperlyConfigured, match="NEEDED is not set"):
        envstr("NEEDED", environ={})


def test_envsecret_reads_a_file_and_refuses_a_missing_or_empty_one(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    assert envsecret("SECRET_KEY", environ={"SECRET_KEY_FILE": str(secret)}) == "s3cret"
    with pytest.raises(ImproperlyConfigured, match="cannot be read"):
        envsecret("SECRET_KEY", environ={"SECRET_KEY_FILE": str(tmp_path / "nope")})
    (tmp_path / "empty").write_text("")
    with pytest.raises(ImproperlyConfigured, match="is empty"):
        envsecret("SECRET_KEY", environ={"SECRET_KEY_FILE": str(tmp_path / "empty")})
    with pytest.raises(ImproperlyConfigured, match="set but empty"):
        envsecret("SECRET_KEY", environ={"SECRET_KEY": "  "})
    assert envsecret("SECRET_KEY", environ={}) is None


def test_database_url_sqlite_and_postgres() -> None:
    sqlite = database_from_url("sqlite:////tmp/gantry.sqlite3")
    assert sqlite["ENGINE"] == "django.db.backends.sqlite3"
    assert sqlite["NAME"] == "/tmp/gantry.sqlite3"
    postgres = database_from_url("postgres://gantry:pw@db.example:5433/gantry")
    assert postgres["ENGINE"] == "django.db.backends.postgresql"
    assert (postgres["HOST"], postgres["PORT"], postgres["NAME"]) == ("db.example", 5433, "gantry")


def test_postgres_prepares_repeated_queries_unless_told_not_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = "postgres://gantry:pw@db.example:5433/gantry"
    options = database_from_url(url)["OPTIONS"]
    assert options["server_side_binding"] is True and options["prepare_threshold"] == 5
    monkeypatch.setenv("GANTRY_DB_PREPARED_STATEMENTS", "off")
    options = database_from_url(url)["OPTIONS"]
    assert "server_side_binding" not in options and "prepare_threshold" not in options
    monkeypatch.setenv("GANTRY_DB_PREPARED_STATEMENTS", "maybe")
    with pytest.raises(ImproperlyConfigured, match="GANTRY_DB_PREPARED_STATEMENTS"):
        database_from_url(url)
    # SQLite has nothing of the kind.
    monkeypatch.delenv("GANTRY_DB_PREPARED_STATEMENTS")
    assert "server_side_binding" not in database_from_url("sqlite:////tmp/g.sqlite3")["OPTIONS"]


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("mysql://u@h/db", "unsupported scheme 'mysql'"),
        ("not a url", "unsupported scheme ''"),
        ("postgres:///gantry", "names no host"),
        ("postgres://h:5432/", "names no database"),
        ("postgres://h:notaport/db", "invalid port"),
        ("sqlite://", "names no database file"),
    ],
)
def test_database_url_refusals_name_the_variable(url: str, why: str) -> None:
    with pytest.raises(ImproperlyConfigured, match="DATABASE_URL") as error:
        database_from_url(url)
    assert why in str(error.value)


def test_database_url_never_echoes_a_password() -> None:
    with pytest.raises(ImproperlyConfigured) as error:
        database_from_url("mysql://user:hunter2@h/db")
    assert "hunter2" not in str(error.value)


def test_redis_url_refusals() -> None:
    assert redis_url("redis://127.0.0.1:6379/0", name="REDIS_URL")
    with pytest.raises(ImproperlyConfigured, match="REDIS_URL='http://x' is not a Redis URL"):
        redis_url("http://x", name="REDIS_URL")
    with pytest.raises(ImproperlyConfigured, match="invalid port"):
        redis_url("redis://h:port/0", name="REDIS_URL")
