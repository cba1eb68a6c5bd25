"""payonce settings: everything comes from the environment, every default works on a developer machine
with PostgreSQL and Redis on localhost (see docs/api.md, "Settings")."""

from datetime import timedelta
from pathlib import Path

from config.env import (
    database_from_url,
    email_from_url,
    env_bool,
    env_decimal,
    env_float,
    env_int,
    env_int_list,
    env_limits,
    env_list,
    env_str,
)
from config.startup import DEVELOPMENT_SECRET_KEY

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("PAYONCE_VAR_DIR", str(BASE_DIR / "var")))

# --- Django ------------------------------------------------------------------------------------------------

# Unset, the repository's development key: fine with DEBUG on; with DEBUG off every long-running process
# refuses to start with it (config.startup), and `make run` generates one into var/secret_key.
SECRET_KEY = env_str("SECRET_KEY", DEVELOPMENT_SECRET_KEY)
# Rotating SECRET_KEY (docs/operating.md, "Rotating secrets"): the previous keys, comma-separated, still
# verify what they signed (mailed report links, admin sessions) while new signatures use SECRET_KEY. Drop
# one once what it signed has expired (REPORT_LINK_MAX_AGE_S, the sessions' two weeks).
SECRET_KEY_FALLBACKS = env_list("SECRET_KEY_FALLBACKS", "")
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "http://localhost:8000,http://127.0.0.1:8000")

INSTALLED_APPS = [
    "operators.adminsite.PayonceAdminConfig",  # django.contrib.admin, payonce's site (operators.adminsite)
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework_api_key",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_results",
    # payonce's apps, a one-way stack from the top (docs/architecture.md): each imports only those below it.
    "operators",
    "orders",
    "jobs",
    "executor",
    "webhooks",
    "billing",
    "accounts",  # the tenant: clients and their API keys, the floor every other app points down at
    "axes",  # admin login throttling (below)
]

MIDDLEWARE = [
    # The web process runs this chain sync, in one hop to a thread per request (config.asgi): a middleware
    # need not be async-capable, and the event stream's async view is still served as one.
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last: turns a lockout into config.logins.locked_out's answer
]

# --- admin logins: throttled (django-axes) -------------------------------------------------------------------
# 40 wrong passwords once took 9.5 s with no delay, each costing 0.24 s of CPU to hash. After
# ADMIN_LOGIN_FAILURE_LIMIT failures a user *and* address pair is refused for ADMIN_LOGIN_LOCKOUT_S,
# before any password is hashed (AxesStandaloneBackend runs first), with a 429 that says the same whether
# or not the password was right. The pair, not the user alone: a stranger cannot lock an operator out
# from elsewhere. A success resets the count.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env_int("ADMIN_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(seconds=env_int("ADMIN_LOGIN_LOCKOUT_S", 900, minimum=1))
# And ADMIN_LOGIN_ADDRESS_FAILURE_LIMIT failures from one address, whatever the usernames, lock that address
# out (config.logins.LoginFailures): unknown usernames, one per try, cost the hasher's CPU too.
ADMIN_LOGIN_ADDRESS_FAILURE_LIMIT = env_int("ADMIN_LOGIN_ADDRESS_FAILURE_LIMIT", 20, minimum=1)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "ip_address"]  # this order: LoginFailures reads it
AXES_HANDLER = "config.logins.LoginFailures"
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "config.logins.locked_out"
# The address is the connection's, as uvicorn gives it: uvicorn believes X-Forwarded-For only from the
# proxies FORWARDED_ALLOW_IPS names (its default, 127.0.0.1: a proxy on the same machine), so a client
# elsewhere cannot rotate a header past a lock-out.

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = env_str("DATABASE_URL", "postgres://localhost:5432/payonce")
_database = database_from_url(DATABASE_URL)
# psycopg 3's pool (Django >= 5.1). Celery's Django fix-up closes connections before and after every
# task; with a pool that returns the connection instead of opening a new one for each task.
if env_bool("DB_POOL", True):
    _database["OPTIONS"]["pool"] = {
        "min_size": 1,
        "max_size": env_int("DB_POOL_MAX", 24, minimum=2),
        "timeout": env_float("DB_POOL_TIMEOUT_S", 10.0, minimum=0.1),
    }
else:
    _database["CONN_MAX_AGE"] = env_int("DB_CONN_MAX_AGE", 0, minimum=0)
# Server-side binding: parameters travel apart from the SQL, and no parameter is quoted into the SQL in
# Python (a quarter of a media job's CPU in web and worker together, bench/README.md, issue 26). Nothing is
# prepared: Django leaves psycopg's prepare_threshold unset, so each statement is an unnamed one that lives
# for its round trip, and this stays on behind a PgBouncer in transaction mode (tests/config/test_pgbouncer.py).
if env_bool("DB_SERVER_SIDE_BINDING", True):
    _database["OPTIONS"]["server_side_binding"] = True
# Django reads a QuerySet's .iterator() (the operators' bulk actions) through a named cursor, declared WITH
# HOLD outside a transaction, so it outlives the transactions in between: session state, which a PgBouncer
# in transaction mode does not keep (the next FETCH may reach another server connection). Off behind one:
# the rows are read in one go instead.
_database["DISABLE_SERVER_SIDE_CURSORS"] = not env_bool("DB_SERVER_SIDE_CURSORS", True)
# A pooled connection that PostgreSQL dropped (a failover, a restart, a PgBouncer reload) fails the first
# query it is lent to, and is then discarded. On: the pool checks each connection as it lends it (one
# round trip), so a failover costs no request and no task a failed query.
_database["CONN_HEALTH_CHECKS"] = env_bool("DB_HEALTH_CHECKS", False)
DATABASES = {"default": _database}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# `manage.py migrate` (operators/management/commands/migrate.py): over a direct connection to the primary
# when MIGRATE_DATABASE_URL names one (not a PgBouncer: a migration's long statements and its session
# settings belong on a connection of its own), and with a lock_timeout, so that a migration that cannot
# have its lock at once fails in that time instead of queueing every query of the running release behind
# it; a statement_timeout too when set (0: none, since moving data may take long). Its flags override both.
_migrate_url = env_str("MIGRATE_DATABASE_URL", "")
MIGRATE_DATABASE = database_from_url(_migrate_url) if _migrate_url else None
MIGRATE_LOCK_TIMEOUT_S = env_float("MIGRATE_LOCK_TIMEOUT_S", 5.0, minimum=0)
MIGRATE_STATEMENT_TIMEOUT_S = env_float("MIGRATE_STATEMENT_TIMEOUT_S", 0.0, minimum=0)

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
# The admin's and the API docs' static files are served by config.asgi straight from the installed
# packages, so `make run` needs no collectstatic step. A deployment behind a CDN or proxy may set
# STATIC_ROOT, run collectstatic and serve them from there.
STATIC_ROOT = env_str("STATIC_ROOT", "") or None

# Logs (config.logs): LOG_FORMAT=json (the default) writes one JSON object per line, with the job_id, step,
# attempt, upstream_key, delivery_id, run and model of the code that logged it; LOG_FORMAT=plain is the
# same records for a developer's terminal. Either way the one handler passes every record through the
# redaction filter: no API key, webhook secret, provider key or password is written. The worker and beat
# log through this too (config.celery), and the web process's uvicorn lines (config/uvicorn-log.json).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"console": {"()": "config.logs.formatter", "name": env_str("LOG_FORMAT", "json")}},
    "filters": {"context": {"()": "config.logs.ContextFilter"}, "redact": {"()": "config.logs.RedactFilter"},
                # The periodic tasks of CELERY_BEAT_SCHEDULE, below (their names, with the [ of a task id
                # or the ( of beat's line, so jobs.sweep never matches jobs.sweeper_something).
                "routine": {"()": "config.logs.RoutineFilter",
                            "tasks": [f"{name}{edge}" for name in ("jobs.sweep", "webhooks.drain", "billing.fold")
                                      for edge in ("[", ")")]}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "console",
                    "filters": ["routine", "context", "redact"]},
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    # Django's own handlers on `django` (a console one under DEBUG, mail_admins) would write its records a
    # second time, in their own format: they reach the root's handler instead.
    "loggers": {
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        "django.db.backends": {"level": "INFO"},
        # django-axes says "BEGIN version ..." at INFO in every process, every manage.py command included.
        "axes": {"level": "WARNING"},
        # Celery's two bookkeeping lines of every message, "received" and "succeeded in", at INFO: two of a
        # media job's thirteen lines, and a tenth of the worker's CPU with the rest (bench/README.md, issue
        # 44), saying again what the step's own lines say (step.claimed, step.done, with the job's ids).
        # Celery asks these loggers once, at start, whether INFO is on, and builds no record when it is not.
        # A task's failure (ERROR) and a rejected message (WARNING) are still written, and LOG_LEVEL=DEBUG
        # brings the bookkeeping lines back (then kept at DEBUG for the periodic tasks, RoutineFilter).
        **{name: {"level": "DEBUG" if env_str("LOG_LEVEL", "INFO").upper() == "DEBUG" else "WARNING"}
           for name in ("celery.worker.strategy", "celery.app.trace")},
    },
}

# --- API -----------------------------------------------------------------------------------------------

# The largest job request body accepted (413 above it), and the largest body of any other request. The
# web process refuses a larger one before reading it (config.limits), and drops a body that has not
# arrived within REQUEST_BODY_TIMEOUT_S. Django enforces the same bound on request.body.
JOB_BODY_MAX_BYTES = env_int("JOB_BODY_MAX_BYTES", 256 * 1024, minimum=1024)
# Threads per `web` process that run Django's sync code (config.asgi): this many requests of one process
# can wait on PostgreSQL, Redis or S3 at once; more queue for a thread.
WEB_THREADS = env_int("WEB_THREADS", 2, minimum=1)
REQUEST_BODY_MAX_BYTES = env_int("REQUEST_BODY_MAX_BYTES", 64 * 1024, minimum=1024)
REQUEST_BODY_TIMEOUT_S = env_float("REQUEST_BODY_TIMEOUT_S", 10.0, minimum=0.1)
# The longest /readyz takes (operators.probes): past it, a database or broker that has not answered is
# not ready (503). Below a load balancer's or an orchestrator's own probe timeout.
READYZ_TIMEOUT_S = env_float("READYZ_TIMEOUT_S", 2.0, minimum=0.1)
DATA_UPLOAD_MAX_MEMORY_SIZE = JOB_BODY_MAX_BYTES
# What comes before a request, bounded by the web process's HTTP protocol (config.http): a request line
# and headers over WEB_MAX_HEADER_BYTES are `431` at once, a header block not complete within
# WEB_HEADER_TIMEOUT_S of its first byte closes the connection, and a process holds at most
# WEB_MAX_CONNECTIONS connections (fewer if its fd limit leaves less room).
WEB_MAX_HEADER_BYTES = env_int("WEB_MAX_HEADER_BYTES", 16 * 1024, minimum=1024)
WEB_HEADER_TIMEOUT_S = env_float("WEB_HEADER_TIMEOUT_S", 10.0, minimum=0.1)
WEB_MAX_CONNECTIONS = env_int("WEB_MAX_CONNECTIONS", 1000, minimum=1)
FILE_UPLOAD_MAX_MEMORY_SIZE = max(JOB_BODY_MAX_BYTES, REQUEST_BODY_MAX_BYTES, 2_621_440)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["jobs.api.auth.BearerAPIKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "jobs.api.errors.api_exception_handler",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "payonce API",
    "DESCRIPTION": "Paid AI generation jobs where every layer may retry and the money is spent once.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Enums named for what they are (the client libraries' types take these names), not StatusEnum.
    "ENUM_NAME_OVERRIDES": {"JobStatus": "jobs.models.JobStatus", "JobKind": "jobs.models.job_kinds",
                            "OrderStatus": ["paid", "duplicate"]},
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "jobs.api.schema.report_fields_are_optional", "jobs.api.schema.event_stream_path",
                             "jobs.api.schema.api_errors"],
}

# Where links to outputs point (job JSON, webhooks). The API serves filesystem-store outputs itself.
# Unset, it follows the web process's own PORT.
PUBLIC_BASE_URL = env_str("PUBLIC_BASE_URL", f"http://127.0.0.1:{env_int('PORT', 8000)}").rstrip("/")

# --- payonce -------------------------------------------------------------------------------------------

OUTPUT_STORE_URL = env_str("OUTPUT_STORE_URL", "file://./var/outputs")
SANDBOX_URL = env_str("SANDBOX_URL", f"http://127.0.0.1:{env_int('SANDBOX_PORT', 8100)}").rstrip("/")
WEBHOOK_ALLOW_PRIVATE = env_bool("WEBHOOK_ALLOW_PRIVATE", False)
BUDGET_MONTHLY_CAP_USD = env_decimal("BUDGET_MONTHLY_CAP_USD", "20")
# A price drift (an attempt that settled above its reservation: the rate card says less than the provider
# charges) raises the model's reservations to the highest cost seen for this long after it was last seen,
# unless an operator clears it first (billing.models.PriceDrift).
PRICE_DRIFT_HOLD_S = env_float("PRICE_DRIFT_HOLD_S", 30 * 24 * 3600.0, minimum=1.0)
REAL_PROVIDERS = env_bool("REAL_PROVIDERS", False)
SWEEP_INTERVAL_S = env_float("SWEEP_INTERVAL_S", 10.0, minimum=0.1)
POLL_INTERVAL_S = env_float("POLL_INTERVAL_S", 2.0, minimum=0.05)
# The longest back-off between tries of a step or a provider call (a provider's Retry-After aside):
# exponential with jitter up to this (and at most 60 s). The storm lowers it, to measure recovery
# rather than back-offs.
RETRY_BACKOFF_MAX_S = env_float("RETRY_BACKOFF_MAX_S", 60.0, minimum=0.1)
WEBHOOK_RETRY_SCHEDULE = env_int_list("WEBHOOK_RETRY_SCHEDULE", "5,300,1800,7200,18000,36000,36000")
# A delivery's first try is enqueued when its event commits; the drainer takes the row only if that
# message has not sent it within this grace.
WEBHOOK_FIRST_TRY_GRACE_S = env_float("WEBHOOK_FIRST_TRY_GRACE_S", 30.0, minimum=0.0)
# A try holds its row this long (the SSRF guard's 5 s connect + 15 s read, and margin): a dispatcher that
# died mid-try delays the row by at most this.
WEBHOOK_SEND_LEASE_S = env_float("WEBHOOK_SEND_LEASE_S", 60.0, minimum=1.0)
WEBHOOK_DRAIN_INTERVAL_S = env_float("WEBHOOK_DRAIN_INTERVAL_S", 5.0, minimum=0.1)
# Due rows for one target travel to a dispatcher together, up to this many per message.
WEBHOOK_BATCH_SIZE = env_int("WEBHOOK_BATCH_SIZE", 50, minimum=1)

# Real providers (docs/design.md, "Real money is opt-in"). Off: the real adapters answer from
# recorded fixtures, with no network. On: each adapter needs its key, and REAL_PROVIDERS=1 with no key at
# all refuses to start (executor.providers.real).
ANTHROPIC_API_KEY = env_str("ANTHROPIC_API_KEY", "")
ANTHROPIC_BASE_URL = env_str("ANTHROPIC_BASE_URL", "https://api.anthropic.com").rstrip("/")
OPENAI_API_KEY = env_str("OPENAI_API_KEY", "")
# Any OpenAI-compatible server (vLLM, llama.cpp, Ollama, ...): point this at its /v1.
OPENAI_BASE_URL = env_str("OPENAI_BASE_URL", "https://api.openai.com/v1").rstrip("/")
REPLICATE_API_TOKEN = env_str("REPLICATE_API_TOKEN", "")
REPLICATE_BASE_URL = env_str("REPLICATE_BASE_URL", "https://api.replicate.com").rstrip("/")
FAL_KEY = env_str("FAL_KEY", "")
FAL_BASE_URL = env_str("FAL_BASE_URL", "https://queue.fal.run").rstrip("/")

# The models payonce knows (executor.registry, docs/providers.md): the code's, then those of this JSON file
# (added or overridden, with their prices), then the admin's Models page. Every process reads the file and
# the admin's rows again within MODELS_CACHE_S of a change: no release, no restart.
MODELS_FILE = env_str("MODELS_FILE", "")
MODELS_CACHE_S = env_float("MODELS_CACHE_S", 10.0, minimum=0.0)

# Waiting (docs/design.md, "Waiting"). Polls back off from POLL_INTERVAL_S to POLL_MAX_INTERVAL_S (the first at
# the provider's expected duration where it says one). Providers that call back are asked to, at
# PROVIDER_CALLBACK_BASE_URL + /v1/callbacks/<provider> (set it to `off` for none): a callback only wakes
# the waiting step at once; polling stays the fallback. Each provider's callbacks are verified (Standard
# Webhooks) with its secret: the sandbox's SANDBOX_CALLBACK_SECRET (the sandbox's own default unless
# set), Replicate's REPLICATE_WEBHOOK_SECRET (GET /v1/webhooks/default/secret; unset, Replicate is not
# asked to call back).
POLL_MAX_INTERVAL_S = env_float("POLL_MAX_INTERVAL_S", 30.0, minimum=0.05)
# With a callback expected, polls are only the fallback: their gaps start this many times longer.
POLL_CALLBACK_FACTOR = env_float("POLL_CALLBACK_FACTOR", 4.0, minimum=1.0)
PROVIDER_CALLBACK_BASE_URL = env_str("PROVIDER_CALLBACK_BASE_URL", PUBLIC_BASE_URL).rstrip("/")
# Unset (or empty): the sandbox's own development default (sandbox/callbacks.py DEFAULT_SECRET), so the two
# agree. Written out here rather than imported: the executor reads it from settings and imports nothing of the
# sandbox; tests/project/test_architecture.py holds the two equal.
SANDBOX_DEFAULT_CALLBACK_SECRET = "whsec_c2FuZGJveC1jYWxsYmFjay1zZWNyZXQtZm9yLWRldmVsb3BtZW50"
SANDBOX_CALLBACK_SECRET = env_str("SANDBOX_CALLBACK_SECRET", "") or SANDBOX_DEFAULT_CALLBACK_SECRET
# The largest output the sandbox renders (sandbox/catalog.py MAX_SIZE_BYTES): the bound of its media models'
# size_bytes parameter (executor.registry). A copy of the sandbox's constant, as the secret above.
SANDBOX_MAX_SIZE_BYTES = 50 * 1024 * 1024
REPLICATE_WEBHOOK_SECRET = env_str("REPLICATE_WEBHOOK_SECRET", "")
# fal signs its webhooks with ED25519 keys it publishes as a JWKS; they are read from here (cached).
FAL_WEBHOOK_JWKS_URL = env_str("FAL_WEBHOOK_JWKS_URL", "https://rest.alpha.fal.ai/.well-known/jwks.json")
# A fetch of that key page may happen on a request's thread (no keys yet): seconds, not PROVIDER_READ_TIMEOUT_S.
FAL_WEBHOOK_JWKS_TIMEOUT_S = env_float("FAL_WEBHOOK_JWKS_TIMEOUT_S", 3.0, minimum=0.1)

# Callables run just before every submit (executor.checks); a refusal fails the attempt unspent.
PRE_SUBMIT_CHECKS = env_list("PRE_SUBMIT_CHECKS", "")

# Provider calls: how long to wait to connect and for an answer. Every network call has a bound, because
# the threads pool cannot enforce Celery's time limits (below).
PROVIDER_CONNECT_TIMEOUT_S = env_float("PROVIDER_CONNECT_TIMEOUT_S", 5.0, minimum=0.1)
PROVIDER_READ_TIMEOUT_S = env_float("PROVIDER_READ_TIMEOUT_S", 30.0, minimum=0.1)
# An LLM call writes up to 8,000 tokens: it may take this long to answer (docs/design.md, "Reports and orders").
LLM_READ_TIMEOUT_S = env_float("LLM_READ_TIMEOUT_S", 120.0, minimum=0.1)
# Leases (docs/design.md, "How a job runs: durable steps"). A step holds its lease while it works and renews it every
# third of STEP_LEASE_S; a worker that died stops renewing and its step is taken over when the lease runs out. A
# job's enqueue lease is how long a message sent for it may take to be picked up before the sweeper
# sends another. Recovery after a dead worker or a flushed broker is bounded by SWEEP_INTERVAL_S plus
# these leases, never by the broker's visibility timeout.
STEP_LEASE_S = env_float("STEP_LEASE_S", 30.0, minimum=1.0)
ENQUEUE_LEASE_S = env_float("ENQUEUE_LEASE_S", 60.0, minimum=1.0)
# How long a second execution of a step waits for the first one's result before re-scheduling itself.
ATTACH_WAIT_S = env_float("ATTACH_WAIT_S", 10.0, minimum=0.0)
# How long a store error that may pass (a network error, a 5xx, a full disk) is retried before the job
# fails UPLOAD_FAILED; an error that cannot pass (a key the store cannot hold) fails it at once.
STORE_RETRY_WINDOW_S = env_float("STORE_RETRY_WINDOW_S", 600.0, minimum=1.0)
# Every wait ends (docs/design.md, "Every wait ends"): the longest an accepted attempt is waited on when neither the
# job's policy.window_s nor the provider sets a window. Past it the attempt is cancelled upstream where
# the provider can and ends window_expired.
WAIT_DEADLINE_S = env_float("WAIT_DEADLINE_S", 3600.0, minimum=1.0)
# Every wait ends for an attempt whose send's outcome is unknown too: past this long after its first send
# with no answer that settles it (resends of a key unanswered, lookups that cannot conclude), it becomes
# uncertain and its job waits for a person (UNCERTAIN_SUBMIT), as a blind provider's does at once. A
# provider that accepts and never answers held a lookup job running for good without it.
UNKNOWN_OUTCOME_MAX_S = env_float("UNKNOWN_OUTCOME_MAX_S", 900.0, minimum=1.0)
# How long the sandbox remembers a request_id (unset: for ever, as it does by default). The sandbox
# server and payonce's sandbox adapter read the same variable, so a test or a demo of a key that expires
# sees both sides agree: past it, an attempt whose outcome is unknown is uncertain, never resent.
SANDBOX_KEY_TTL_S = env_float("SANDBOX_KEY_TTL_S", 0.0, minimum=0.0) or None

# Calls in flight per provider or per model, shared by every client and worker (executor.in_flight; docs/api.md,
# "Limits"): `provider=N` or `provider/model=N`, comma-separated, over what each provider's spec declares
# (ProviderSpec.max_in_flight). A call past one waits, unsent: no intent, no key, nothing reserved.
PROVIDER_MAX_IN_FLIGHT = env_limits("PROVIDER_MAX_IN_FLIGHT")

# Creates per second per client (jobs.api.limits; docs/api.md, "Limits"): a token bucket of CLIENT_CREATE_BURST
# filling at CLIENT_CREATES_PER_S, unless the client's own row says otherwise; 0: no limit.
CLIENT_CREATES_PER_S = env_float("CLIENT_CREATES_PER_S", 500.0, minimum=0.0)
CLIENT_CREATE_BURST = env_int("CLIENT_CREATE_BURST", 1000, minimum=1)
# Jobs of one client in progress at once (jobs.dispatch), unless its row says otherwise; 0: no limit. A job
# past it waits queued; a render waiting on its provider holds no slot.
CLIENT_MAX_RUNNING = env_int("CLIENT_MAX_RUNNING", 100, minimum=0)
# Fair dispatch across clients (jobs.dispatch). Off: each message starts the job it was sent for, first in,
# first out, the order before fair dispatch (the baseline bench/fairness.py measures it against); running
# limits and priorities of jobs rung for again still hold.
FAIR_DISPATCH = env_bool("FAIR_DISPATCH", True)

# Reports (docs/design.md, "Reports and orders").
REPORT_SYNTHESIS_MAX_TOKENS = env_int("REPORT_SYNTHESIS_MAX_TOKENS", 2000, minimum=1)
REPORT_CHAPTER_MAX_TOKENS = env_int("REPORT_CHAPTER_MAX_TOKENS", 4000, minimum=1)
REPORT_MAX_CHAPTERS = env_int("REPORT_MAX_CHAPTERS", 24, minimum=1)
# Report templates (docs/design.md, "Report templates"): the most a template may allow a call to write
# (its max_output_tokens), and how many templates, and versions of one, a client may keep.
REPORT_TEMPLATE_MAX_OUTPUT_TOKENS = env_int("REPORT_TEMPLATE_MAX_OUTPUT_TOKENS", 16000, minimum=1)
REPORT_TEMPLATES_MAX = env_int("REPORT_TEMPLATES_MAX", 100, minimum=1)
REPORT_TEMPLATE_VERSIONS_MAX = env_int("REPORT_TEMPLATE_VERSIONS_MAX", 500, minimum=1)
# Prompt caching (docs/design.md, "Reports and orders"): every chapter's prompt starts with the same prefix
# (the system prompt, the subject and the synthesis), marked as a cache breakpoint, so the provider bills it
# once at the cache-write price and then at the cache-read price (a tenth of the input price). Off: no mark.
REPORT_PROMPT_CACHE = env_bool("REPORT_PROMPT_CACHE", True)
# A cache entry exists once a call has written it: the first chapter left goes out alone, and the rest
# follow it in parallel once it has ended. Off: every chapter at once (the critical path one chapter
# shorter, the prefix written by each of the first calls that race).
REPORT_CACHE_WARMUP = env_bool("REPORT_CACHE_WARMUP", True)
# The emailed link: signed, and expiring after this long.
REPORT_LINK_MAX_AGE_S = env_int("REPORT_LINK_MAX_AGE_S", 30 * 86400, minimum=1)
# A mail outage after the seal: delivery is tried again with back-off for this long, then given up
# (the report stays sealed and readable; the failure is on the report).
REPORT_DELIVERY_DEADLINE_S = env_float("REPORT_DELIVERY_DEADLINE_S", 86400.0, minimum=1.0)
REPORT_RETENTION_DAYS = env_int("REPORT_RETENTION_DAYS", 90, minimum=0)
# The model a paid order's report is written with.
ORDER_REPORT_MODEL = env_str("ORDER_REPORT_MODEL", "sandbox/llm")
# Event streams (GET /v1/jobs/{id}/events): how often the job is read again, and how long a stream lasts.
SSE_INTERVAL_S = env_float("SSE_INTERVAL_S", 1.2, minimum=0.05)
SSE_MAX_S = env_float("SSE_MAX_S", 600.0, minimum=1.0)
# At most this many open streams per client, counted across every web process (leases in CACHE_URL's
# Redis; without one, per process), and per web process whoever opens them; one more is 429
# TOO_MANY_STREAMS (jobs.api.streams). 200 a process: tests/jobs/test_events.py holds 200 open on two cores while
# the API still answers; each costs a snapshot read every SSE_INTERVAL_S.
SSE_MAX_PER_CLIENT = env_int("SSE_MAX_PER_CLIENT", 20, minimum=1)
SSE_MAX_PER_PROCESS = env_int("SSE_MAX_PER_PROCESS", 200, minimum=1)

# Mail: EMAIL_URL (console:// prints, smtp://host:port sends).
EMAIL_URL = env_str("EMAIL_URL", "console://")
globals().update(email_from_url(EMAIL_URL))
# The console mail prints report links whole (development: `make run` turns it on); off, they are redacted.
EMAIL_CONSOLE_LINKS = env_bool("EMAIL_CONSOLE_LINKS", False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT_S", 10, minimum=1)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "payonce <reports@payonce.localhost>")

# --- Celery --------------------------------------------------------------------------------------------
# The broker is a doorbell: messages carry ids, Postgres holds the truth (docs/design.md, "Recovery: the sweeper").

CELERY_BROKER_URL = env_str("BROKER_URL", "redis://127.0.0.1:6379/0")
_REDIS_BROKER = CELERY_BROKER_URL.startswith(("redis://", "rediss://"))
# A provider callback is acted on once per message id, across web processes: the ids seen are kept in
# this cache (the broker's Redis unless CACHE_URL names another; in-process memory with a non-Redis broker).
CACHE_URL = env_str("CACHE_URL", CELERY_BROKER_URL if _REDIS_BROKER else "")
CACHES = {"default": (
    {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": CACHE_URL, "KEY_PREFIX": "payonce"}
    if CACHE_URL else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"})}
# GET /metrics (operators.metrics). With METRICS_TOKEN set, a scrape needs `Authorization: Bearer <token>`;
# unset, only loopback may scrape. Events that leave no row (sweeper recoveries, callbacks, polls) are
# counted in one hash in METRICS_REDIS_URL (the broker's Redis unless set), and the histograms (how long
# requests, jobs and provider calls took) kept in another; empty (a non-Redis broker and no URL set), they
# are not kept and /metrics does not export them.
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
METRICS_REDIS_URL = env_str("METRICS_REDIS_URL",
                            CELERY_BROKER_URL if _REDIS_BROKER else "")
CELERY_RESULT_BACKEND = "django-db"
CELERY_RESULT_EXTENDED = True
# Step and job rows hold every outcome; storing each task's return value would add a commit per message.
# Nor are failures stored: a task that failed because its database connection was cut had its error
# written over the same dead connection, which raised outside the task; Celery's threads pool swallowed
# that, the task was never completed nor acknowledged, and after WORKER_CONCURRENCY of them the worker
# took no message again (the storm's connection cuts found it: tests/e2e/test_crash.py). Every failure is
# a JSON log line with its task id and traceback instead (config.logs).
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_STORE_ERRORS_EVEN_IF_IGNORED = False
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_ENABLE_UTC = True

# At least once: a message is acknowledged after its task ran, and given back when a worker dies under it.
# Every task is idempotent against the database, so a second delivery is harmless.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# No task may hold a worker for long: waiting on a provider re-schedules itself. These limits are enforced
# by the prefork pool; the threads pool that payonce runs by default cannot enforce them (Celery limits
# are signal based), so every network call carries its own timeout and a stuck step is taken over when its
# lease runs out.
CELERY_TASK_SOFT_TIME_LIMIT = env_int("TASK_SOFT_TIME_LIMIT_S", 300, minimum=1)
CELERY_TASK_TIME_LIMIT = env_int("TASK_TIME_LIMIT_S", 330, minimum=2)
# Redis gives an unacknowledged message to another worker after visibility_timeout. It must be longer
# than the longest task and the longest countdown, or a slow task would run twice at once. Recovery
# from a dead worker does not wait for it: the sweeper re-enqueues by id (docs/design.md, "Recovery: the sweeper").
BROKER_VISIBILITY_TIMEOUT_S = env_int("BROKER_VISIBILITY_TIMEOUT_S", 3600, minimum=CELERY_TASK_TIME_LIMIT + 60)
CELERY_BROKER_TRANSPORT_OPTIONS = (
    {"visibility_timeout": BROKER_VISIBILITY_TIMEOUT_S, "socket_connect_timeout": 5, "socket_timeout": 10}
    if _REDIS_BROKER
    else {}
)
# kombu's Redis transport with one redis-py client per channel rather than one per publish and ack
# (config.broker: a quarter of web's CPU per POST went to building them).
if _REDIS_BROKER:
    CELERY_BROKER_TRANSPORT = "config.broker:Transport"
# A POST must not hang on a broker that is down: the job row is durable and the sweeper starts it.
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.5,
}
CELERY_BROKER_CONNECTION_TIMEOUT = 4

CELERY_TASK_DEFAULT_QUEUE = "jobs"
CELERY_TASK_ROUTES = {"webhooks.*": {"queue": "webhooks"}}
CELERY_BEAT_SCHEDULER = "config.celery:Scheduler"
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE = {
    "sweep": {"task": "jobs.sweep", "schedule": SWEEP_INTERVAL_S, "options": {"expires": SWEEP_INTERVAL_S}},
    "drain-deliveries": {"task": "webhooks.drain", "schedule": WEBHOOK_DRAIN_INTERVAL_S,
                         "options": {"expires": WEBHOOK_DRAIN_INTERVAL_S}},
    # Settled and released reservations moved into their months' counters (billing.services, step 4).
    "fold-budgets": {"task": "billing.fold", "schedule": SWEEP_INTERVAL_S, "options": {"expires": SWEEP_INTERVAL_S}},
}
