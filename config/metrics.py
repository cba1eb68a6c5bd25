"""The figures /metrics (operators.metrics) reads at scrape time that no table holds. Counters and
histograms are kept in Redis (METRICS_REDIS_URL, one hash each), so any process counts and every `web`
process answers a scrape with the same figures, whichever process did the work:

- `count()`: event counters, for events that leave no row (sweeper recoveries, provider callbacks, polls);
- `observe()`: histograms of how long things take (a request, a job, a provider call), in fixed buckets;
- `broker_queue_depths()`: the messages waiting in the broker's queues, asked of the broker at scrape.

Label values are bounded: each label has its list of values, and anything else is "other". Never a job
id, an upstream key or anything a request can grow without bound.
"""

import bisect
import json
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass

import redis
from django.conf import settings
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from kombu.transport import redis as kombu_redis
from redis.backoff import NoBackoff
from redis.retry import Retry

logger = logging.getLogger(__name__)

# --- event counters (Redis) --------------------------------------------------------------------------

# name -> (label, its values, help). A value outside its list is counted as "other": the set of series
# stays bounded whatever a caller passes.
OTHER = "other"
COUNTERS = {
    "sweeper_recoveries": ("what", ("stuck_job", "cancelled_attempt"),
                           "Things the sweeper woke: a stuck job resumed, a cancelled job's attempt still out ended."),
    "callbacks": ("outcome", ("rung", "duplicate", "ended", "early", "unknown_generation", "bad_signature",
                              "not_configured", "invalid", "keys_unavailable"),
                  "Provider callbacks received, by what payonce answered (executor.callbacks)."),
    "key_page_fetches": ("outcome", ("ok", "failed"),
                         "Fetches of a provider's webhook key page (fal's JWKS), by outcome: at most one per 30 s "
                         "per web process, whatever the outcome (executor.providers.fal.webhooks)."),
    "polls": ("outcome", ("running", "succeeded", "failed", "cancelled", "error"),
              "Polls of an accepted attempt, by what the provider said (error: the poll itself failed)."),
    "models_file": ("outcome", ("loaded", "rejected"),
                    "A models file changed at run time: loaded (valid, now in force), or rejected (wrong or unreadable: "
                    "the last good one stays in force, and the log line names every problem)."),
    "price_drifts": ("seen", ("first", "again"),
                     "Attempts that settled above their reservation (a price drift: the rate card says less than the "
                     "provider charges): the first of a model's drift, or again while it holds (billing.services)."),
    "sweep_errors": ("sweep", ("stuck_jobs", "cancelled_attempts", "fold", "deliveries"),
                     "Rows a periodic sweep could not act on: each is logged and skipped, and the pass goes on."),
    "lease_takeovers": ("kind", ("media", "report"),
                        "Steps taken over from another holder whose lease ran out (its worker died or stalled), "
                        "by job kind: the logs' step.taken_over lines (jobs.engine.steps._log_claim)."),
}
HASH_KEY = "payonce:metrics:counters"
# A counter is never worth a stall: a Redis that does not answer at once is left alone this long.
SOCKET_TIMEOUT_S = 0.25
PAUSE_AFTER_ERROR_S = 5.0

_clients: dict[tuple[str, float], redis.Redis] = {}
_paused_until = 0.0


def _client_for(url: str, timeout_s: float) -> redis.Redis:
    """One connection pool per process, URL and timeout. No retries: a figure lost with a Redis outage is
    cheaper than a provider call, or a scrape, held up by it."""
    client = _clients.get((url, timeout_s))
    if client is None:  # two threads may both make one: the last kept serves from then on
        client = _clients[url, timeout_s] = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0))
    return client


def _redis() -> redis.Redis | None:
    """The counters' and histograms' Redis (METRICS_REDIS_URL); None when they are not kept, or for a few
    seconds after an error."""
    url = settings.METRICS_REDIS_URL
    if not url or time.monotonic() < _paused_until:
        return None
    return _client_for(url, SOCKET_TIMEOUT_S)


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


def counters() -> dict[str, int] | None:
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


# --- histograms (Redis) --------------------------------------------------------------------------------


class Declared:
    """Label values an app above config names from its own table (the job kinds, the providers): config
    may not import that app (the one-way stack), so its AppConfig.ready() hands them down, once, at start
    (`declare`), the way config.logs learns the providers' secrets. Before that, every value is "other"."""

    def __init__(self, source: str):
        self.source = source  # where the values come from, for a reader of HISTOGRAMS
        self.values: frozenset[str] = frozenset()

    def declare(self, values) -> None:
        self.values = frozenset(str(value) for value in values)

    def __contains__(self, value) -> bool:
        return value in self.values


UNMATCHED = "unmatched"


def _walk(patterns, prefix: str = ""):
    """The routes under `patterns`, each joined as Django's resolver joins ResolverMatch.route (an
    include's route, then its pattern's without a leading ^)."""
    for pattern in patterns:
        route = prefix + str(pattern.pattern).removeprefix("^") if prefix else str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _walk(pattern.url_patterns, route)
        elif isinstance(pattern, URLPattern):
            yield route


class _Routes:
    """The URLconf's routes (`v1/jobs/<uuid:job_id>`: patterns, never paths, so a bounded set) and
    UNMATCHED, walked at first use: the URLconf names every app, and is loaded only once they are."""

    _found: frozenset[str] | None = None

    def __contains__(self, value) -> bool:
        if self._found is None:
            self._found = frozenset(_walk(get_resolver().url_patterns)) | {UNMATCHED}
        return value in self._found


ROUTES = _Routes()


def route_of(path: str) -> str:
    """The route a request's path resolves to, as Django names it (`v1/jobs/<uuid:job_id>`), or UNMATCHED
    (no route: a 404, a static file)."""
    try:
        return resolve(path).route
    except Exception:  # Resolver404, or a path no converter takes: no route either way
        return UNMATCHED


STATUS_CLASSES = ("2xx", "3xx", "4xx", "5xx")
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
JOB_KINDS = Declared("jobs.kinds.KINDS (jobs.apps)")
JOB_END_STATUSES = Declared("jobs.models.TERMINAL_STATUSES (jobs.apps)")
PROVIDERS = Declared("executor.providers.PROVIDERS (executor.apps)")
PAID = ("yes", "no", "unknown")


@dataclass(frozen=True)
class Histogram:
    help: str
    labels: tuple[tuple[str, object], ...]  # (label, its values: anything `in` answers)
    buckets: tuple[float, ...]  # upper bounds, ascending; +Inf follows the last


# name -> its histogram, exported as payonce_<name> (with _bucket, _sum and _count). Buckets are chosen
# around what each one's alerts ask (docs/operating.md, "Metrics and alerts").
HISTOGRAMS = {
    "api_request_seconds": Histogram(
        "Requests the web process answered, by route (the URL pattern, `unmatched` for none), method and status "
        "class: the time until the answer's status and headers went out (an event stream's life is not counted). "
        "The probes are not counted (config.requestmetrics).",
        (("route", ROUTES), ("method", METHODS), ("status", STATUS_CLASSES)),
        (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)),
    "job_first_paid_call_seconds": Histogram(
        "From a job's creation to its first paid call going out, by job kind: how long a client's job waits for "
        "the work it pays for to start.",
        (("kind", JOB_KINDS),),
        (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)),
    "job_end_seconds": Histogram(
        "From a job's creation to its terminal status, by job kind and status (a job retried by a person counts "
        "its whole life, the wait for the person included).",
        (("kind", JOB_KINDS), ("status", JOB_END_STATUSES)),
        (1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0)),
    "provider_call_seconds": Histogram(
        "Calls sent to a provider, by provider and whether it was paid (yes, no, unknown: its outcome is not "
        "known).",
        (("provider", PROVIDERS), ("paid", PAID)),
        (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)),
    "llm_time_to_first_token_seconds": Histogram(
        "An LLM call's time to its first token, by provider.",
        (("provider", PROVIDERS),),
        (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)),
}
HISTOGRAMS_KEY = "payonce:metrics:histograms"
# A series' fields in the hash: a JSON list [name, label values..., what], `what` being a bucket's upper
# bound ("0.05", "inf") holding the observations in that bucket alone (not cumulative: one field changes per
# observation), or SUM, the sum of the observations in whole microseconds (an integer: exact, and HINCRBY
# like the buckets). JSON, because a route may hold any character ("|" in an admin route's regex).
SUM = "sum_us"


def _series(histogram: Histogram, labels: dict) -> list[str]:
    """The label values an observation is kept under, in the histogram's order, each bounded."""
    series = []
    for label, values in histogram.labels:
        value = labels.get(label)
        series.append(str(value) if isinstance(value, str) and value in values else OTHER)
    return series


def observe(name: str, seconds: float, **labels) -> None:
    """One observation of `seconds` in the histogram `name` (HISTOGRAMS, exported as payonce_<name>), under
    its labels: a value outside a label's values, or a label not given, is "other". Call it where the
    duration ends, in seconds (a float: a time.monotonic() difference, or a timedelta's total_seconds()):

        observe("provider_call_seconds", time.monotonic() - sent, provider="fal", paid="yes")
        observe("job_first_paid_call_seconds", (timezone.now() - job.created_at).total_seconds(), kind=job.kind)

    Never raises, and never waits long: it runs on the paths that spend money, and a metric must not be why
    one fails. One round trip to Redis (the bucket's count and the sum, two HINCRBY in one pipeline) with
    the counters' short timeouts; a Redis that does not answer is left alone for PAUSE_AFTER_ERROR_S.
    A negative duration (a clock stepped back) counts as 0; NaN and infinity are dropped."""
    observe_many([(name, seconds, labels)])


def observe_many(observations) -> None:
    """Observations `(name, seconds, labels)`, as `observe` keeps each, in one round trip: for a process
    that times many things and writes them in batches (the web process's requests, config.requestmetrics).
    Never raises."""
    increments: dict[str, int] = {}
    for observation in observations:
        try:
            name, seconds, labels = observation
            seconds = float(seconds)
            if not math.isfinite(seconds):
                continue
            seconds = max(seconds, 0.0)
            histogram = HISTOGRAMS[name]
            series = _series(histogram, labels)
            index = bisect.bisect_left(histogram.buckets, seconds)  # the first bucket whose bound is >= seconds
            bound = repr(histogram.buckets[index]) if index < len(histogram.buckets) else "inf"
        except Exception:  # a caller's mistake (no such histogram, a duration that is no number): logged, not raised
            logger.exception("metrics: observation %r not kept", observation)
            continue
        bucket, total = json.dumps([name, *series, bound]), json.dumps([name, *series, SUM])
        increments[bucket] = increments.get(bucket, 0) + 1
        increments[total] = increments.get(total, 0) + round(seconds * 1_000_000)
    if not increments:
        return
    try:
        client = _redis()
        if client is not None:
            pipe = client.pipeline(transaction=False)
            for field, increment in increments.items():
                pipe.hincrby(HISTOGRAMS_KEY, field, increment)
            pipe.execute()
    except Exception as exc:  # a metric never stops paid work
        _pause(exc)


# observe_soon's observations wait this long to share one round trip: a worker pays one a second or so for
# all of its threads' calls and ends, not one per call.
GATHER_S = 0.5


class Gathered:
    """Observations noted now and written together, GATHER_S later, by a thread of the process's own
    (started with the first one). At most MAX_PENDING wait: past it the oldest are dropped, so a Redis far
    behind costs figures, never memory. What has not been written when the process dies is lost."""

    MAX_PENDING = 10_000

    def __init__(self, prepare=None):
        self._pending: deque = deque(maxlen=self.MAX_PENDING)
        self._wake = threading.Event()
        self._prepare = prepare  # turns what was noted into (name, seconds, labels), on the thread
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def note(self, item) -> None:
        """A deque's append and an event's set: nothing that waits."""
        self._pending.append(item)
        if self._thread is None:
            self.start()
        self._wake.set()

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="metrics-writer", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            time.sleep(GATHER_S)  # what else comes meanwhile shares the round trip
            self._wake.clear()  # noted from here on sets it again: none is left behind
            batch = []
            while self._pending:
                batch.append(self._pending.popleft())
            try:
                observe_many([self._prepare(item) for item in batch] if self._prepare else batch)
            except Exception:  # observe_many never raises; this thread must outlive anything that would
                logger.exception("metrics: a batch of %d observations not written", len(batch))


_soon = Gathered()


def observe_soon(name: str, seconds: float, **labels) -> None:
    """observe(), written GATHER_S later with whatever else this process observes meanwhile (Gathered):
    for the paths that spend money, which then never wait on Redis for a figure."""
    _soon.note((name, seconds, labels))


@dataclass(frozen=True)
class Series:
    counts: tuple[int, ...]  # observations per bucket, not cumulative, in the histogram's order, +Inf's last
    sum: float  # seconds


def histograms() -> dict[str, dict[tuple[str, ...], Series]] | None:
    """Every histogram's series that has had an observation: name -> {label values: Series}; None when they
    are not kept or Redis did not answer. A bucket a release no longer has is counted in the next one up."""
    client = _redis()
    if client is None:
        return None
    try:
        stored = client.hgetall(HISTOGRAMS_KEY)
    except Exception as exc:  # a scrape without the histograms beats no scrape
        _pause(exc)
        return None
    found: dict[str, dict[tuple[str, ...], tuple[list[int], list[int]]]] = {}
    for field, value in stored.items():
        try:
            name, *values, what = json.loads(field)
            histogram = HISTOGRAMS[name]
            if len(values) != len(histogram.labels):
                continue  # a release whose labels differ: not this one's series
            counts, total = found.setdefault(name, {}).setdefault(
                tuple(values), ([0] * (len(histogram.buckets) + 1), [0]))
            if what == SUM:
                total[0] += int(value)
            else:
                counts[bisect.bisect_left(histogram.buckets, float(what))] += int(value)
        except (ValueError, TypeError, KeyError):  # a field of no histogram this release has
            continue
    return {name: {values: Series(tuple(counts), total[0] / 1_000_000) for values, (counts, total) in series.items()}
            for name, series in found.items()}


# --- the broker's queues -------------------------------------------------------------------------------

# A scrape asks the broker at most this long: a broker that does not answer leaves the gauge out.
BROKER_TIMEOUT_S = 0.5


def broker_queue_depths(queues) -> dict[str, int] | None:
    """The messages waiting in each of `queues` (those taken by a worker and not yet acknowledged are not
    counted), read from the broker now: a queue on Redis is one list per priority step (kombu's layout),
    and its depth their lengths' sum, in one round trip. None with a broker that is not Redis (RabbitMQ's
    own management shows its queues), or one that did not answer within BROKER_TIMEOUT_S."""
    url = settings.CELERY_BROKER_URL
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return None
    options = settings.CELERY_BROKER_TRANSPORT_OPTIONS
    prefix = options.get("global_keyprefix", "")
    sep = options.get("sep", kombu_redis.Channel.sep)
    steps = options.get("priority_steps", kombu_redis.PRIORITY_STEPS)
    keys = {queue: [f"{prefix}{queue}{sep}{step}" if step else f"{prefix}{queue}" for step in steps]
            for queue in queues}
    try:
        pipe = _client_for(url, BROKER_TIMEOUT_S).pipeline(transaction=False)
        for queue_keys in keys.values():
            for key in queue_keys:
                pipe.llen(key)
        lengths = iter(pipe.execute())
    except Exception as exc:  # a scrape without the queues beats no scrape
        logger.warning("metrics: the broker's queue depths not read: %s", exc)
        return None
    return {queue: sum(next(lengths) for _ in queue_keys) for queue, queue_keys in keys.items()}
