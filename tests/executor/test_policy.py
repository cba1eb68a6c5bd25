"""executor.policy as a table: every row of docs/design.md, "The attempt runner", the back-off, the windows."""

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


# --- the three kinds of failure ----------------------------------------------------------------------------

# (accepted, outcome unknown, answered unpaid, key pinned) -> kind; one row per row of failure_kind's table
KINDS = [
    # accepted, then failed: paid, whatever else is true
    (True, False, False, False, policy.Failure.PAID),
    (True, True, True, True, policy.Failure.PAID),
    # an answer to a resend of a key whose earlier send went unanswered: unknown, even a declared "no"
    (False, False, True, True, policy.Failure.UNKNOWN),
    (False, True, True, True, policy.Failure.UNKNOWN),
    # an answer the adapter declares unpaid (a 429, a declared 5xx): unpaid, though a 5xx reads unknown
    (False, True, True, False, policy.Failure.UNPAID),
    (False, False, True, False, policy.Failure.UNPAID),
    # no answer, a lost reply, an undeclared 5xx
    (False, True, False, False, policy.Failure.UNKNOWN),
    # any other answer: a connection that never opened
    (False, False, False, False, policy.Failure.UNPAID),
]


@pytest.mark.parametrize("accepted,unknown,unpaid,pinned,expected", KINDS)
def test_which_kind_of_failure_a_send_is(accepted, unknown, unpaid, pinned, expected):
    assert policy.failure_kind(accepted=accepted, outcome_unknown=unknown, answered_unpaid=unpaid,
                               key_pinned=pinned) is expected


# (paid failures in the run, policy, error class, tries) -> what follows a paid failure
PAID = [
    # with no paid retries (the default), a paid failure the chain would go on from ends the run
    (1, NO_FALLBACK, "server_error", 1, Over("PAID_ATTEMPT_FAILED")),
    (1, ALL_FALLBACKS, "window_expired", 1, Over("PAID_ATTEMPT_FAILED")),
    (1, ALL_FALLBACKS, "refused", 1, Over("PAID_ATTEMPT_FAILED")),
    # where the chain is over anyway, its own code says why
    (1, NO_FALLBACK, "window_expired", 1, Over("WINDOW_EXPIRED")),
    (1, ALL_FALLBACKS, "cancelled", 1, Over("CANCELLED")),
    # paid_retries 1: one more paid attempt, on the same model or the next, then no more
    (1, {**NO_FALLBACK, "paid_retries": 1}, "server_error", 1, Next(PRIMARY, 1.5)),
    (1, {**ALL_FALLBACKS, "paid_retries": 1}, "window_expired", 1, Next(SECONDARY)),
    (2, {**NO_FALLBACK, "paid_retries": 1}, "server_error", 2, Over("PAID_ATTEMPT_FAILED")),
    # a paid retry is still a try: attempts_per_model bounds it too
    (1, {"attempts_per_model": 1, "fallback_on": [], "paid_retries": 1}, "server_error", 1, Over("ATTEMPTS_EXHAUSTED")),
]


@pytest.mark.parametrize("paid_failures,job_policy,error_class,tries,expected", PAID)
def test_what_follows_a_paid_failure(paid_failures, job_policy, error_class, tries, expected):
    decided = policy.after_attempt(chain=CHAIN, policy=job_policy, model=PRIMARY, error_class=error_class,
                                   tries_on_model=tries, retry_in_s=1.5, paid=True, paid_failures=paid_failures)
    assert decided == expected


def test_an_unpaid_failure_is_tried_again_whatever_paid_retries_says():
    assert policy.after_attempt(chain=CHAIN, policy=NO_FALLBACK, model=PRIMARY, error_class="server_error",
                                tries_on_model=1, retry_in_s=1.5, paid=False, paid_failures=3) == Next(PRIMARY, 1.5)


@pytest.mark.parametrize("age_s,ttl_s,expired", [
    (10 ** 9, None, False),  # a key remembered for ever never expires
    (3600.0, 86400.0, False), (86400.0 - 36.0, 86400.0, False),
    (86400.0 - 34.0, 86400.0, True),  # within a send's flight of the end: it may arrive after it
    (2.6, 3.0, False), (2.71, 3.0, True),  # the margin is at most a tenth of the lifetime
])
def test_a_key_may_have_expired_only_near_the_end_of_its_lifetime(age_s, ttl_s, expired):
    assert policy.key_may_have_expired(age_s=age_s, ttl_s=ttl_s, in_flight_s=35.0) is expired


@pytest.mark.parametrize("spec_name,status,unpaid", [
    # the sandbox: every status_* fault is answered before anything is accepted
    *[("sandbox/video-keyed", status, True) for status in (400, 401, 422, 429, 500, 503)],
    ("sandbox/video-keyed", 502, False), ("sandbox/video-keyed", None, False), ("sandbox/video-keyed", 408, False),
    # Anthropic and OpenAI: 429, 5xx and 529
    *[(name, status, True) for name in ("anthropic/claude-sonnet-4-5", "openai/gpt-4o")
      for status in (429, 500, 502, 503, 504, 529)],
    # Replicate: 429 and the other 4xx only; a 5xx may follow a created prediction
    ("replicate/owner/model", 429, True), ("replicate/owner/model", 422, True),
    ("replicate/owner/model", 500, False), ("replicate/owner/model", 503, False),
])
def test_adapters_declare_which_answers_are_unpaid(spec_name, status, unpaid):
    from executor.registry import code_spec

    assert code_spec(spec_name).capabilities.answered_unpaid(status) is unpaid


def test_keyed_models_declare_how_long_their_keys_live(settings):
    from executor.providers.base import DEFAULT_KEY_TTL_S
    from executor.registry import code_spec

    assert code_spec("sandbox/video-keyed").capabilities.key_ttl_s is None  # the sandbox: for ever
    assert DEFAULT_KEY_TTL_S == 86400.0  # a provider that documents none: a day


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
