"""executor.policy as a table: every row of DESIGN.md's attempt-runner table, the back-off, the windows."""

import pytest

from executor import policy
from executor.policy import Next, Over

CHAIN = ["sandbox/video-keyed", "sandbox/image-lookup"]
ALL_FALLBACKS = {"attempts_per_model": 3, "fallback_on": ["exhausted", "unavailable", "refused", "window_expired"]}
NO_FALLBACK = {"attempts_per_model": 3, "fallback_on": []}
PRIMARY, SECONDARY = CHAIN

# (error class, tries on the model so far, policy, model) -> what follows
TABLE = [
    # stop the chain at once, whatever the tries and the policy
    ("auth", 1, ALL_FALLBACKS, PRIMARY, Over("PROVIDER_AUTH")),
    ("invalid_input", 1, ALL_FALLBACKS, PRIMARY, Over("INVALID_INPUT")),
    ("cancelled", 1, ALL_FALLBACKS, PRIMARY, Over("CANCELLED")),
    ("budget_exceeded", 1, ALL_FALLBACKS, PRIMARY, Over("BUDGET_EXCEEDED")),
    ("pre_submit_refused", 1, ALL_FALLBACKS, PRIMARY, Over("PRE_SUBMIT_REFUSED")),
    ("upload_failed", 1, ALL_FALLBACKS, PRIMARY, Over("UPLOAD_FAILED")),
    # transient: the same model while it has tries, then the next model if "exhausted" allows it
    *[(cls, 2, NO_FALLBACK, PRIMARY, Next(PRIMARY, 1.5)) for cls in ("rate_limited", "timeout", "server_error", "network")],
    *[(cls, 3, ALL_FALLBACKS, PRIMARY, Next(SECONDARY)) for cls in ("rate_limited", "timeout", "server_error", "network")],
    *[(cls, 3, NO_FALLBACK, PRIMARY, Over("ATTEMPTS_EXHAUSTED")) for cls in ("rate_limited", "timeout", "server_error", "network")],
    ("server_error", 3, ALL_FALLBACKS, SECONDARY, Over("ATTEMPTS_EXHAUSTED")),  # the last model of the chain
    (None, 1, NO_FALLBACK, PRIMARY, Next(PRIMARY, 1.5)),  # no class recorded: a server error
    # content refusal: the model's remaining tries, then "refused" decides
    ("refused", 1, NO_FALLBACK, PRIMARY, Next(PRIMARY, 1.5)),
    ("refused", 3, ALL_FALLBACKS, PRIMARY, Next(SECONDARY)),
    ("refused", 3, NO_FALLBACK, PRIMARY, Over("PROVIDER_REFUSED")),
    # unavailable and window_expired: never the same model again
    ("unavailable", 1, ALL_FALLBACKS, PRIMARY, Next(SECONDARY)),
    ("unavailable", 1, NO_FALLBACK, PRIMARY, Over("PROVIDER_UNAVAILABLE")),
    ("window_expired", 1, ALL_FALLBACKS, PRIMARY, Next(SECONDARY)),
    ("window_expired", 1, NO_FALLBACK, PRIMARY, Over("WINDOW_EXPIRED")),
    ("window_expired", 1, {"fallback_on": ["exhausted"]}, PRIMARY, Over("WINDOW_EXPIRED")),
    # attempts_per_model from the policy
    ("server_error", 4, {"attempts_per_model": 5, "fallback_on": []}, PRIMARY, Next(PRIMARY, 1.5)),
    ("server_error", 1, {"attempts_per_model": 1, "fallback_on": []}, PRIMARY, Over("ATTEMPTS_EXHAUSTED")),
]


@pytest.mark.parametrize("error_class,tries,job_policy,model,expected", TABLE,
                         ids=[f"{row[0]}-{row[1]}-{row[3].split('/')[1]}-{type(row[4]).__name__}" for row in TABLE])
def test_what_follows_an_attempt(error_class, tries, job_policy, model, expected):
    decided = policy.after_attempt(chain=CHAIN, policy=job_policy, model=model, error_class=error_class,
                                   tries_on_model=tries, retry_in_s=1.5)
    assert decided == expected


def test_a_negative_retry_wait_is_no_wait():
    assert policy.after_attempt(chain=CHAIN, policy=NO_FALLBACK, model=PRIMARY, error_class="server_error",
                                tries_on_model=1, retry_in_s=-3) == Next(PRIMARY, 0.0)


@pytest.mark.parametrize("tries,low,high", [(1, 0.8, 1.2), (2, 1.6, 2.4), (4, 6.4, 9.6), (7, 48, 72), (30, 48, 72)])
def test_retry_backoff_grows_with_jitter_up_to_its_cap(tries, low, high):
    waits = [policy.retry_backoff_s(tries, None) for _ in range(200)]
    assert low <= min(waits) and max(waits) <= high and len(set(waits)) > 1


def test_a_retry_after_wins_within_bounds():
    assert policy.retry_backoff_s(1, 7.0) == 7.0
    assert policy.retry_backoff_s(1, 10_000) == policy.RETRY_AFTER_MAX_S


@pytest.mark.parametrize("policy_window,provider_window,expected", [
    (None, None, 3600.0), (30.0, None, 30.0), (None, 45.0, 45.0), (30.0, 45.0, 30.0), (90.0, 45.0, 45.0),
])
def test_every_attempt_has_a_window_and_the_deadline_is_the_last_one(policy_window, provider_window, expected):
    assert policy.attempt_window_s(policy_window_s=policy_window, provider_window_s=provider_window,
                                   deadline_s=3600.0) == expected


def test_failed_polls_back_off_from_the_poll_interval_and_never_past_the_deadline():
    waits = [policy.poll_retry_s(n, poll_interval_s=2.0, left_s=1000) for n in range(1, 9)]
    assert 1.6 <= waits[0] <= 2.4 and waits[-1] <= policy.POLL_BACKOFF_MAX_S * 1.2
    assert all(later >= earlier * 0.6 for earlier, later in zip(waits, waits[1:]))  # grows, jitter aside
    assert policy.poll_retry_s(8, poll_interval_s=2.0, left_s=3.0) == 3.0  # the deadline pass comes on time
