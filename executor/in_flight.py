"""Calls in flight per provider and per model (docs/api.md, "Limits"): at most N at once, shared by every client
and every worker machine, so payonce stays inside a provider's documented concurrency instead of collecting
its 429s.

A call is in flight from its intent (`submitting`) to its end (`running` in between): what the provider is
working on for payonce. The limit is read where the intent is written (executor.record.intend), and a call
past it is held back before anything is written: no intent, no key, no reservation, nothing sent. The
step backs off (StepRetry) and asks again.

The race this closes: two executions counting N-1 in flight at once and both sending. The count and the
intent are one transaction that first takes a transaction-scoped advisory lock per limit (in a fixed order,
so two limits never deadlock); the count is a statement after the lock, so its snapshot sees every intent
committed by the holders before it. The count reads a partial index of the attempts in flight
(attempt_in_flight), at most N rows of it.
"""

import contextlib

from django.conf import settings
from django.db import connection, transaction

from executor.models import AttemptState
from executor.providers import spec_of

IN_FLIGHT = (AttemptState.SUBMITTING.value, AttemptState.RUNNING.value)


def limits_for(provider: str, model: str) -> list[tuple[str, int]]:
    """[(name, limit)]: the provider's (PROVIDER_MAX_IN_FLIGHT, else its spec's) and the model's, if any."""
    found = []
    spec = spec_of(provider)
    provider_limit = settings.PROVIDER_MAX_IN_FLIGHT.get(provider, spec.max_in_flight if spec else None)
    if provider_limit:
        found.append((provider, provider_limit))
    model_limit = settings.PROVIDER_MAX_IN_FLIGHT.get(f"{provider}/{model}")
    if model_limit:
        found.append((f"{provider}/{model}", model_limit))
    return sorted(found)


def _count_sql(name: str) -> tuple[str, list]:
    provider, _, model = name.partition("/")
    where, params = "provider = %s", [provider]
    if model:
        where, params = where + " AND model = %s", params + [model]
    return (f"SELECT count(*) FROM (SELECT 1 FROM executor_attempt WHERE {where}"
            f" AND state IN ('{IN_FLIGHT[0]}', '{IN_FLIGHT[1]}') LIMIT %s) in_flight"), params


def full_limit(provider: str, model: str) -> tuple[str, int] | None:
    """(name, limit) of a limit of this provider or model that has its calls in flight now, or None: why a
    call would be held back (GET /v1/jobs/{id}'s `waiting`). A read, without the lock: a figure of now."""
    with connection.cursor() as cursor:
        for name, limit in limits_for(provider, model):
            sql, params = _count_sql(name)
            cursor.execute(sql, [*params, limit])
            if cursor.fetchone()[0] >= limit:
                return name, limit
    return None


class Full(Exception):
    """A limit has its calls in flight: nothing may be sent past it now."""

    def __init__(self, name: str, limit: int):
        super().__init__(f"{name} has {limit} calls in flight, its limit")
        self.name, self.limit = name, limit


@contextlib.contextmanager
def slot(limits: list[tuple[str, int]]):
    """The intent's transaction under the limits: raises Full (nothing written) when one is reached; else
    the body (the intent) runs and commits with the locks held. No limits: nothing added."""
    if not limits:
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT " + ", ".join(["pg_advisory_xact_lock(hashtextextended(%s, 0))"] * len(limits)),
                           [f"payonce.in_flight:{name}" for name, _ in limits])
            for name, limit in limits:
                sql, params = _count_sql(name)
                cursor.execute(sql, [*params, limit])
                if cursor.fetchone()[0] >= limit:
                    raise Full(name, limit)
        yield
