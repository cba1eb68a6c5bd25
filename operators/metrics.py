"""`/metrics` in the Prometheus text format (docs/operating.md, "Metrics and alerts").

Every figure is read at scrape time from where it is true, never from one process's memory: PostgreSQL
for what the rows say (jobs, attempts, spend, deliveries, lease takeovers), the event counters and the
histograms (config.metrics) for events that leave no row and for how long things took, and the broker for
the messages its queues hold. Label values are bounded enums, a model name or a client:
never a job id, an upstream key or anything a request can grow without bound. The collector reads every
app's figures, so it lives with the operators, on top of the stack.
"""

import hmac
import ipaddress
import logging
from decimal import Decimal

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from django.http import HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from billing.months import month_of
from billing.selectors import clients_month_spend
from config.celery import app as celery_app
from config.metrics import COUNTERS, HISTOGRAMS, OTHER, broker_queue_depths, counters, histograms
from executor.providers.base import ErrorClass
from jobs.api.errors import error_body, method_not_allowed
from jobs.kinds import KINDS
from jobs.models import JobStatus
from webhooks.models import DeliveryStatus

logger = logging.getLogger(__name__)

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
# A step's `attempts` counts the claims of its lease (jobs.engine.steps.step_claim): every claim beyond the first
# took it over from a holder whose lease ran out (a dead or stalled worker), or took it back under the
# same task or chain (after a back-off, between two polls of a wait). The row keeps no more than that.
_TAKEOVERS_SQL = "SELECT coalesce(sum(attempts - 1), 0) FROM jobs_step WHERE attempts > 1"
# Every wait ends: how long the oldest job has been running (a provider that never answers shows here
# first), and how long the oldest attempt whose outcome nobody knows has waited for a person (an
# uncertain attempt of a job held `waiting` in that run). 0 when there is none.
_OLDEST_SQL = """
SELECT coalesce(extract(epoch FROM now() - (SELECT min(coalesce(started_at, created_at)) FROM jobs_job
                                              WHERE status = 'running')), 0),
       coalesce(extract(epoch FROM now() - (SELECT min(a.finished_at) FROM executor_attempt a
                                              JOIN jobs_job j ON j.id = a.job_id AND j.run = a.run
                                             WHERE a.state = 'uncertain' AND j.status = 'waiting')), 0)
"""


# Fair dispatch (jobs.dispatch): per client with any, its queued jobs and its jobs in progress (holding a
# slot of its running limit), from the partial indexes job_queued and job_holding_slot; and how long the
# oldest queued job has waited to start. A backlog that only grows, or one client's queue that does not
# move while others' do, shows here.
_QUEUES_SQL = f"""
SELECT c.id, c.name, q.queued, q.in_progress FROM (
    SELECT client_id, count(*) FILTER (WHERE status = '{JobStatus.QUEUED}') AS queued,
           count(*) FILTER (WHERE holds_slot) AS in_progress
      FROM jobs_job WHERE status = '{JobStatus.QUEUED}' OR holds_slot GROUP BY client_id
) q JOIN jobs_client c ON c.id = q.client_id
"""
_OLDEST_QUEUED_SQL = f"""
SELECT coalesce(extract(epoch FROM now() - (SELECT min(created_at) FROM jobs_job WHERE status = '{JobStatus.QUEUED}')), 0)
"""


# The price drifts that hold (billing.models.PriceDrift): a row per model of the catalog, so few; the
# rarest beyond MAX_MODELS are left out rather than labelled.
_DRIFTS_SQL = f"""
SELECT model, reserved_usd, highest_cost_usd FROM billing_pricedrift
 WHERE cleared_at IS NULL AND last_seen_at > now() - %s * interval '1 second'
 ORDER BY last_seen_at DESC LIMIT {MAX_MODELS}
"""


# The broker's queues a scrape reports the depth of: Celery's own (config.celery: jobs and webhooks).
QUEUES = tuple(queue.name for queue in celery_app.conf.task_queues)


def _money(value: Decimal) -> float:
    """Billing's Decimal to the float Prometheus carries: only here, at the exposition."""
    return float(value)


class PayonceCollector(Collector):
    """Reads every figure at each scrape, in one read-only snapshot, so the figures agree with each other
    (a job counted succeeded has its attempt counted succeeded too)."""

    def collect(self):
        error_classes = {error_class.value for error_class in ErrorClass}
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
            cursor.execute(_OLDEST_SQL)
            oldest_running, oldest_uncertain = cursor.fetchone()
            cursor.execute(_QUEUES_SQL)
            queues = cursor.fetchall()
            cursor.execute(_OLDEST_QUEUED_SQL)
            oldest_queued = cursor.fetchone()[0]
            cursor.execute(_DRIFTS_SQL, [settings.PRICE_DRIFT_HOLD_S])
            drifts = cursor.fetchall()
            # The clients with a budget row this month (those that reserved anything in it), with
            # billing's own figures (GET /v1/spend's): spent, reserved, the cap, unpriced attempts.
            spend = clients_month_spend(month_of(timezone.now()))

        family = GaugeMetricFamily("payonce_jobs", "Jobs by status and kind.", labels=["status", "kind"])
        for status in JobStatus.values:
            for kind in KINDS:
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
        for month in spend:
            labels = [month["client"].name, str(month["client"].id)]
            gauges["spent"].add_metric(labels, _money(month["spent"]))
            gauges["reserved"].add_metric(labels, _money(month["reserved"]))
            gauges["cap"].add_metric(labels, _money(month["cap"]))
            gauges["unpriced"].add_metric(labels, month["unpriced_attempts"])
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

        yield GaugeMetricFamily("payonce_oldest_running_job_age_seconds",
                                "How long the oldest running job has been running (0: none runs).",
                                value=float(oldest_running))
        yield GaugeMetricFamily("payonce_oldest_uncertain_attempt_age_seconds",
                                "How long the oldest uncertain attempt has waited for a person's decision (its job "
                                "held waiting; 0: none waits).", value=float(oldest_uncertain))

        queued = GaugeMetricFamily("payonce_jobs_queued", "Queued jobs of a client (not started yet: its turn, or its "
                                   "running limit).", labels=["client", "client_id"])
        in_progress = GaugeMetricFamily("payonce_jobs_in_progress", "Jobs of a client in progress, each holding a slot "
                                        "of its running limit (a render waiting on its provider holds none).",
                                        labels=["client", "client_id"])
        for client_id, name, queued_n, in_progress_n in queues:
            queued.add_metric([name, str(client_id)], queued_n)
            in_progress.add_metric([name, str(client_id)], in_progress_n)
        yield queued
        yield in_progress
        yield GaugeMetricFamily("payonce_oldest_queued_job_age_seconds",
                                "How long the oldest queued job has waited to start (0: none waits).",
                                value=float(oldest_queued))

        reserved = GaugeMetricFamily("payonce_price_drift_reserved_usd", "A model whose attempts settle above their "
                                     "reservation (a price drift that holds): what was reserved for the first one.",
                                     labels=["model"])
        highest = GaugeMetricFamily("payonce_price_drift_highest_cost_usd", "A price drift that holds: the highest "
                                    "cost an attempt of the model settled at, the least its reservations take now.",
                                    labels=["model"])
        for model, was_reserved, highest_cost in drifts:
            reserved.add_metric([model], _money(was_reserved))
            highest.add_metric([model], _money(highest_cost))
        yield reserved
        yield highest

        yield from self._events()
        yield from self._histograms()
        yield from self._queue_depths()

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
        stored = counters()
        if stored is None:
            return
        for name, (label, values, help_text) in COUNTERS.items():
            family = CounterMetricFamily(f"payonce_{name}", help_text, labels=[label])
            for value in (*values, OTHER):
                family.add_metric([value], stored.get(f"{name}|{value}", 0))
            yield family

    @staticmethod
    def _histograms():
        """The Redis histograms, cumulative as Prometheus reads them: a series appears with its first
        observation (its labels' values multiply: no zeros are written for every route, method and status).
        Not exported at all when they are not kept or Redis did not answer, as the counters."""
        stored = histograms()
        if stored is None:
            return
        for name, histogram in HISTOGRAMS.items():
            family = HistogramMetricFamily(f"payonce_{name}", histogram.help,
                                           labels=[label for label, _ in histogram.labels])
            bounds = [floatToGoString(bound) for bound in (*histogram.buckets, float("inf"))]
            for values, series in sorted(stored.get(name, {}).items()):
                cumulative, buckets = 0, []
                for bound, count in zip(bounds, series.counts):
                    cumulative += count
                    buckets.append((bound, cumulative))
                family.add_metric(list(values), buckets, series.sum)
            yield family

    @staticmethod
    def _queue_depths():
        """The messages waiting in the broker's queues, asked of a Redis broker now; left out with another
        broker, or one that did not answer within a moment (config.metrics.BROKER_TIMEOUT_S)."""
        depths = broker_queue_depths(QUEUES)
        if depths is None:
            return
        family = GaugeMetricFamily("payonce_broker_queue_depth", "Messages waiting in a broker queue (jobs: paid work; "
                                   "webhooks: deliveries), not yet taken by a worker.", labels=["queue"])
        for queue, depth in depths.items():
            family.add_metric([queue], depth)
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
