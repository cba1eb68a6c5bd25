"""The books: the sandbox's ledger is the ground truth of what was paid, and every charge must map to
one attempt row with its upstream key (and no attempt may claim a charge the ledger lacks)."""

from collections import Counter

from executor.models import Attempt


def assert_books_balance(ledger, job_ids) -> list[dict]:
    job_ids = {str(job_id) for job_id in job_ids}
    charges = [c for c in ledger.ledger()["charges"] if c["metadata"].get("payonce_job") in job_ids]
    attempts = {a.upstream_key: a for a in Attempt.objects.filter(job_id__in=job_ids)}
    for charge in charges:
        attempt = attempts.get(charge["request_id"])
        assert attempt is not None, f"a charge with no attempt row: {charge}"
        assert (attempt.provider, attempt.model) == ("sandbox", charge["model"]), (attempt, charge)
        assert charge["metadata"]["upstream_key"] == attempt.upstream_key
        assert charge["metadata"]["payonce_attempt"] == attempt.number
    charged = Counter(c["request_id"] for c in charges)
    for key, attempt in attempts.items():
        if attempt.accepted_at is not None or attempt.cost_usd is not None:
            assert charged[key] >= 1, f"attempt {key} ({attempt.state}) claims a charge the ledger lacks"
        if attempt.cost_usd is not None:
            paid = sum(float(c["amount_usd"]) for c in charges if c["request_id"] == key)
            assert abs(paid - float(attempt.cost_usd)) < 1e-6, (key, paid, attempt.cost_usd)
    return charges
