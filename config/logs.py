"""payonce's logs: one JSON object per line, each event carrying the ids it is about (job_id, step,
attempt, upstream_key, delivery_id, run, model; request_id in the web process), and no key, secret or
password ever written.

- `JsonFormatter` (LOG_FORMAT=json, the default) and `PlainFormatter` (LOG_FORMAT=plain, a developer's
  terminal) render a record and its fields; `formatter()` picks one by LOG_FORMAT.
- `ContextFilter` adds the fields of the code a record was logged in: `log_context(job_id=..., step=...)`
  sets them for a block, and each Celery task runs with its own arguments of those names
  (config.celery), so code inside a step logs them without passing them around. The web process serves
  each request inside a `log_context(request_id=...)` (config.requestid).
- `RedactFilter` replaces secrets in the message, its arguments, the extra fields and the exception text
  with `[redacted]`, before any formatter sees the record.
- `log_event(logger, "job.finished", ...)` logs an event once the state change it reports has committed.

Settings' LOGGING (Django, and through it Celery's worker and beat) and config/uvicorn-log.json (the web
process's own lines) put both filters on their one handler.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import re
import sys
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timezone
from decimal import Decimal
from enum import Enum
from pathlib import Path
from urllib.parse import unquote, urlsplit
from uuid import UUID

from config import tracing

# The ids an event line carries when they apply, in this order after the record's own keys.
FIELDS = ("job_id", "run", "step", "attempt", "upstream_key", "model", "delivery_id", "request_id")

REDACTED = "[redacted]"

# What a LogRecord holds of its own: everything else on a record came from `extra=` (or a filter).
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}
# Extra fields other libraries attach that a line leaves out: Celery's `data` (the message's arguments
# again, traceback included), Django's `request` (the whole request object, headers and all), uvicorn's
# `color_message` (the message with terminal colours).
_LEFT_OUT = frozenset({"data", "request", "color_message"})

_CONTEXT: ContextVar[dict] = ContextVar("payonce_log_context", default={})

# The extra fields' names of a record, by the names it holds: the lines of one place in the code hold the
# same names, so they are found once, not by walking some 30 names of each record twice (redaction, then
# the formatter). A pure function of the names (their order too), so a remembered answer is the answer.
_EXTRA_NAMES: dict[tuple, tuple[tuple[str, ...], tuple[str, ...]]] = {}
_EXTRA_NAMES_COUNT = 1024


def _extra_names(record: logging.LogRecord) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names of the record's extra fields in its order (neither a LogRecord's own nor private), and
    those of them a line writes (not _LEFT_OUT)."""
    names = tuple(record.__dict__)
    found = _EXTRA_NAMES.get(names)
    if found is None:
        extra = tuple(name for name in names if name not in _RECORD_ATTRIBUTES and not name.startswith("_"))
        found = (extra, tuple(name for name in extra if name not in _LEFT_OUT))
        if len(_EXTRA_NAMES) >= _EXTRA_NAMES_COUNT:
            _EXTRA_NAMES.clear()  # threads may race here: the worst is names found again
        _EXTRA_NAMES[names] = found
    return found


# --- context ---------------------------------------------------------------------------------------------


@contextmanager
def log_context(**fields):
    """Every record logged inside the block (in this thread or task) carries these fields, unless the
    call's own `extra=` names them. Nested blocks add to the outer one's fields."""
    token = _CONTEXT.set({**_CONTEXT.get(), **{name: value for name, value in fields.items() if value is not None}})
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def context_fields() -> dict:
    return dict(_CONTEXT.get())


def context_value(name: str):
    """One field of the context in force, None when it has none."""
    return _CONTEXT.get().get(name)


_TASK_PARAMETERS: dict[str, tuple[str, ...]] = {}


def task_context_start(task, args, kwargs) -> None:
    """A Celery task starts (task_prerun): its arguments named like a field (job_id, run, delivery_id...)
    are the context of every line it logs. Set, not stacked: a task's thread runs one task at a time, and
    the next task's start replaces whatever the last one left."""
    names = _TASK_PARAMETERS.get(task.name)
    if names is None:
        try:
            names = tuple(inspect.signature(task.run).parameters)
        except (TypeError, ValueError):
            names = ()
        _TASK_PARAMETERS[task.name] = names
    fields = {name: value for name, value in zip(names, args or ()) if name in FIELDS}
    fields.update({name: value for name, value in (kwargs or {}).items() if name in FIELDS})
    _CONTEXT.set({name: value for name, value in fields.items() if value is not None})


def task_context_end() -> None:
    """A Celery task ended (task_postrun): its thread logs without its fields again."""
    _CONTEXT.set({})


def log_event(logger: logging.Logger, event: str, **fields) -> None:
    """Log `event` (INFO) with `fields` once the transaction in progress commits, at once outside one: a
    state change that is rolled back (a race lost, a group of steps undone) never shows in the logs. The
    context is taken now, where the change was made."""
    if not logger.isEnabledFor(logging.INFO):
        return
    from django.db import transaction

    extra = {**_CONTEXT.get(), **tracing.log_fields(),
             **{name: value for name, value in fields.items() if value is not None}}
    # The record is made here, so it names the caller's line and the moment of the change, and handled
    # (filtered, formatted, written) on commit.
    caller = sys._getframe(1)  # what logging's findCaller(stacklevel=2) finds, without walking the stack
    record = logger.makeRecord(logger.name, logging.INFO, caller.f_code.co_filename, caller.f_lineno, event, (),
                               None, caller.f_code.co_name, extra)
    transaction.on_commit(lambda: logger.handle(record))


class ContextFilter(logging.Filter):
    """Adds the context's fields (log_context, the running task's arguments) to a record that does not
    name them itself, and the trace_id and span_id of the span in progress when traces are on."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in _CONTEXT.get().items():
            if name not in record.__dict__:
                setattr(record, name, value)
        if "trace_id" not in record.__dict__:  # a log_event record took its span where it was made
            for name, value in tracing.log_fields().items():
                setattr(record, name, value)
        return True


class RoutineFilter(logging.Filter):
    """Celery's own lines about the periodic tasks (beat's "Sending due task", a worker's "received" and
    "succeeded" of each sweep and drain) are routine: every few seconds, three lines that say nothing went
    on. They are kept at DEBUG, so they are written only when LOG_LEVEL=DEBUG. Only Celery's bookkeeping
    lines: what a periodic task itself logs (a job recovered, a delivery given up) stays at its level, and
    so does a periodic task that failed."""

    LOGGERS = frozenset({"celery.beat", "celery.worker.strategy", "celery.app.trace"})

    def __init__(self, name: str = "", tasks=()):
        super().__init__(name)
        self.tasks = tuple(tasks)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name not in self.LOGGERS or record.levelno > logging.INFO or not self.tasks:
            return True
        message = record.getMessage()
        if not any(task in message for task in self.tasks):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger().getEffectiveLevel() <= logging.DEBUG


# --- redaction -------------------------------------------------------------------------------------------

# A report link's token (`/r/<signed token>`, jobs.kinds.report.reports.link_token): a bearer token to a buyer's
# report, in any line that quotes a link, and in the mail a console backend prints (config.mail) unless
# EMAIL_CONSOLE_LINKS shows it there (development: that mail is the only way to the link).
_REPORT_LINK = (("/r/",), re.compile(r"(/r/)[A-Za-z0-9_.:=-]{16,}"), r"\1" + REDACTED)

# Secrets found by their shape, wherever they appear. Each keeps what says what it was. A shape is looked
# for only in a text that holds one of its needles (lower-cased), a cheap test most texts (ids, event
# names) fail: the filter runs on every record.
_SHAPES = (
    # `Authorization: Bearer <token>` (a client's API key, a provider's key), in a header or its repr.
    (("bearer",), re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/-]+=*"), r"\1" + REDACTED),
    # A client's API key (djangorestframework-api-key: an 8-character prefix, a dot, a 32-character secret).
    ((".",), re.compile(r"(?<![A-Za-z0-9])[A-Za-z0-9]{8}\.[A-Za-z0-9]{32}(?![A-Za-z0-9])"), REDACTED),
    # Standard Webhooks signing secrets: every client's, the sandbox's callback secret, Replicate's.
    (("whsec_",), re.compile(r"\bwhsec_[A-Za-z0-9+/=]+"), REDACTED),
    # Provider key formats (OpenAI's and Anthropic's sk-..., Replicate's r8_...) are declared by each
    # provider's spec and registered below (register_secrets).
    _REPORT_LINK,
    # A password inside a URL (postgres://user:password@host, redis://:password@host, smtp://...).
    (("@",), re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s:/?#@]*:)[^\s/?#@]+@"), r"\1" + REDACTED + "@"),
    # A key in a header's or a query's words: `x-api-key: ...`, `?api_key=...`, `"password": "..."`.
    (("key", "token", "secret", "password"),
     re.compile(r"(?i)(?<![a-z])((?:x-api-key|api[_-]?key|access[_-]?token|secret|password)[\"']?\s*[:=]\s*[\"']?)"
                r"(?!\[redacted\])[^\s\"'&,;}]+"), r"\1" + REDACTED),
)

# Secrets declared above config: each provider's spec (executor.providers.spec) names its key's shape and
# the settings holding its key and callback secret (FAL_KEY is not named like a secret). config may not
# import executor (the one-way stack, tests/project/test_architecture.py), so executor's AppConfig.ready()
# hands them down once, at start (register_secrets): the one way for this layer to learn what a higher
# one declares. Every Redactor reads the shapes at each use and RedactFilter reads the names again when
# they change, so a handler configured before the apps were ready (settings.LOGGING) redacts them too;
# the lines written before it (settings and apps loading, no provider called yet) have only the
# shapes and names above.
_registered: dict = {"shapes": (), "names": frozenset(), "version": 0}


def register_secrets(*, shapes=(), names=()) -> None:
    """Add secret shapes (`(needle, regex)`: the needle a lower-case text every match holds) and the names
    of variables whose values are secrets. Idempotent: a shape or name given again is kept once."""
    known = {pattern.pattern for _, pattern, _ in _registered["shapes"]}
    added = tuple(((needle,), re.compile(regex), REDACTED) for needle, regex in dict.fromkeys(shapes)
                  if regex not in known)
    names = frozenset(name.upper() for name in names) - _registered["names"]
    if added or names:
        _registered.update(shapes=_registered["shapes"] + added, names=_registered["names"] | names,
                           version=_registered["version"] + 1)


# Secret values read from the environment once, at start: provider keys and tokens, the secrets of
# this deployment, and the password of every URL setting. A value shorter than this is not searched for
# in free text (it would redact ordinary words); inside a URL it is still found by its place.
_SHORTEST_SECRET = 8


def _is_secret_name(name: str) -> bool:
    name = name.upper()
    return (name.endswith(("_API_KEY", "_TOKEN", "_SECRET", "_SECRET_KEY")) or "PASSWORD" in name
            or name in ("SECRET_KEY", "AWS_SECRET_ACCESS_KEY") or name in _registered["names"])


# kombu's rendering of a broker URL (celery's banner, "Connected to redis://:**@host:6379/0"): `:**` stands
# for the password whether or not there is one. The password itself is never in such a text.
_KOMBU_MASKED_URL = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://):\*\*@([^\s/?#:@\]]+|\[[^\s\]]*\])")


def hosts_with_passwords(environ) -> set[str]:
    """The hosts (lower-cased) of the environment's URLs that hold a password."""
    found = set()
    for value in environ.values():
        if value and "://" in value:
            try:
                parts = urlsplit(value)
                if parts.password and parts.hostname:
                    found.add(parts.hostname.lower())
            except ValueError:
                continue
    return found


def secrets_from_environ(environ) -> set[str]:
    """The secret values of an environment: variables named like a secret (…_API_KEY, …_TOKEN, …_SECRET,
    …PASSWORD…, AWS_SECRET_ACCESS_KEY, SECRET_KEY), and the password inside any URL setting
    (DATABASE_URL, BROKER_URL, EMAIL_URL, CACHE_URL, ...)."""
    found = set()
    for name, value in environ.items():
        if not value:
            continue
        if _is_secret_name(name):
            found.add(value)
        if "://" in value:
            try:
                password = urlsplit(value).password
            except ValueError:
                password = None
            if password:
                found.update({password, unquote(password)})
    return {value for value in found if len(value) >= _SHORTEST_SECRET}


# Field values with no text in them, so nothing to redact (Redactor.value leaves every non-text value as
# it is): exact types, so a subclass (an str enum) still goes the long way. A job's ids and amounts (a
# UUID, a run, a Decimal) are most of a line's fields.
_NO_TEXT = frozenset({int, float, bool, type(None), UUID, Decimal, datetime})


class Redactor:
    # Short texts already redacted, and what they became: the same job id, step, model and event name come
    # back in every line of a job. A pure function of the text, so a remembered answer is the answer.
    _REMEMBERED_LENGTH, _REMEMBERED_COUNT = 200, 4096

    def __init__(self, secrets=(), hosts_with_passwords=(), *, report_links: bool = True):
        """`report_links` False leaves report links as they are (the console mail with EMAIL_CONSOLE_LINKS)."""
        self._shapes = tuple(shape for shape in _SHAPES if report_links or shape is not _REPORT_LINK)
        literal = sorted(set(secrets), key=len, reverse=True)  # the longest first: one may contain another
        self._literal = re.compile("|".join(map(re.escape, literal))) if literal else None
        self._remembered: dict[str, str] = {}
        self._hosts_with_passwords = {host.lower() for host in hosts_with_passwords}
        self._version = _registered["version"]
        self._all_shapes = self._shapes + _registered["shapes"]

    def text(self, value: str) -> str:
        if self._version != _registered["version"]:  # new shapes: what was remembered may hold one
            # The version read before the shapes (shapes registered in between make it differ again), and
            # set after them (another thread seeing it redacts with them).
            version = _registered["version"]
            self._all_shapes = self._shapes + _registered["shapes"]
            self._remembered.clear()
            self._version = version
        remembered = self._remembered.get(value)
        if remembered is not None:
            return remembered
        redacted = self._redact(value)
        if len(value) <= self._REMEMBERED_LENGTH:
            if len(self._remembered) >= self._REMEMBERED_COUNT:
                self._remembered.clear()  # threads may race here: the worst is a text redacted again
            self._remembered[value] = redacted
        return redacted

    def _redact(self, value: str) -> str:
        if self._literal is not None:
            value = self._literal.sub(REDACTED, value)
        lowered = value.lower()
        if ":**@" in value:
            # kombu's mask: `[redacted]` where a URL of the environment for that host holds a password, and
            # otherwise the URL as it is (a `redis://:[redacted]@` for a Redis with no password misled).
            value = _KOMBU_MASKED_URL.sub(self._unmask, value)
        for needles, pattern, replacement in self._all_shapes:
            for needle in needles:  # any() of a generator, without making one per shape and text
                if needle in lowered:
                    value = pattern.sub(replacement, value)
                    break
        return value

    def _unmask(self, match: re.Match) -> str:
        scheme, host = match.group(1), match.group(2)
        if host.strip("[]").lower() in self._hosts_with_passwords:
            return f"{scheme}:{REDACTED}@{host}"
        return f"{scheme}{host}"

    def value(self, value):
        """A field's value with its strings redacted (inside lists, sets and dicts too, a dict's keys as well:
        the JSON line writes them all); other values as they are."""
        if type(value) in _NO_TEXT:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.value(key): self.value(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.value(item) for item in value]
        if isinstance(value, (set, frozenset)):
            return {self.value(item) for item in value}
        return value


class RedactFilter(logging.Filter):
    """Replaces every secret in a record with `[redacted]`: the message with its arguments (merged into
    one string, so a secret passed as an argument is found too), the extra fields, the exception's text
    and the stack. On the handler, so every record it writes passes here, whichever logger it came from."""

    def __init__(self, name: str = "", environ=None):
        super().__init__(name)
        self._environ = os.environ if environ is None else environ
        self._build()

    def _build(self) -> None:
        self._version = _registered["version"]
        found, hosts = secrets_from_environ(self._environ), hosts_with_passwords(self._environ)
        self.redactor = Redactor(found, hosts)
        # For a record that says `shows_report_links` (config.mail's console mail, when asked to).
        self.showing_links = Redactor(found, hosts, report_links=False)

    def filter(self, record: logging.LogRecord) -> bool:
        if self._version != _registered["version"]:  # secret names registered since (register_secrets)
            self._build()
        redact = self.showing_links if getattr(record, "shows_report_links", False) is True else self.redactor
        try:
            message = record.getMessage()
        except Exception:  # arguments that do not fit the message: keep both, as text
            message = f"{record.msg} {record.args!r}"
        record.msg, record.args = redact.text(message), ()
        fields = record.__dict__
        for name in _extra_names(record)[0]:
            fields[name] = redact.value(fields[name])
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact.text(record.exc_text)
        if record.stack_info:
            record.stack_info = redact.text(record.stack_info)
        return True


# --- formatting ------------------------------------------------------------------------------------------


_PROCESS: list = []


def process_name() -> str | None:
    """Which payonce process this is (web, worker, webhooks, beat, or a manage.py command), from
    PAYONCE_PROCESS or the command line the Procfile runs; None when it cannot tell (a test, a shell)."""
    if not _PROCESS:
        _PROCESS.append(os.environ.get("PAYONCE_PROCESS") or _process_from_argv(sys.argv))
    return _PROCESS[0]


def _process_from_argv(argv: list[str]) -> str | None:
    program = Path(argv[0]).name if argv else ""
    if program == "uvicorn" or "uvicorn" in argv[1:2]:
        return "web"
    if program == "celery" or "celery" in argv[1:3]:
        if "beat" in argv:
            return "beat"
        if "worker" in argv:
            queues = {argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg in ("-Q", "--queues")}
            return "webhooks" if any("webhooks" in queue for queue in queues) else "worker"
        return None
    if program == "manage.py" and len(argv) > 1:
        return f"manage.py {argv[1]}"
    return None


def _fields(record: logging.LogRecord, line: dict | None = None) -> dict:
    """The record's fields: the ids first (FIELDS), then any other extra field; added to `line` (the
    names it has already keep their value and place), or to a new dict."""
    line = {} if line is None else line
    fields = record.__dict__
    for name in FIELDS:
        value = fields.get(name)
        if value is not None and name not in line:
            line[name] = value
    for name in _extra_names(record)[1]:
        if name not in line:  # an id of FIELDS that is None comes in its place among the others
            line[name] = fields[name]
    return line


def _json_value(value):
    """What json.dumps cannot write: ids, amounts and times as text; any other object by its type only
    (its repr might hold what it was given)."""
    if isinstance(value, (UUID, Decimal, datetime, Path)):
        return str(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    return f"<{type(value).__name__}>"


# What json.dumps(line, default=_json_value, separators=(",", ":")) writes, with its encoder made once:
# dumps makes one on every call given an option. Safe across threads (each encode has its own state).
_encode = json.JSONEncoder(default=_json_value, separators=(",", ":")).encode
_encode_plain = json.JSONEncoder(separators=(",", ":")).encode


_second: tuple = (None, "")  # the last whole second formatted, and its text (one tuple: read whole)


def _iso(created: float) -> str:
    """`2026-12-03T10:57:14.774Z`; the seconds part is formatted once per second, not once per line."""
    global _second
    second, milliseconds = divmod(int(created * 1000), 1000)
    last = _second
    if last[0] != second:
        last = _second = (second, datetime.fromtimestamp(second, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S"))
    return f"{last[1]}.{milliseconds:03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ts (ISO 8601, UTC), level, logger, event (the message),
    process, pid, the ids of FIELDS that apply, any other extra field, and an exception as `exc` (its
    traceback, newlines escaped) with `exc_type`. ASCII only, so no reader splits a line in two."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"ts": _iso(record.created), "level": record.levelname, "logger": record.name,
                "event": record.getMessage()}
        process = process_name()
        if process:
            line["process"] = process
        line["pid"] = record.process
        _fields(record, line)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            if record.exc_info and record.exc_info[0] is not None:
                line["exc_type"] = record.exc_info[0].__name__
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        try:
            return _encode(line)
        except (TypeError, ValueError):  # a field that refers to itself, keys that are not text, ...
            return _encode_plain({key: value if isinstance(value, (str, int, float, bool)) else _json_value(value)
                                  for key, value in line.items()})


class PlainFormatter(logging.Formatter):
    """The developer's format: `time LEVEL logger message key=value ...`, the traceback below it."""

    def __init__(self):
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{name}={value}" for name, value in _fields(record).items())
        text = super().formatMessage(record)
        return f"{text} {fields}" if fields else text


def formatter(name: str | None = None) -> logging.Formatter:
    """The formatter LOG_FORMAT names: `json` (the default) or `plain`. A factory for dictConfig ("()"),
    so config/uvicorn-log.json follows LOG_FORMAT too."""
    name = (name if name is not None else os.environ.get("LOG_FORMAT", "json")).strip().lower() or "json"
    if name == "json":
        return JsonFormatter()
    if name == "plain":
        return PlainFormatter()
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(f"LOG_FORMAT={name!r}: expected json or plain")
