"""Small strict readers for settings that come from the environment.

A value that is set but cannot be read is a configuration error at start-up, never a silent default.
"""

import os
from decimal import Decimal, InvalidOperation
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r}: expected one of 1/0, true/false, yes/no, on/off")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r}: expected an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value}: must be at least {minimum}")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r}: expected a number") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value}: must be at least {minimum}")
    return value


def env_decimal(name: str, default: str) -> Decimal:
    raw = os.environ.get(name, default)
    try:
        value = Decimal(raw)
    except InvalidOperation:
        raise ImproperlyConfigured(f"{name}={raw!r}: expected a decimal amount") from None
    if not value.is_finite() or value < 0:
        raise ImproperlyConfigured(f"{name}={raw!r}: expected a non-negative amount")
    return value


def env_list(name: str, default: str) -> list[str]:
    raw = os.environ.get(name, default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_int_list(name: str, default: str, *, minimum: int = 0) -> list[int]:
    items = env_list(name, default)
    try:
        values = [int(item) for item in items]
    except ValueError:
        raise ImproperlyConfigured(f"{name}={os.environ.get(name)!r}: expected comma-separated integers") from None
    if not values or any(value < minimum for value in values):
        raise ImproperlyConfigured(f"{name}: expected at least one integer, each >= {minimum}")
    return values


def env_limits(name: str, default: str = "") -> dict[str, int]:
    """`sandbox=3,replicate/black-forest-labs/flux-schnell=2`: a count per name, each at least 1."""
    limits = {}
    for item in env_list(name, default):
        key, sep, value = item.rpartition("=")
        try:
            count = int(value)
        except ValueError:
            count = 0
        if not sep or not key.strip() or count < 1:
            raise ImproperlyConfigured(f"{name}: {item!r} is not NAME=COUNT with a count of at least 1")
        limits[key.strip()] = count
    return limits


def database_from_url(url: str) -> dict:
    """`postgres://user:password@host:port/name?sslmode=...` -> a Django DATABASES entry (psycopg 3)."""
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql", "pgsql"}:
        raise ImproperlyConfigured(f"DATABASE_URL: scheme {parts.scheme!r} is not PostgreSQL; payonce needs PostgreSQL")
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ImproperlyConfigured("DATABASE_URL: no database name in the path")
    options = {}
    for pair in filter(None, parts.query.split("&")):
        key, _, value = pair.partition("=")
        options[unquote(key)] = unquote(value)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    host, port = _hosts_and_ports(hosts)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(user),
        "PASSWORD": unquote(password),
        "HOST": host,
        "PORT": port,
        "OPTIONS": options,
    }


def _hosts_and_ports(hosts: str) -> tuple[str, str]:
    """`db1:5432,db2:5433` -> ("db1,db2", "5432,5433"): libpq's own multi-host form, which psycopg takes as
    is. With `?target_session_attrs=read-write`, each connection tries the hosts in turn and keeps the one
    that accepts writes: after a failover, the promoted standby (docs/operating.md, "PostgreSQL failover")."""
    if not hosts:
        return "", ""
    names, ports = [], []
    for item in hosts.split(","):
        if item.startswith("["):  # [::1]:5432
            name, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            name, _, port = item.partition(":")
        if port and not port.isdigit():
            raise ImproperlyConfigured(f"DATABASE_URL: port {port!r} is not a number")
        names.append(unquote(name))
        ports.append(port)
    return ",".join(names), (",".join(ports) if any(ports) else "")


def email_from_url(url: str) -> dict:
    """`EMAIL_URL` -> Django's email settings: `console://` prints mails; `smtp://[user:password@]host:port`
    sends them (`?tls=1` for STARTTLS, `?ssl=1` for SMTPS)."""
    parts = urlsplit(url)
    if parts.scheme == "console":
        return {"EMAIL_BACKEND": "config.mail.EmailBackend"}  # Django's, with report links redacted
    if parts.scheme not in ("smtp", "smtps"):
        raise ImproperlyConfigured(f"EMAIL_URL: scheme {parts.scheme!r} is not console:// or smtp://")
    if not parts.hostname:
        raise ImproperlyConfigured("EMAIL_URL: smtp:// needs a host")
    options = dict(pair.partition("=")[::2] for pair in filter(None, parts.query.split("&")))
    return {
        "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "EMAIL_HOST": parts.hostname,
        "EMAIL_PORT": parts.port or (465 if parts.scheme == "smtps" else 25),
        "EMAIL_HOST_USER": unquote(parts.username or ""),
        "EMAIL_HOST_PASSWORD": unquote(parts.password or ""),
        "EMAIL_USE_TLS": options.get("tls") in ("1", "true"),
        "EMAIL_USE_SSL": parts.scheme == "smtps" or options.get("ssl") in ("1", "true"),
    }
