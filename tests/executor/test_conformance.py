"""The provider conformance suite: every adapter through the same matrix of cases, so that what an answer
means (docs/design.md, "Three kinds of failure") is the same whichever provider gave it.

Each adapter has a *profile*, data in its own folder (executor/providers/<package>/conformance.py, read into
`PROFILES` below for every provider of PROVIDERS): how to provoke each case on it (which route to script
with which recorded fixture, which fault to inject, which call to make) and what it should answer. What
the adapter can do is never restated here: `capabilities_of` reads it from the registry as the code
declares it (executor.registry.code_spec) or, for a model the registry does not name, from the adapter's
own `capabilities`. The cases, one test function each, parametrized over the profiles:

1. accepted: a 2xx to the submit (or complete) gives a Submission (Completion) with the upstream id;
2. refused 4xx: a ProviderError of class invalid_input or refused, known, and unpaid by the capabilities;
3. 429 with Retry-After: rate_limited, retry_after parsed, known, unpaid;
4. every 5xx the adapter has an answer for: unpaid when the capabilities declare it, else unknown;
5. a lost reply (the request arrived, the answer never came): network or timeout, unknown, sent;
6. a paid failure: media, an accepted job whose poll says failed; text, a refusal in a 200 with its usage;
7. lookup (where `capabilities.lookup`): one that finds, and one that proves absence (None);
8. cancel (where `capabilities.cancel`): the call reaches its route and does not raise;
9. callbacks (where `capabilities.callbacks`; the adapter's call then asks `executor.callbacks.callback_url`):
   a signed callback verifies through `executor.callbacks.verify` and names the generation; a forged one
   (its body changed after signing, or signed with another secret or key) is Refused;
10. usage and price: the usage of the success answer, priced by `billing.rates.cost_of`, is the Decimal
    worked out by hand below from the fixture's numbers and the provider's published price;
11. payonce's own fields: every field the call sets (the body's, the query's, and those beside the job's
    parameters where the adapter nests them) is one the adapter declares in `own_fields`, and a parameter
    named like any of them never replaces payonce's value (issue 37: a `model` parameter once sent
    gpt-image-1 at high quality, recorded and billed as gpt-image-1-mini).

A case that does not apply is skipped with the capability that rules it out, and
`test_every_declared_capability_has_its_case` holds the profiles to the capabilities both ways (a
declared capability without its case, or a case whose capability is gone, fails), so a capability can
never silently lose its test. `test_the_checks_catch_a_*` break one adapter's error mapping and see the
case's check fail: the suite is not vacuous.

Where the answers come from:
- the sandbox (four profiles, one per model: their capabilities differ) runs as its real process
  (`python -m sandbox`, the session's `sandbox` fixture, reset per test by `ledger`); its answers are
  provoked with its fault injection (`POST /control/faults`), and its ledger is the ground truth of what
  was paid: a case that says "unpaid" also finds no charge, a lost reply finds the one it made;
- the real providers (Anthropic, OpenAI chat, Replicate, fal, OpenAI images) answer from their recorded
  fixtures (executor/providers/<package>/fixtures/) replayed over real HTTP by tests.support.replay_server, with
  REAL_PROVIDERS on and every adapter pointed at it, as tests/executor/test_adapters.py does;
- case 11 reads the request each adapter sent, so there a ReplayServer stands in for every provider, the
  sandbox included (its process keeps no request bodies).

No database: the prices are the rate card's defaults (billing.rates.DEFAULTS). The admin's overrides
(rows of ModelPrice) are an operator's choice, not the published price, and are set aside here.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from typing import Callable
from urllib.parse import parse_qsl

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from requests.structures import CaseInsensitiveDict
from standardwebhooks.webhooks import Webhook

from billing import rates
from executor import callbacks, registry
from executor.providers import PROVIDERS, conformance, real
from executor.providers.base import (
    Capabilities,
    Completion,
    ErrorClass,
    ProviderError,
    Submission,
    classify_http_error,
)
from executor.providers.conformance import PaidFailure, PriceCase, Profile, Refusal
from executor.providers.fal import adapter as fal
from executor.providers.fal import webhooks as fal_webhooks
from executor.providers.fal.adapter import FalProvider
from executor.providers.fal.conformance import REQUEST_ID as FAL_REQUEST_ID
from executor.providers.openai_images import adapter as openai_images
from executor.providers.replay import fixture, fixtures_dir
from executor.providers.replicate.adapter import ReplicateProvider
from executor.providers.replicate.conformance import PREDICTION_ID
from sandbox import callbacks as sandbox_callbacks
from sandbox.server import FAULT_ACTIONS
from tests.support.replay_server import DROP, ReplayServer

PROMPT = "a lighthouse at dusk"
UPSTREAM_KEY = "payonce-3f1c2b9e-job-2"
METADATA = {"payonce_job": "3f1c2b9e-job", "payonce_attempt": 2, "upstream_key": UPSTREAM_KEY}
# An attempt nobody made: what a lookup must prove absent.
ABSENT_KEY = "payonce-3f1c2b9e-job-9"
ABSENT_METADATA = {"payonce_job": "3f1c2b9e-job", "payonce_attempt": 9, "upstream_key": ABSENT_KEY}
SYSTEM = "You write market reports."
MESSAGES = [{"role": "user", "content": "Write chapter 1"}]

JWKS_PATH = "/.well-known/jwks.json"


@dataclass(frozen=True)
class Delivery:
    """A callback as the provider sends it, the generation it names, and forgeries of it."""

    body: bytes
    headers: CaseInsensitiveDict
    generation_id: str
    forgeries: tuple  # (label, body, headers)


def capabilities_of(profile: Profile) -> Capabilities:
    """What the code declares for this model: the registry's entry as the code states it (the models file
    and the admin's rows are an operator's changes, not the adapter's declaration), else the adapter's own
    `capabilities`."""
    spec = registry_spec(profile)
    if spec is not None:
        return spec.capabilities
    declared = getattr(profile.adapter, "capabilities", None)
    assert isinstance(declared, Capabilities), (
        f"{profile.id}: neither the registry nor the adapter declares its capabilities")
    return declared


def registry_spec(profile: Profile):
    name = f"{profile.provider}/{profile.model}"
    code_spec = getattr(registry, "code_spec", None)  # the code's layer alone: no database
    return code_spec(name) if code_spec is not None else registry.model_spec(name)


# -- the backends -------------------------------------------------------------------------------------


class ReplayHarness:
    """A real provider's adapter pointed at a ReplayServer."""

    backend = "replay"

    def __init__(self, server: ReplayServer, settings):
        self.server = server
        self.settings = settings

    @property
    def url(self) -> str:
        return self.server.url

    def answer(self, profile: Profile, *answers) -> None:
        self.server.script(*profile.route, *answers)

    def script(self, method: str, path: str, *answers) -> None:
        self.server.script(method, path, *answers)

    def hits(self, method: str, path: str) -> int:
        return len(self.server.received(method, path))

    def charges(self) -> list[dict] | None:
        return None  # nobody keeps a ledger of a recording


class SandboxHarness:
    """The sandbox's real process, answering by itself or with a fault; its ledger says what was paid."""

    backend = "sandbox"

    def __init__(self, process, settings):
        self.process = process
        self.settings = settings

    def answer(self, profile: Profile, *answers) -> None:
        faults = [{"model": profile.model, **answer} for answer in answers if answer is not None]
        if faults:
            self.process.faults(faults)

    def script(self, method: str, path: str, *answers) -> None:
        raise AssertionError(f"the sandbox is not scripted ({method} {path}): it answers by itself")

    def hits(self, method: str, path: str) -> int:
        return sum(1 for call in self.process.calls() if (call["method"], call["path"]) == (method, path))

    def charges(self) -> list[dict] | None:
        return self.process.ledger()["charges"]


# Keys of each provider's own shape, where it has one, and the path a base URL setting carries (OpenAI's
# ends in /v1); any other real provider gets a plain test key and the server's root.
TEST_KEYS = {"ANTHROPIC_API_KEY": "sk-ant-test-key", "OPENAI_API_KEY": "sk-proj-test-key",
             "REPLICATE_API_TOKEN": "r8_test_token", "FAL_KEY": "fal-key-id:fal-key-secret"}
BASE_PATHS = {"OPENAI_BASE_URL": "/v1"}


def point_real_providers_at(settings, url: str) -> None:
    """Every real adapter's base URL at `url` (a ReplayServer), each with a key: every real provider of
    PROVIDERS, by the settings its spec names."""
    for spec in PROVIDERS:
        if spec.real:
            setattr(settings, spec.key_setting, TEST_KEYS.get(spec.key_setting, f"{spec.name}-test-key"))
            setattr(settings, spec.base_url_setting, url + BASE_PATHS.get(spec.base_url_setting, ""))


@pytest.fixture
def harness(profile, settings, request):
    settings.PROVIDER_CALLBACK_BASE_URL = "off"  # a case that wants callbacks turns them on
    if profile.backend == "sandbox":
        process = request.getfixturevalue("ledger")  # the session's sandbox process, reset
        settings.REAL_PROVIDERS = False  # the sandbox rings only while real providers are off
        yield SandboxHarness(process, settings)
        return
    with ReplayServer() as server:
        settings.REAL_PROVIDERS = True
        point_real_providers_at(settings, server.url)
        fal_webhooks._jwks_cache.clear()
        yield ReplayHarness(server, settings)
        fal_webhooks._jwks_cache.clear()
        assert server.unexpected == [], f"requests nothing was scripted for: {server.unexpected}"


# -- calls ----------------------------------------------------------------------------------------------


def call(profile: Profile, *, model: str | None = None, params: dict | None = None):
    """The profile's submit (media) or complete (text), on a fresh adapter."""
    adapter = profile.adapter()
    model = model or profile.model
    if profile.kind == "text":
        return adapter.complete(model, system=SYSTEM, messages=MESSAGES, max_tokens=profile.max_tokens,
                                upstream_key=UPSTREAM_KEY, metadata=METADATA)
    return adapter.submit(model, upstream_key=UPSTREAM_KEY, prompt=PROMPT,
                          params=dict(profile.params if params is None else params), metadata=METADATA, inputs=[])


def provoke(profile: Profile, h, answer) -> ProviderError:
    """The error the profile's call raises when the submit route answers `answer`."""
    h.answer(profile, answer)
    try:
        result = call(profile)
    except ProviderError as exc:
        return exc
    raise AssertionError(f"{profile.id}: answered {result!r} where a ProviderError was due")


def run_scripts(h, scripts) -> None:
    for method, path, *answers in scripts:
        h.script(method, path, *answers)


def charged(h) -> int | None:
    charges = h.charges()
    return None if charges is None else len(charges)


# -- the checks (plain functions: the mutation tests call them too) --------------------------------------


def check_accepted(profile: Profile, h) -> None:
    h.answer(profile, profile.accepted)
    result = call(profile)

    assert isinstance(result, Completion if profile.kind == "text" else Submission), result
    assert result.upstream_id, f"{profile.id}: an acceptance without an upstream id"
    if profile.kind == "media":
        assert result.status in ("running", "succeeded"), result.status
    if profile.accepted_id is not None:
        assert result.upstream_id == profile.accepted_id
    else:  # the sandbox: the generation (or message) it charged
        assert [charge["generation_id"] for charge in h.charges()] == [result.upstream_id]
    assert h.hits(*profile.route) == 1, f"{profile.id}: the call did not go out to {profile.route} once"


def check_refused(profile: Profile, h, refusal: Refusal) -> None:
    caps = capabilities_of(profile)
    exc = provoke(profile, h, refusal.answer)

    assert exc.status is not None and 400 <= exc.status < 500, exc.status
    assert exc.outcome_unknown is False, f"{profile.id}: a {exc.status} refusal must be a known outcome"
    assert exc.never_sent is False
    assert caps.answered_unpaid(exc.status), f"{profile.id}: a {exc.status} refusal must be unpaid"
    assert exc.kind in (ErrorClass.INVALID_INPUT, ErrorClass.REFUSED), exc.kind
    assert exc.kind == refusal.kind, f"{profile.id}: {refusal.label} classed {exc.kind}, not {refusal.kind}"
    assert refusal.words in exc.message, f"{profile.id}: the provider's words are lost: {exc.message!r}"
    assert charged(h) in (None, 0), f"{profile.id}: the sandbox charged a refusal"


def check_rate_limited(profile: Profile, h) -> None:
    caps = capabilities_of(profile)
    exc = provoke(profile, h, profile.rate_limit.answer)

    assert (exc.kind, exc.status) == (ErrorClass.RATE_LIMITED, 429), (exc.kind, exc.status)
    assert exc.retry_after == profile.rate_limit.retry_after, f"{profile.id}: retry_after {exc.retry_after}"
    assert exc.outcome_unknown is False, f"{profile.id}: a 429 must be a known outcome"
    assert caps.answered_unpaid(exc.status), f"{profile.id}: a 429 must be unpaid"
    assert charged(h) in (None, 0), f"{profile.id}: the sandbox charged a 429"


def check_server_error(profile: Profile, h, status: int) -> None:
    caps = capabilities_of(profile)
    exc = provoke(profile, h, profile.server_errors[status])

    assert exc.status == status, exc.status
    assert exc.kind in (ErrorClass.SERVER_ERROR, ErrorClass.TIMEOUT), exc.kind
    if status in caps.unpaid_statuses:
        assert caps.answered_unpaid(exc.status), f"{profile.id}: a declared unpaid {status} must be unpaid"
        assert charged(h) in (None, 0), f"{profile.id}: the sandbox declares {status} unpaid, yet charged it"
    else:
        assert exc.outcome_unknown is True, (
            f"{profile.id}: a {status} not declared unpaid must be an unknown outcome (it may have been accepted)")
        assert not caps.answered_unpaid(exc.status), f"{profile.id}: a {status} not declared unpaid is unpaid"


def check_lost_reply(profile: Profile, h) -> None:
    caps = capabilities_of(profile)
    exc = provoke(profile, h, profile.lost)

    assert exc.kind in (ErrorClass.NETWORK, ErrorClass.TIMEOUT), exc.kind
    assert exc.outcome_unknown is True, (
        f"{profile.id}: a lost reply must be an unknown outcome (the request arrived: it may have been charged)")
    assert exc.never_sent is False, f"{profile.id}: the request arrived; it was sent"
    assert not caps.answered_unpaid(exc.status), f"{profile.id}: a lost reply counted as an unpaid answer"
    assert charged(h) in (None, 1), f"{profile.id}: the sandbox should have charged the dropped submit once"


def check_paid_failure(profile: Profile, h, failure: PaidFailure) -> None:
    caps = capabilities_of(profile)
    if profile.kind == "text":
        exc = provoke(profile, h, failure.submit)
        assert exc.kind == ErrorClass.REFUSED, exc.kind
        assert exc.status is not None and 200 <= exc.status < 300, f"{profile.id}: a refusal in a 200, not {exc.status}"
        assert exc.outcome_unknown is False
        assert not caps.answered_unpaid(exc.status), f"{profile.id}: an answered 200 is paid"
        assert getattr(exc, "usage", None) == failure.usage, f"{profile.id}: the paid usage is lost"
        assert failure.error in exc.message, exc.message
        return

    h.answer(profile, failure.submit)
    run_scripts(h, failure.then)
    submission = call(profile, params=failure.params)
    polled = profile.adapter().poll(profile.model, submission.upstream_id)

    assert (polled.status, polled.terminal) == ("failed", True), polled.status
    assert polled.error == failure.error, f"{profile.id}: the provider's words: {polled.error!r}"
    assert polled.error_class == failure.error_class, polled.error_class
    assert charged(h) in (None, 1), f"{profile.id}: the sandbox should have charged the failed render"


def check_lookup(profile: Profile, h) -> None:
    case = profile.lookup
    adapter = profile.adapter()
    submitted_at = case.submitted_at if case.submitted_at is not None else time.time()
    if case.found_id is None:
        h.answer(profile, profile.accepted)
        found_id = call(profile).upstream_id
    else:
        found_id = case.found_id

    run_scripts(h, case.found)
    found = adapter.lookup(profile.model, upstream_key=UPSTREAM_KEY, metadata=METADATA, prompt=PROMPT,
                           params=dict(profile.params), submitted_at=submitted_at)
    assert isinstance(found, Submission), f"{profile.id}: the earlier submission was not found: {found!r}"
    assert found.upstream_id == found_id

    run_scripts(h, case.absent)
    absent = adapter.lookup(profile.model, upstream_key=ABSENT_KEY, metadata=ABSENT_METADATA, prompt=PROMPT,
                            params=dict(profile.params), submitted_at=submitted_at)
    assert absent is None, f"{profile.id}: proven absence must be None, not {absent!r}"
    assert h.hits(*case.route) >= 2, f"{profile.id}: the lookups did not search {case.route}"


def check_cancel(profile: Profile, h) -> None:
    case = profile.cancel
    if case.upstream_id is None:
        h.answer(profile, profile.accepted)
        upstream_id = call(profile, params=case.params).upstream_id
    else:
        upstream_id = case.upstream_id
    method, path = case.route[0], case.route[1].format(id=upstream_id)
    if case.answers:
        h.script(method, path, *case.answers)

    assert profile.adapter().cancel(profile.model, upstream_id) is None
    assert h.hits(method, path) == 1, f"{profile.id}: the cancel did not go out to {method} {path}"


def check_callbacks(profile: Profile, h) -> None:
    delivery = CALLBACKS[profile.callback](profile, h)
    try:
        message_id, generation = callbacks.verify(profile.provider, delivery.body, delivery.headers)
    except callbacks.Refused as refused:
        raise AssertionError(f"{profile.id}: a correctly signed callback was refused: {refused.answer}") from None
    assert generation == delivery.generation_id
    assert isinstance(message_id, str) and message_id
    for label, body, headers in delivery.forgeries:
        try:
            callbacks.verify(profile.provider, body, headers)
        except callbacks.Refused:
            continue
        raise AssertionError(f"{profile.id}: a callback {label} was taken")


def check_price(profile: Profile, h, case: PriceCase) -> None:
    model = case.model or profile.model
    params = None if profile.kind == "text" else dict(profile.params if case.params is None else case.params)
    h.answer(profile, case.submit)
    run_scripts(h, case.then)
    result = call(profile, model=model, params=params)
    usage = result.usage
    if profile.kind == "media" and case.then:  # asynchronous: the usage comes with the finished render
        usage = profile.adapter().poll(model, result.upstream_id).usage

    cost = rates.cost_of(f"{profile.provider}/{model}", usage.as_dict() if usage else {}, params=params)

    assert cost == case.expected, f"{profile.id} {case.label}: priced {cost}, not {case.expected}"
    charges = h.charges()
    if charges is not None:  # the sandbox's own price, to the cent
        assert Decimal(charges[-1]["amount_usd"]) == case.expected, charges[-1]


# -- callbacks as each provider sends them ------------------------------------------------------------


def whsec(seed: bytes) -> str:
    return "whsec_" + base64.b64encode(hashlib.sha256(seed).digest()).decode()


def standard_webhook(secret: str, message_id: str, body: bytes) -> CaseInsensitiveDict:
    at = datetime.now(timezone.utc)
    return CaseInsensitiveDict({"content-type": "application/json", "webhook-id": message_id,
                                "webhook-timestamp": str(int(at.timestamp())),
                                "webhook-signature": Webhook(secret).sign(message_id, at, body.decode())})


def changed(body: bytes, old: bytes, new: bytes) -> bytes:
    forged = body.replace(old, new, 1)
    assert forged != body, f"nothing to change: {old!r} is not in the body"
    return forged


def sandbox_callback(profile: Profile, h) -> Delivery:
    """The sandbox's own callback: a render submitted with a callback URL, called back by the process when
    it ends, caught by a ReplayServer standing for payonce's web process."""
    with ReplayServer() as receiver:
        receiver.script("POST", "/v1/callbacks/sandbox", {"status": 204, "headers": {}, "body": ""})
        h.settings.PROVIDER_CALLBACK_BASE_URL = receiver.url
        h.settings.SANDBOX_CALLBACK_SECRET = sandbox_callbacks.secret()  # what the process signs with
        submission = call(profile, params={"render_s": 0.2})
        deadline = time.monotonic() + 10
        while not receiver.requests and time.monotonic() < deadline:
            time.sleep(0.02)
        assert receiver.requests, f"{profile.id}: the sandbox never called back"
        [sent] = receiver.requests
    headers = CaseInsensitiveDict(sent.headers)
    return Delivery(sent.body, headers, submission.upstream_id, forgeries=(
        ("whose body was changed after signing", changed(sent.body, b'"succeeded"', b'"failed"'), headers),
        ("signed with another secret", sent.body,
         standard_webhook(whsec(b"not the sandbox's"), headers["webhook-id"], sent.body)),
    ))


def replicate_callback(profile: Profile, h) -> Delivery:
    """Replicate's webhook: the prediction, signed per Standard Webhooks with the account's secret."""
    secret = whsec(b"replicate webhook secret")
    h.settings.REPLICATE_WEBHOOK_SECRET = secret
    body = json.dumps(fixture("replicate/prediction_succeeded")["body"]).encode()
    message_id = "msg_2yQpY8n1c7cVZk3dLw0tE5rX9bN"
    return Delivery(body, standard_webhook(secret, message_id, body), PREDICTION_ID, forgeries=(
        ("whose body was changed after signing", changed(body, b'"succeeded"', b'"failed"'),
         standard_webhook(secret, message_id, body)),
        ("signed with another secret", body, standard_webhook(whsec(b"someone else"), message_id, body)),
    ))


def ed25519_key() -> tuple[Ed25519PrivateKey, dict]:
    private = Ed25519PrivateKey.generate()
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return private, {"kty": "OKP", "crv": "Ed25519", "x": base64.urlsafe_b64encode(raw).rstrip(b"=").decode(),
                     "kid": "conformance", "use": "sig", "alg": "EdDSA"}


def fal_signed(private: Ed25519PrivateKey, body: bytes, request_id: str) -> CaseInsensitiveDict:
    """fal's webhook headers: request id, user id, timestamp and the body's SHA-256, signed with Ed25519."""
    user_id, timestamp = "user_2fK8mQ4xLz9RnT1vB7cW3yH6pD0", str(int(time.time()))
    message = "\n".join((request_id, user_id, timestamp, hashlib.sha256(body).hexdigest())).encode()
    return CaseInsensitiveDict({"content-type": "application/json", "x-fal-webhook-request-id": request_id,
                                "x-fal-webhook-user-id": user_id, "x-fal-webhook-timestamp": timestamp,
                                "x-fal-webhook-signature": private.sign(message).hex()})


def fal_callback(profile: Profile, h) -> Delivery:
    """fal's webhook, signed by a key of ours that the ReplayServer publishes as fal's JWKS."""
    private, jwk = ed25519_key()
    stranger, _ = ed25519_key()
    published = {"status": 200, "headers": {"content-type": "application/json"}, "body": {"keys": [jwk]}}
    h.script("GET", JWKS_PATH, *[published] * 3)  # fetched once and kept; a refresh is allowed for
    h.settings.FAL_WEBHOOK_JWKS_URL = h.url + JWKS_PATH
    fal_webhooks._jwks_cache.clear()
    body = json.dumps(fixture("fal/webhook_ok")["body"]).encode()
    return Delivery(body, fal_signed(private, body, FAL_REQUEST_ID), FAL_REQUEST_ID, forgeries=(
        ("whose body was changed after signing", changed(body, b'"OK"', b'"ERROR"'),
         fal_signed(private, body, FAL_REQUEST_ID)),
        ("signed by a key fal does not publish", body, fal_signed(stranger, body, FAL_REQUEST_ID)),
    ))


# -- the profiles -------------------------------------------------------------------------------------

# Each provider's profile is its folder's (executor/providers/<package>/conformance.py): every provider of
# PROVIDERS has one, so a provider cannot be added without its profile.
PROFILES = tuple(profile for spec in PROVIDERS
                 for profile in importlib.import_module(f"executor.providers.{spec.package}.conformance").PROFILES)
# The signed callbacks the suite makes as each provider does (a profile names its provider's).
CALLBACKS = {"sandbox": sandbox_callback, "replicate": replicate_callback, "fal": fal_callback}
PROFILE = {profile.id: profile for profile in PROFILES}
IDS = [profile.id for profile in PROFILES]


def pairs(items_of: Callable[[Profile], object], label_of: Callable[[object], str]):
    """(profile, item) for every item of every profile, or (profile, None) for a profile that has none
    (its test says why it is skipped)."""
    params = []
    for profile in PROFILES:
        items = list(items_of(profile))
        for item in items or [None]:
            params.append(pytest.param(profile, item, id=f"{profile.id}-{label_of(item) if item else 'none'}"))
    return params


# -- the matrix ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", PROFILES, ids=IDS)
def test_accepted(profile, harness):
    check_accepted(profile, harness)


@pytest.mark.parametrize(("profile", "refusal"), pairs(lambda p: p.refusals, lambda r: r.label))
def test_refused_4xx(profile, refusal, harness):
    check_refused(profile, harness, refusal)


@pytest.mark.parametrize("profile", PROFILES, ids=IDS)
def test_rate_limited_429(profile, harness):
    check_rate_limited(profile, harness)


@pytest.mark.parametrize(("profile", "status"), pairs(lambda p: sorted(p.server_errors), str))
def test_server_error_5xx(profile, status, harness):
    check_server_error(profile, harness, status)


@pytest.mark.parametrize("profile", PROFILES, ids=IDS)
def test_lost_reply(profile, harness):
    check_lost_reply(profile, harness)


@pytest.mark.parametrize(("profile", "failure"), pairs(lambda p: p.paid_failures, lambda f: f.label))
def test_paid_failure(profile, failure, harness):
    caps = capabilities_of(profile)
    # Skipped cases name why: a capability the adapter does not declare (test_every_declared_capability_
    # has_its_case holds the profiles to the capabilities both ways), or the profile's stated reason.
    if profile.kind == "media" and not caps.asynchronous:
        pytest.skip(f"{profile.id}: capabilities.asynchronous is False: the finished output is the submit's "
                    "answer, nothing is polled, so no accepted job can fail later")
    if failure is None:
        assert profile.no_paid_failure, f"{profile.id}: no paid failure in the profile, and no reason given"
        pytest.skip(f"{profile.id}: {profile.no_paid_failure}")
    check_paid_failure(profile, harness, failure)


@pytest.mark.parametrize("profile", PROFILES, ids=IDS)
def test_lookup(profile, harness):
    # Not a hidden failure: an adapter that does not declare the capability has no such case to run, and
    # test_every_declared_capability_has_its_case fails one that declares it without its case.
    if not capabilities_of(profile).lookup:
        pytest.skip(f"{profile.id}: capabilities.lookup is False")
    assert profile.lookup is not None, f"{profile.id} declares lookup: its profile needs the lookup case"
    check_lookup(profile, harness)


@pytest.mark.parametrize("profile", PROFILES, ids=IDS)
def test_cancel(profile, harness):
    # Not a hidden failure: an adapter that does not declare the capability has no such case to run, and
    # test_every_declared_capability_has_its_case fails one that declares it without its case.
    if not capabilities_of(profile).cancel:
        pytest.skip(f"{profile.id}: capabilities.cancel is False")
    assert profile.cancel is not None, f"{profile.id} declares cancel: its profile needs the cancel case"
    check_cancel(profile, harness)


def asks_for_callbacks(profile: Profile, h) -> bool:
    """Whether the adapter's submit asks executor.callbacks.callback_url for its callback URL (the one way
    an adapter asks its provider to call back, docs/providers.md step 6)."""
    asked = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(callbacks, "callback_url", lambda provider: asked.append(provider))
        h.answer(profile, profile.accepted)
        call(profile)
    return profile.provider in asked


@pytest.mark.parametrize("profile", PROFILES, ids=IDS)
def test_callbacks(profile, harness):
    # Not a hidden failure: an adapter that does not declare the capability has no such case to run, and
    # test_every_declared_capability_has_its_case fails one that declares it without its case.
    if not capabilities_of(profile).callbacks:
        pytest.skip(f"{profile.id}: capabilities.callbacks is False")
    assert profile.callback is not None, f"{profile.id} asks for callbacks: its profile needs the callback case"
    check_callbacks(profile, harness)


@pytest.mark.parametrize(("profile", "case"), pairs(lambda p: p.prices, lambda c: c.label))
def test_usage_and_price(profile, case, harness, monkeypatch):
    assert case is not None, f"{profile.id}: no price case"
    # The card's defaults, not an operator's overrides (rows of the database): the published price.
    monkeypatch.setitem(rates._overrides, "rows", {})
    monkeypatch.setitem(rates._overrides, "at", float("inf"))
    check_price(profile, harness, case)


# -- case 11: payonce's own fields ----------------------------------------------------------------------
#
# Read on the wire: a ReplayServer stands in for every provider (the sandbox's process keeps no request
# bodies), with callbacks on, so that the callback URLs payonce sets are in the request too.

# A parameter no model takes: where it lands in the request is where the job's parameters go.
PROBE = "conformance_probe"
# A reference already uploaded, for the adapters that take references (the others refuse them unsent).
REFERENCE = "https://payonce.example/inputs/reference-1"
CALLBACK_BASE = "https://payonce.example"
# What a parameter named like one of payonce's fields carries: never any value payonce sets.
PARAM_VALUE = "a parameter's value"
# The sandbox's acceptance, where the ReplayServer stands in for it.
SANDBOX_WIRE_ANSWERS = {
    "media": {"status": 202, "headers": {"content-type": "application/json"},
              "body": {"id": "gen_wire", "status": "running"}},
    "text": {"status": 200, "headers": {"content-type": "application/json"},
             "body": {"id": "msg_wire", "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
                      "usage": {"input_tokens": 1, "output_tokens": 1}}},
}


@dataclass(frozen=True)
class Sent:
    """One request as the provider received it."""

    path: str
    query: dict
    body: dict


@pytest.fixture
def wire(profile, settings):
    with ReplayServer() as server:
        # The sandbox asks for callbacks only while real providers are off; the real adapters reach the
        # server only while they are on.
        settings.REAL_PROVIDERS = profile.backend != "sandbox"
        settings.SANDBOX_URL = server.url
        point_real_providers_at(settings, server.url)
        settings.PROVIDER_CALLBACK_BASE_URL = CALLBACK_BASE
        settings.SANDBOX_CALLBACK_SECRET = whsec(b"sandbox callbacks")
        settings.REPLICATE_WEBHOOK_SECRET = whsec(b"replicate webhook secret")
        settings.FAL_WEBHOOK_JWKS_URL = server.url + JWKS_PATH  # never fetched: a submit only names the URL
        yield server
        assert server.unexpected == [], f"requests nothing was scripted for: {server.unexpected}"


def wire_call(profile: Profile, server: ReplayServer, params: dict) -> Sent | None:
    """The request the profile's call sends with `params` (and a reference, where the adapter takes one), or
    None when the adapter refused it before sending anything (invalid_input)."""
    model, route = profile.wire_model or (profile.model, profile.route)
    answer = SANDBOX_WIRE_ANSWERS[profile.kind] if profile.backend == "sandbox" else profile.accepted
    adapter = profile.adapter()
    before = len(server.requests)
    server.script(*route, answer)
    if profile.kind == "text":
        adapter.complete(model, system=SYSTEM, messages=MESSAGES, max_tokens=profile.max_tokens,
                         upstream_key=UPSTREAM_KEY, metadata=METADATA)
    else:
        for inputs in ([REFERENCE], []):  # OpenAI's images and fal take no references: refused unsent
            try:
                adapter.submit(model, upstream_key=UPSTREAM_KEY, prompt=PROMPT, params=dict(params),
                               metadata=METADATA, inputs=inputs)
                break
            except ProviderError as exc:
                assert exc.kind == ErrorClass.INVALID_INPUT and len(server.requests) == before, (
                    f"{profile.id}: {exc!r} after a request went out")
        else:
            return None  # nothing was sent (the answer scripted for it stays unused)
    [request] = server.requests[before:]
    assert (request.method, request.path) == route, f"{profile.id}: sent to {request.method} {request.path}"
    assert isinstance(request.json, dict), f"{profile.id}: the body is not a JSON object: {request.body[:200]!r}"
    return Sent(request.path, dict(parse_qsl(request.query)), request.json)


def check_own_fields_declared(profile: Profile, server: ReplayServer) -> None:
    """Every field the call sets is one the adapter declares its own: the body's, the query's, and those
    beside the job's parameters where the adapter nests them (found by a probe parameter)."""
    own = set(profile.adapter.own_fields)
    sent = wire_call(profile, server, {} if profile.kind == "text" else {PROBE: 1})
    assert sent is not None, f"{profile.id}: refused a call with nothing wrong in it"
    beside_params: set = set()
    if profile.kind == "media":
        [where] = [level for level in (sent.body, *sent.body.values()) if isinstance(level, dict) and PROBE in level]
        beside_params = set(where)
    set_by_payonce = (set(sent.body) | beside_params | set(sent.query)) - {PROBE}
    assert set_by_payonce - own == set(), (
        f"{profile.id} sets {sorted(set_by_payonce - own)} without declaring them in own_fields")
    assert "model" in own and (profile.kind == "text" or "prompt" in own), (
        f"{profile.id}: the model (and a render's prompt) is always payonce's own")
    if capabilities_of(profile).callbacks:  # the call asked for its callback: that field was checked too
        assert f"{CALLBACK_BASE}/v1/callbacks/{profile.provider}" in json.dumps([sent.body, sent.query]), sent


def keeps(payonces, sent, where: str = "") -> list[str]:
    """Where `sent` lost a value `payonces` (the request without the parameter) has: [] when none."""
    if isinstance(payonces, dict) and isinstance(sent, dict):
        return [lost for key, value in payonces.items()
                for lost in (keeps(value, sent[key], f"{where}.{key}") if key in sent else [f"{where}.{key}"])]
    return [] if payonces == sent else [f"{where or 'the body'}: {sent!r} instead of {payonces!r}"]


def check_own_field_kept(profile: Profile, server: ReplayServer, own_field: str) -> None:
    """A parameter named like `own_field` changes nothing payonce sets: the path (the model, for fal and
    Replicate), the query and every field of the body keep the values of the same call without it; or the
    adapter refuses the call before sending it."""
    payonces = wire_call(profile, server, dict(profile.params))
    assert payonces is not None, f"{profile.id}: refused a call with nothing wrong in it"
    sent = wire_call(profile, server, {**profile.params, own_field: PARAM_VALUE})
    if sent is None:
        return  # refused unsent (OpenAI's images refuse an n other than 1): nothing replaced
    assert sent.path == payonces.path, f"{profile.id}: {own_field} moved the call to {sent.path}"
    lost = keeps({"query": payonces.query, "body": payonces.body}, {"query": sent.query, "body": sent.body})
    assert lost == [], f"{profile.id}: a parameter named {own_field} replaced payonce's value at {lost}"


@pytest.mark.parametrize("profile", PROFILES, ids=IDS)
def test_every_field_the_call_sets_is_one_of_the_adapters_own(profile, wire):
    check_own_fields_declared(profile, wire)


@pytest.mark.parametrize(("profile", "own_field"),
                         pairs(lambda p: p.adapter.own_fields if p.kind == "media" else (), str))
def test_a_parameter_named_like_an_own_field_never_replaces_payonces_value(profile, own_field, wire):
    # Not a hidden failure: a text profile has no own fields to protect (pairs() yields None for it).
    if own_field is None:
        pytest.skip(f"{profile.id}: a text call (complete) takes no job parameters: its whole body is payonce's")
    check_own_field_kept(profile, wire, own_field)


# -- the profiles are held to the capabilities --------------------------------------------------------


def test_every_provider_has_a_profile_in_its_folder_and_a_lost_reply_is_the_replay_servers_drop():
    # Each provider's profiles are its folder's data (executor/providers/<package>/conformance.py), read
    # here for every spec of PROVIDERS: a new provider's folder without one fails at collection, and one
    # without a profile of its own provider fails here.
    assert {profile.provider for profile in PROFILES} == {spec.name for spec in PROVIDERS}
    assert conformance.DROP == DROP  # the data's marker is the server's



@pytest.mark.parametrize("profile", PROFILES, ids=IDS)
def test_every_declared_capability_has_its_case(profile, harness):
    """Both ways: a declared capability without its case would be skipped untested, and a case whose
    capability was taken away would be skipped without a word."""
    caps = capabilities_of(profile)
    polled = profile.kind == "media" and caps.asynchronous
    wanted = {
        "lookup": (caps.lookup, profile.lookup is not None),
        "cancel": (caps.cancel, profile.cancel is not None),
        "asynchronous (a paid failure a poll sees)": (polled, profile.kind == "media" and bool(profile.paid_failures)),
        "callbacks": (caps.callbacks, profile.callback is not None),
    }
    declared_without_case = [name for name, (declared, has) in wanted.items() if declared and not has]
    case_without_declared = [name for name, (declared, has) in wanted.items() if has and not declared]
    assert declared_without_case == [], f"{profile.id} declares {declared_without_case} with no case in its profile"
    assert case_without_declared == [], f"{profile.id} has cases for {case_without_declared} it no longer declares"
    # What the adapter does agrees with what it declares: its submit asks for a callback URL exactly when
    # it declares callbacks (docs/providers.md, step 6).
    assert asks_for_callbacks(profile, harness) == caps.callbacks, (
        f"{profile.id}: capabilities.callbacks is {caps.callbacks}, but its call "
        f"{'asks' if not caps.callbacks else 'does not ask'} callbacks.callback_url")
    assert set(profile.server_errors) == available_5xx(profile), (
        f"{profile.id}: every 5xx it has an answer for is a case (case 4)")
    assert profile.refusals and profile.prices


def available_5xx(profile: Profile) -> set[int]:
    """The 5xx statuses the profile's backend can answer its submit with: the sandbox's status_5xx faults,
    or the statuses of the adapter's recorded error fixtures (each answer checked against its file)."""
    if profile.backend == "sandbox":
        return {int(action.removeprefix("status_")) for action in FAULT_ACTIONS if action.startswith("status_5")}
    for status, answer in profile.server_errors.items():
        assert fixture(answer)["status"] == status, f"{profile.id}: {answer} does not answer {status}"
    directory, _, stem = profile.fixtures.partition("/")
    return {fixture(f"{directory}/{path.stem}")["status"] for path in fixtures_dir(directory).glob(f"{stem}5*.json")}


@pytest.mark.parametrize("profile", [p for p in PROFILES if p.backend == "replay"], ids=lambda p: p.id)
def test_the_registry_and_the_adapter_declare_the_same_capabilities(profile):
    spec = registry_spec(profile)
    # Every profile names a model the code knows: one it did not would read the adapter's capabilities
    # untested against the registry, so it fails here rather than being skipped.
    assert spec is not None, f"{profile.provider}/{profile.model} is not in the registry"
    assert spec.capabilities == profile.adapter.capabilities


# -- the suite is not vacuous: a broken mapping fails its check ---------------------------------------


@pytest.mark.parametrize("profile", [PROFILE["fal"]], ids=["fal"])
def test_the_checks_catch_a_lost_reply_reported_as_known(profile, harness, monkeypatch):
    check_lost_reply(profile, harness)  # as the adapter is: it passes

    send = real.send

    def known(*args, **kwargs):
        try:
            return send(*args, **kwargs)
        except ProviderError as exc:  # the dropped connection, reported as if nothing could have been paid
            raise ProviderError(exc.kind, exc.message, status=exc.status, retry_after=exc.retry_after,
                                outcome_unknown=False, never_sent=exc.never_sent) from exc

    monkeypatch.setattr(real, "send", known)
    with pytest.raises(AssertionError, match="unknown outcome"):
        check_lost_reply(profile, harness)


@pytest.mark.parametrize("profile", [PROFILE["fal"]], ids=["fal"])
def test_the_checks_catch_a_5xx_reported_as_unpaid(profile, harness, monkeypatch):
    check_server_error(profile, harness, 503)  # as the adapter is: it passes

    def unpaid(status, refused=False):
        kind, _ = classify_http_error(status, refused=refused)
        return kind, False  # a 503 that may have queued (and billed) a request, called known

    monkeypatch.setattr(fal, "classify_http_error", unpaid)
    with pytest.raises(AssertionError, match="unknown outcome"):
        check_server_error(profile, harness, 503)


@pytest.mark.parametrize("profile", [PROFILE["openai-images"]], ids=["openai-images"])
def test_the_checks_catch_a_parameter_that_replaces_the_model(profile, wire, monkeypatch):
    check_own_field_kept(profile, wire, "model")  # as the adapter is: it passes

    # The body as it was built before issue 37: the job's parameters after payonce's fields.
    monkeypatch.setattr(openai_images, "request_body",
                        lambda model, prompt, params: {"model": model, "prompt": prompt, **params, "n": 1})
    with pytest.raises(AssertionError, match="replaced payonce's value"):
        check_own_field_kept(profile, wire, "model")


@pytest.mark.parametrize("profile", [PROFILE["fal"]], ids=["fal"])
def test_the_checks_catch_a_field_the_adapter_sets_without_declaring_it(profile, wire, monkeypatch):
    check_own_fields_declared(profile, wire)  # as the adapter is: it passes

    monkeypatch.setattr(FalProvider, "own_fields", ("model", "fal_webhook"))  # the prompt left out
    with pytest.raises(AssertionError, match="without declaring"):
        check_own_fields_declared(profile, wire)


@pytest.mark.parametrize("profile", [PROFILE["replicate"]], ids=["replicate"])
def test_the_checks_catch_a_lookup_that_claims_absence_it_did_not_prove(profile, harness, monkeypatch):
    # Replicate's listing cut short: a lookup that answers None without reaching the submit time.
    monkeypatch.setattr(ReplicateProvider, "lookup", lambda self, *args, **kwargs: None)
    with pytest.raises(AssertionError, match="not found"):
        check_lookup(profile, harness)
