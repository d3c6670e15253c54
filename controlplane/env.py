"""Small typed helpers that read settings from the environment and refuse bad values.

Every helper raises ``ImproperlyConfigured`` with one line that names the variable
and says what is wrong, so start-up fails with a message a person can act on.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def envstr(
    name: str, default: str | None = None, *, environ: Mapping[str, str] | None = None
) -> str:
    value = _environ(environ).get(name)
    if value is None:
        if default is None:
            raise ImproperlyConfigured(f"{name} is not set.")
        return default
    return value


def envbool(name: str, default: bool, *, environ: Mapping[str, str] | None = None) -> bool:
    raw = _environ(environ).get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(
        f"{name}={raw!r} is not a boolean; use one of 1/0, true/false, yes/no, on/off."
    )


def envint(
    name: str,
    default: int,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    raw = _environ(environ).get(name)
    if raw is None or raw.strip() == "":
        value = default
    else:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ImproperlyConfigured(f"{name}={raw!r} is not an integer.") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below the minimum of {minimum}.")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}={value} is above the maximum of {maximum}.")
    return value


def envfloat(
    name: str,
    default: float,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    environ: Mapping[str, str] | None = None,
) -> float:
    raw = _environ(environ).get(name)
    if raw is None or raw.strip() == "":
        value = default
    else:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ImproperlyConfigured(f"{name}={raw!r} is not a number.") from None
        if not math.isfinite(value):
            raise ImproperlyConfigured(f"{name}={raw!r} is not a finite number.")
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below the minimum of {minimum}.")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}={value} is above the maximum of {maximum}.")
    return value


def envlist(
    name: str, default: list[str], *, environ: Mapping[str, str] | None = None
) -> list[str]:
    raw = _environ(environ).get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def envnetworks(
    name: str, *, environ: Mapping[str, str] | None = None
) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Comma-separated IP addresses or CIDR networks (``10.0.0.5, 192.168.0.0/24``).

    A bare address is a network of one; host bits set under a prefix are refused, since
    ``10.0.0.5/24`` is more likely a typo than a wish for all of 10.0.0.0/24.
    """
    networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for item in envlist(name, [], environ=environ):
        try:
            networks.append(ipaddress.ip_network(item))
        except ValueError as error:
            raise ImproperlyConfigured(
                f"{name}: {item!r} is not an IP address or CIDR network ({error})."
            ) from None
    return networks


# A list of proxies names the machines in front of Gantry. A network wider than these is
# more likely a mistake than a fleet of proxies, and every client inside it could choose
# its own address with X-Forwarded-For.
_WIDEST_PROXY_PREFIX = {4: 8, 6: 32}


def envproxies(
    name: str, *, environ: Mapping[str, str] | None = None
) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """The reverse proxies whose ``X-Forwarded-For`` is believed: ``envnetworks``, and no
    network wider than /8 (IPv4) or /32 (IPv6), ``0.0.0.0/0`` least of all."""
    networks = envnetworks(name, environ=environ)
    for network in networks:
        widest = _WIDEST_PROXY_PREFIX[network.version]
        if network.prefixlen < widest:
            raise ImproperlyConfigured(
                f"{name}: {network} is wider than /{widest}; list the proxies' own addresses "
                "(every client in a listed network may set its address with X-Forwarded-For)."
            )
    return networks


def envsecret(name: str, *, environ: Mapping[str, str] | None = None) -> str | None:
    """Read a secret from ``NAME`` or from the file named by ``NAME_FILE``.

    Returns ``None`` when neither is set; the caller decides whether that is fatal.
    """
    env = _environ(environ)
    file_name = env.get(f"{name}_FILE")
    if file_name:
        path = Path(file_name)
        try:
            value = path.read_text().strip()
        except OSError as error:
            raise ImproperlyConfigured(
                f"{name}_FILE={file_name!r} cannot be read: {error.strerror}."
            ) from None
        if not value:
            raise ImproperlyConfigured(f"{name}_FILE={file_name!r} is empty.")
        return value
    raw = env.get(name)
    if raw is not None and raw.strip() == "":
        raise ImproperlyConfigured(f"{name} is set but empty.")
    return raw


_DATABASE_ENGINES = {
    "sqlite": "django.db.backends.sqlite3",
    "postgres": "django.db.backends.postgresql",
    "postgresql": "django.db.backends.postgresql",
    "pgsql": "django.db.backends.postgresql",
}


# Runs of one query on one connection before it is prepared on the server (psycopg's own
# default: a query run once or twice is not worth a round trip to prepare).
PREPARE_THRESHOLD = 5


def _prepared_statements() -> bool:
    raw = os.environ.get("GANTRY_DB_PREPARED_STATEMENTS", "on").strip().lower()
    if raw not in ("on", "off"):
        raise ImproperlyConfigured(f"GANTRY_DB_PREPARED_STATEMENTS={raw!r}: on or off.")
    return raw == "on"


def database_from_url(url: str, *, name: str = "DATABASE_URL") -> dict[str, Any]:
    """Turn ``sqlite:///path`` or ``postgres://user@host:port/db`` into a DATABASES entry."""
    import dj_database_url

    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme not in _DATABASE_ENGINES:
        supported = "sqlite:///PATH or postgres://USER:PASSWORD@HOST:PORT/NAME"
        raise ImproperlyConfigured(
            f"{name}={_redact(url)!r} has an unsupported scheme {scheme!r}; use {supported}."
        )
    if scheme == "sqlite":
        if not parsed.path or parsed.path == "/":
            raise ImproperlyConfigured(f"{name}={url!r} names no database file.")
    else:
        if not parsed.hostname and "host=" not in (parsed.query or ""):
            raise ImproperlyConfigured(f"{name}={_redact(url)!r} names no host.")
        if not parsed.path.strip("/"):
            raise ImproperlyConfigured(f"{name}={_redact(url)!r} names no database.")
        try:
            _ = parsed.port
        except ValueError:
            raise ImproperlyConfigured(f"{name}={_redact(url)!r} has an invalid port.") from None
    try:
        config: dict[str, Any] = dict(dj_database_url.parse(url, conn_max_age=60))
    except ValueError as error:
        raise ImproperlyConfigured(f"{name}={_redact(url)!r} cannot be parsed: {error}") from None
    config["ENGINE"] = _DATABASE_ENGINES[scheme]
    if scheme != "sqlite":
        # Gantry's queries are short OLTP reads; PostgreSQL's JIT only adds compile time
        # (seen stuck for many minutes on a wide query). Statement timeout: optional.
        config.setdefault("OPTIONS", {})
        options = "-c jit=off"
        timeout_ms = os.environ.get("GANTRY_DB_STATEMENT_TIMEOUT_MS", "").strip()
        if timeout_ms:
            if not timeout_ms.isdigit():
                raise ImproperlyConfigured(
                    f"GANTRY_DB_STATEMENT_TIMEOUT_MS={timeout_ms!r} is not an integer."
                )
            options += f" -c statement_timeout={timeout_ms}"
        config["OPTIONS"]["options"] = options
        # Values bound on the server, and a query run a few times on a connection prepared
        # there: PostgreSQL then plans it once, not on every request (a job list page's
        # read: 1.8 ms -> 0.9 ms). Off for a pooler that cannot keep prepared statements
        # (PgBouncer before 1.21 in transaction mode).
        if _prepared_statements():
            config["OPTIONS"]["server_side_binding"] = True
            config["OPTIONS"]["prepare_threshold"] = PREPARE_THRESHOLD
    if scheme == "sqlite":
        config["CONN_MAX_AGE"] = 0
        config.setdefault("OPTIONS", {})
        # A busy control plane writes from web, worker and beat at once; wait instead of failing.
        config["OPTIONS"].setdefault("timeout", 20)
        config["OPTIONS"].setdefault("transaction_mode", "IMMEDIATE")
        config["OPTIONS"].setdefault(
            "init_command",
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        )
    return config


def redis_url(value: str, *, name: str) -> str:
    parsed = urlparse(value)
    if parsed.scheme not in {"redis", "rediss", "unix"}:
        raise ImproperlyConfigured(
            f"{name}={_redact(value)!r} is not a Redis URL; use redis://HOST:PORT/DB."
        )
    if parsed.scheme != "unix" and not parsed.hostname:
        raise ImproperlyConfigured(f"{name}={_redact(value)!r} names no host.")
    try:
        _ = parsed.port
    except ValueError:
        raise ImproperlyConfigured(f"{name}={_redact(value)!r} has an invalid port.") from None
    return value


def _redact(url: str) -> str:
    parsed = urlparse(url)
    if parsed.password:
        return url.replace(f":{parsed.password}@", ":***@")
    return url


# ---------------------------------------------------------------- the development env file

_ENV_LINE_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")


def read_env_file(path: Path) -> dict[str, str]:
    """``NAME=value`` lines: blank lines and ``#`` comments skipped, one pair of matching
    quotes around a value removed; nothing is expanded or run. A line of another shape
    stops start-up, naming the file and the line."""
    values: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        name = name.strip().removeprefix("export ").strip()
        if not sep or not _ENV_LINE_NAME.fullmatch(name):
            raise ImproperlyConfigured(f"{path}:{number} is not a NAME=value line.")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[name] = value
    return values


def development_env(path: Path, *, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables ``manage.py`` takes from the development env file ``make run``
    writes (``var/dev.env``), for those the environment does not set.

    Read only when it is there, says ``DEBUG=true`` itself, and the environment does not
    say ``DEBUG`` is off (a production environment never gets development settings this
    way). It holds a secret-free but private configuration: a file others may read or
    write is refused (mode 0600 and owned by this user, as ``make run`` writes it).
    """
    env = _environ(environ)
    if not path.is_file():
        return {}
    if "DEBUG" in env and not envbool("DEBUG", False, environ=env):
        return {}
    info = path.stat()
    if info.st_mode & 0o077 or info.st_uid != os.geteuid():
        raise ImproperlyConfigured(
            f"{path} must be private to its owner (mode 0600, owned by uid {os.geteuid()}); "
            f"it is mode {info.st_mode & 0o777:o}, owned by uid {info.st_uid}: "
            "chmod 600 it, or remove it (make run writes it again)."
        )
    values = read_env_file(path)
    if not envbool("DEBUG", False, environ=values):
        return {}
    return {name: value for name, value in values.items() if name not in env}
