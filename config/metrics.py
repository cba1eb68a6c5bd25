"""`/metrics` in the Prometheus text format, and `count()`, the event counters kept in Redis.

Every figure is read at scrape time from where it is true, never from one process's memory: PostgreSQL
for what the rows say (jobs, attempts, spend, deliveries, lease takeovers), one Redis hash for events
that leave no row (sweeper recoveries, provider callbacks, polls). So any `web` process answers a scrape
with the same figures, whichever process did the work. Label values are bounded enums, a model name or
a client: never a job id, an upstream key or anything a request can grow without bound.
"""

import hmac
import ipaddress
import logging
import time
from decimal import Decimal

import redis
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from django.http import HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector
from redis.backoff import NoBackoff
from redis.retry import Retry

from billing.models import ReservationKind, ReservationState
from executor.models import AttemptState
from jobs.errors import error_body, method_not_allowed

logger = logging.getLogger(__name__)

# --- event counters (Redis) --------------------------------------------------------------------------

# name -> (label, its values, help). A value outside its list is counted as "other": the set of series
# stays bounded whatever a caller passes.
OTHER = "other"
COUNTERS = {
    "sweeper_recoveries": ("what", ("stuck_job", "cancelled_attempt"),
                           "Things the sweeper woke: a stuck job resumed, a cancelled job's attempt still out ended."),
    "callbacks": ("outcome", ("rung", "duplicate", "ended", "early", "unknown_generation", "bad_signature",
                              "not_configured", "invalid"),
                  "Provider callbacks received, by what payonce answered (executor.callbacks)."),
    "polls": ("outcome", ("running", "succeeded", "failed", "cancelled", "error"),
              "Polls of an accepted attempt, by what the provider said (error: the poll itself failed)."),
    "lease_takeovers": ("kind", ("media", "report"),
                        "Steps taken over from another holder whose lease ran out (its worker died or stalled), "
                        "by job kind: the logs' step.taken_over lines (jobs.steps._log_claim)."),
}
HASH_KEY = "payonce:metrics:counters"
# A counter is never worth a stall: a Redis that does not answer at once is left alone this long.
SOCKET_TIMEOUT_S = 0.25
PAUSE_AFTER_ERROR_S = 5.0

_client: tuple[str, redis.Redis] | None = None
_paused_until = 0.0


def _redis() -> redis.Redis | None:
    """The counters' Redis (METRICS_REDIS_URL), one connection pool per process; None when counters are
    not kept, or for a few seconds after an error."""
    global _client
    url = settings.METRICS_REDIS_URL
    if not url or time.monotonic() < _paused_until:
        return None
    if _client is None or _client[0] != url:
        # No retries: a counter lost with a Redis outage is cheaper than a provider call held up by it.
        _client = (url, redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT_S,
                                             socket_connect_timeout=SOCKET_TIMEOUT_S, retry=Retry(NoBackoff(), 0)))
    return _client[1]


def _pause(exc: Exception) -> None:
    global _paused_until
    _paused_until = time.monotonic() + PAUSE_AFTER_ERROR_S
    logger.debug("metrics: Redis unavailable, counters paused for %s s: %s", PAUSE_AFTER_ERROR_S, exc)


def _field(name: str, labels: dict) -> str:
    label, values, _ = COUNTERS[name]
    value = labels.get(label)
    return f"{name}|{value if value in values else OTHER}"


def count(name: str, **labels) -> None:
    """Add one to an event counter (HINCRBY on one hash). Never raises: it runs on the paths that spend
    money, and a metric must not be why one fails. One round trip, with short socket timeouts."""
    try:
        client = _redis()
        if client is not None:
            client.hincrby(HASH_KEY, _field(name, labels), 1)
    except Exception as exc:  # a metric never stops paid work
        _pause(exc)


def _counters() -> dict[str, int] | None:
    """Every counter's value (field -> count), or None when they are not kept or Redis did not answer."""
    client = _redis()
    if client is None:
        return None
    try:
        stored = client.hgetall(HASH_KEY)
    except Exception as exc:  # a scrape without the counters beats no scrape
        _pause(exc)
        return None
    return {field.decode(): int(value) for field, value in stored.items()}


# --- figures from PostgreSQL ---------------------------------------------------------------------------

# Beyond this many distinct models, the rarest are summed under model="other": clients name models, and
# an OpenAI-compatible server takes any name, so the label must not grow with what they send.
MAX_MODELS = 100
# Longer than any figure should take on a large table, shorter than Prometheus's default scrape timeout.
STATEMENT_TIMEOUT_MS = 8000

_ATTEMPTS_SQL = """
SELECT provider || '/' || model, state, coalesce(error_class, ''), count(*)
  FROM executor_attempt GROUP BY provider, model, state, error_class
"""
_JOBS_SQL = "SELECT status, kind, count(*) FROM jobs_job GROUP BY status, kind"
_DELIVERIES_SQL = "SELECT status, count(*) FROM webhooks_delivery GROUP BY status"
# A step's `attempts` counts the claims of its lease (jobs.steps.step_claim): every claim beyond the first
# took it over from a holder whose lease ran out (a dead or stalled worker), or took it back under the
# same task or chain (after a back-off, between two polls of a wait). The row keeps no more than that.
_TAKEOVERS_SQL = "SELECT coalesce(sum(attempts - 1), 0) FROM jobs_step WHERE attempts > 1"
# Billing's count of unpriced attempts (billing.selectors._BY_MODEL_SQL: settled unpriced, or held for an
# attempt whose outcome is unknown), for every client month at once. The attempt is found by its job and
# upstream key, so on the job's index: month_spend's join on the key alone reads the whole attempts table
# per client (1 s per client at 1,000,000 attempts). The month is joined, not listed: given the budget ids,
# the planner walks the budget index over the month's rows in random order (4 s against 0.5 s measured).
# tests/test_metrics.py checks that this and month_spend agree.
_UNPRICED_SQL = f"""
SELECT r.budget_id, count(*) FROM billing_reservation r JOIN billing_budgetmonth b ON b.id = r.budget_id
 WHERE b.month = %s AND r.kind = '{ReservationKind.ATTEMPT}'
   AND ((r.state = '{ReservationState.SETTLED}' AND r.unpriced)
        OR (r.state = '{ReservationState.HELD}' AND EXISTS (
            SELECT 1 FROM executor_attempt a
             WHERE a.job_id = r.job_id AND a.upstream_key = r.key AND a.state = '{AttemptState.UNCERTAIN}')))
 GROUP BY r.budget_id
"""


def _money(value: Decimal) -> float:
    """Billing's Decimal to the float Prometheus carries: only here, at the exposition."""
    return float(value)


class PayonceCollector(Collector):
    """Reads every figure at each scrape, in one read-only snapshot, so the figures agree with each other
    (a job counted succeeded has its attempt counted succeeded too)."""

    def collect(self):
        from billing.models import BudgetMonth  # late: the executor and the sweeper import this module
        from billing.selectors import cap_of, month_totals
        from billing.services import month_of
        from executor.providers.base import ErrorClass
        from jobs.models import JobKind, JobStatus
        from webhooks.models import DeliveryStatus

        error_classes = {value for name, value in vars(ErrorClass).items() if not name.startswith("_")}
        outer = connection.in_atomic_block
        with transaction.atomic(), connection.cursor() as cursor:
            if not outer:  # SET TRANSACTION must come first; inside a caller's transaction, theirs holds
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            cursor.execute(f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}")
            # Aggregates over large tables look expensive to the planner, which then compiles them (JIT):
            # measured, the compiling took longer than the reads.
            cursor.execute("SET LOCAL jit = off")
            cursor.execute(_JOBS_SQL)
            jobs = {(status, kind): n for status, kind, n in cursor.fetchall()}
            cursor.execute(_ATTEMPTS_SQL)
            attempts = cursor.fetchall()
            cursor.execute(_DELIVERIES_SQL)
            deliveries = dict(cursor.fetchall())
            cursor.execute(_TAKEOVERS_SQL)
            takeovers = cursor.fetchone()[0]
            # The clients with a budget row this month (those that reserved anything in it), with
            # billing's own figures: the counters plus what is not folded yet, and the cap.
            month = month_of(timezone.now())
            budgets = list(BudgetMonth.objects.filter(month=month).select_related("client")
                           .order_by("client__name", "client_id"))
            cursor.execute(_UNPRICED_SQL, [month])
            unpriced = dict(cursor.fetchall())
            spend = [(budget.client, *month_totals(budget), cap_of(budget.client), unpriced.get(budget.id, 0))
                     for budget in budgets]

        family = GaugeMetricFamily("payonce_jobs", "Jobs by status and kind.", labels=["status", "kind"])
        for status in JobStatus.values:
            for kind in JobKind.values:
                family.add_metric([status, kind], jobs.get((status, kind), 0))
        yield family

        yield self._attempts(attempts, error_classes)

        gauges = {
            "spent": GaugeMetricFamily("payonce_spent_usd", "Spent this UTC month (as GET /v1/spend says).",
                                       labels=["client", "client_id"]),
            "reserved": GaugeMetricFamily("payonce_reserved_usd", "Reserved and not yet settled, this UTC month.",
                                          labels=["client", "client_id"]),
            "cap": GaugeMetricFamily("payonce_cap_usd", "The client's monthly cap.", labels=["client", "client_id"]),
            "unpriced": GaugeMetricFamily("payonce_unpriced_attempts",
                                          "Attempts this month nobody could price (kept at their whole reservation).",
                                          labels=["client", "client_id"]),
        }
        for client, spent, reserved, cap, unpriced_attempts in spend:
            labels = [client.name, str(client.id)]
            gauges["spent"].add_metric(labels, _money(spent))
            gauges["reserved"].add_metric(labels, _money(reserved))
            gauges["cap"].add_metric(labels, _money(cap))
            gauges["unpriced"].add_metric(labels, unpriced_attempts)
        yield from gauges.values()

        family = GaugeMetricFamily("payonce_deliveries", "Webhook deliveries by status.", labels=["status"])
        for status in DeliveryStatus.values:
            family.add_metric([status], deliveries.get(status, 0))
        yield family

        # Every claim of a step's lease beyond its first, from the rows: a takeover (counted alone by
        # payonce_lease_takeovers_total), or a holder taking its own lease back after a back-off or a poll.
        yield CounterMetricFamily("payonce_step_reclaims", "Claims of a step's lease beyond its first: taken over "
                                  "from a holder whose lease ran out, or taken back after a back-off or between polls.",
                                  value=takeovers)

        yield from self._events()

    @staticmethod
    def _attempts(rows, error_classes: set[str]) -> GaugeMetricFamily:
        by_model: dict[str, int] = {}
        for model, _, _, n in rows:
            by_model[model] = by_model.get(model, 0) + n
        kept = set(sorted(by_model, key=lambda model: (-by_model[model], model))[:MAX_MODELS])
        counts: dict[tuple, int] = {}
        for model, state, error_class, n in rows:
            key = (model if model in kept else OTHER, state,
                   error_class if not error_class or error_class in error_classes else OTHER)
            counts[key] = counts.get(key, 0) + n
        family = GaugeMetricFamily("payonce_attempts", "Attempts by provider/model, state and error class.",
                                   labels=["model", "state", "error_class"])
        for key in sorted(counts):
            family.add_metric(list(key), counts[key])
        return family

    @staticmethod
    def _events():
        """The Redis counters, every known value present (0 until it happens, so rate() sees the first
        one). Not exported at all when they are not kept or Redis did not answer: absent, not zero."""
        stored = _counters()
        if stored is None:
            return
        for name, (label, values, help_text) in COUNTERS.items():
            family = CounterMetricFamily(f"payonce_{name}", help_text, labels=[label])
            for value in (*values, OTHER):
                family.add_metric([value], stored.get(f"{name}|{value}", 0))
            yield family


REGISTRY = CollectorRegistry()  # our own: no process metrics of whichever web process answered
REGISTRY.register(PayonceCollector())


# --- the view ------------------------------------------------------------------------------------------


def _is_loopback(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def _refusal(request) -> JsonResponse | None:
    """METRICS_TOKEN set: the request must carry it as a bearer token. Unset: only loopback may scrape
    (REMOTE_ADDR; uvicorn sets it from X-Forwarded-For only for a proxy on 127.0.0.1, so a request a local
    proxy forwarded from outside is not loopback)."""
    token = settings.METRICS_TOKEN
    if token:
        scheme, _, offered = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(offered.strip().encode(), token.encode()):
            return None
        response = JsonResponse(error_body("METRICS_UNAUTHORIZED", "GET /metrics needs Authorization: Bearer "
                                                                   "<METRICS_TOKEN>."), status=401)
        response["WWW-Authenticate"] = 'Bearer realm="payonce-metrics"'
        return response
    if _is_loopback(request.META.get("REMOTE_ADDR", "")):
        return None
    return JsonResponse(error_body("METRICS_FORBIDDEN", "Without METRICS_TOKEN, /metrics answers loopback only."),
                        status=403)


@csrf_exempt  # no cookie is ever read here (token or loopback): a POST is the JSON 405 below, not the CSRF page
def metrics_view(request):
    if request.method not in ("GET", "HEAD"):
        return method_not_allowed("GET, HEAD", "GET /metrics.")
    refused = _refusal(request)
    if refused is not None:
        return refused
    try:
        body = generate_latest(REGISTRY)
    except (OperationalError, InterfaceError) as exc:
        # Prometheus records a failed scrape (up == 0): better than figures that are not the database's.
        logger.warning("metrics: database unavailable: %s", exc)
        return JsonResponse(error_body("DATABASE_UNAVAILABLE", "The database is unavailable; try again shortly."),
                            status=503)
    return HttpResponse(body, content_type=CONTENT_TYPE_PLAIN_0_0_4)
