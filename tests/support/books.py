"""The books: the sandbox's ledger is the ground truth of what was paid.

Over the *whole* ledger of the test's sandbox (the `ledger` fixture resets it for every test, and every
test starts with an empty database), in Decimal, never float:

1. every charge maps to exactly one attempt row, by the upstream key it arrived with (`request_id` where
   the model takes one, and always `metadata.upstream_key`), with the same model, job and number;
2. every attempt that claims a charge (the provider accepted it, or it records a cost) has exactly one;
3. every attempt's recorded cost equals its charge, to the cent and beyond (6 places).

An attempt whose outcome nobody knows (`uncertain`, or `submitting` after a lost answer) claims nothing:
it may have one charge (then rule 1 still ties that charge to it) or none, never more than one.
"""

from collections import defaultdict
from decimal import Decimal

from executor.models import Attempt, AttemptState

UNKNOWN_OUTCOME = (AttemptState.UNCERTAIN, AttemptState.SUBMITTING)


def assert_books_balance(ledger) -> list[dict]:
    """Check the three rules; returns the ledger's charges."""
    book = ledger.ledger()
    charges = book["charges"]
    attempts = {a.upstream_key: a for a in Attempt.objects.all()}
    by_key: dict[str, list[dict]] = defaultdict(list)
    for charge in charges:
        metadata = charge.get("metadata") or {}
        key = metadata.get("upstream_key")
        attempt = attempts.get(key)
        assert attempt is not None, (f"a charge with no attempt row: {charge}; the attempts: {sorted(attempts)}; "
                                     f"the sandbox's calls since its reset: {ledger.calls()}")
        if charge.get("request_id") is not None:
            assert charge["request_id"] == key, ("request_id and upstream_key disagree", charge)
        assert (attempt.provider, attempt.model) == ("sandbox", charge["model"]), (attempt, charge)
        assert metadata.get("payonce_job") == str(attempt.job_id), (attempt, charge)
        assert metadata.get("payonce_attempt") == attempt.number, (attempt, charge)
        by_key[key].append(charge)

    for key, attempt in attempts.items():
        paid = by_key.get(key, [])
        assert len(paid) <= 1, f"attempt {key} ({attempt.state}) was charged {len(paid)} times: {paid}"
        claims = attempt.accepted_at is not None or attempt.cost_usd is not None
        if claims:
            assert len(paid) == 1, f"attempt {key} ({attempt.state}) claims a charge the ledger lacks"
        elif paid:
            assert attempt.state in UNKNOWN_OUTCOME, (
                f"attempt {key} ({attempt.state}) was charged but its record does not say so: {paid}")
        if attempt.cost_usd is not None:
            assert Decimal(paid[0]["amount_usd"]) == attempt.cost_usd, (key, paid[0]["amount_usd"], attempt.cost_usd)

    total = sum((Decimal(c["amount_usd"]) for c in charges), Decimal(0))
    assert total == Decimal(book["total_usd"]), (total, book["total_usd"])
    return charges


def charges_for(ledger, job_id: str) -> list[dict]:
    return [c for c in ledger.ledger()["charges"] if c["metadata"].get("payonce_job") == job_id]
