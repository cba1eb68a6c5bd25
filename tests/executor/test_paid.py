"""One definition of "paid" (executor.models.PAID_WHEN), read three ways: Attempt.paid in Python, PAID_SQL
in the raw statements that show attempts, and the ORM's Q (the render runner's count of paid failures).
The three agree on every combination of what decides it: accepted or not, a cost or not, every state,
sent or not."""

import itertools
import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from accounts.models import Client
from config import conditions
from executor.models import PAID_UNKNOWN, PAID_YES, Attempt, AttemptState, Paid
from executor.selectors import PAID_SQL
from jobs.models import Job

pytestmark = pytest.mark.django_db

COMBINATIONS = list(itertools.product((False, True), (False, True), AttemptState.values, (0, 2)))


def test_the_sql_is_the_rule_written_out():
    assert PAID_SQL == (
        "CASE WHEN a.accepted_at IS NOT NULL OR a.cost_usd IS NOT NULL THEN 'yes'"
        " WHEN a.state = 'uncertain' OR (a.sends > 0 AND a.state = 'submitting') THEN 'unknown' ELSE 'no' END")


def test_python_sql_and_orm_agree_on_every_combination():
    client = Client.objects.create(name="paid")
    job = Job.objects.create(
        id=uuid.uuid4(), client=client, idempotency_key="paid", request_hash="0" * 64, kind="media",
        model_chain=["sandbox/video-keyed"], input={}, policy={}, output_key="outputs/paid.bin", metadata={},
        lease_until=timezone.now() + timedelta(minutes=10))
    now = timezone.now()
    for number, (accepted, costed, state, sends) in enumerate(COMBINATIONS, start=1):
        # A step of its own each: at most one attempt of a step is out at a time (attempt_one_out_per_run).
        Attempt.objects.create(job=job, run=1, step=f"s{number}", number=number, provider="sandbox",
                               model="video-keyed", upstream_key=f"k-{number}", state=state, sends=sends,
                               accepted_at=now if accepted else None, cost_usd=Decimal("0.4") if costed else None)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT a.number, {PAID_SQL} FROM executor_attempt a WHERE a.job_id = %s", [job.id])
        in_sql = dict(cursor.fetchall())
    attempts = Attempt.objects.filter(job=job)
    yes = set(attempts.filter(PAID_YES).values_list("number", flat=True))
    unknown = set(attempts.filter(PAID_UNKNOWN).exclude(PAID_YES).values_list("number", flat=True))
    in_orm = {number: Paid.YES if number in yes else Paid.UNKNOWN if number in unknown else Paid.NO
              for number in attempts.values_list("number", flat=True)}
    in_python = {attempt.number: attempt.paid for attempt in attempts}

    assert len(in_python) == len(COMBINATIONS) == 40
    assert in_python == in_sql == in_orm
    # And the rule itself, row by row, as the API documents it.
    for number, (accepted, costed, state, sends) in enumerate(COMBINATIONS, start=1):
        expected = (Paid.YES if accepted or costed else
                    Paid.UNKNOWN if state == AttemptState.UNCERTAIN or (state == AttemptState.SUBMITTING and sends)
                    else Paid.NO)
        assert in_python[number] == expected, (accepted, costed, state, sends)


def test_a_rule_the_three_readings_could_not_agree_on_is_refused():
    with pytest.raises(ValueError):
        conditions.sql(~Q(accepted_at__isnull=True), Attempt, "a")
    with pytest.raises(ValueError):
        conditions.holds(Q(model__startswith="video"), Attempt(model="video-keyed"))
