"""jobs.api.fastcreate against JobCreateSerializer: whatever the fast path accepts, the serializer accepts with
the same validated data (types and key order included), over many generated bodies, valid and invalid; and
it does accept the plain media bodies it is there for. Through the API, a body it took and the same body
the serializer took are one job (the same hash: 202, never 409)."""

import copy
import math

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from jobs.api import fastcreate
from jobs.api.serializers import JobCreateSerializer
from jobs.models import Job
from tests.conftest import media_body

pytestmark = pytest.mark.django_db


def typed(value):
    """The value with every type spelled out (2 is not 2.0, True is not 1) and dict keys in their order."""
    if isinstance(value, dict):
        return ("dict", tuple((typed(k), typed(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(typed(v) for v in value))
    if isinstance(value, float) and math.isnan(value):
        return ("float", "nan")
    return (type(value).__name__, value)


def serializer_data(body):
    serializer = JobCreateSerializer(data=body, client=None)
    return serializer.validated_data if serializer.is_valid() else None


# --- generated bodies: mostly near a valid one, each field sometimes wrong ---------------------------------

_ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=6,
)
_STRINGS = st.sampled_from(["", " ", "a", " a lighthouse ", "a\x00b", "a\ud800b", "\u2003x\u2003", "x" * 20000,
                            " " + "x" * 20000, "x" * 20001, "\n", "ok"])
_MODEL = st.sampled_from([
    "sandbox/video-keyed", "sandbox/image-lookup", "sandbox/image-blind", " sandbox/video-keyed", "sandbox/llm",
    "openai-images/gpt-image-1", "fal/fal-ai/flux/dev", "replicate/black-forest-labs/flux-dev", "nope/none",
    "anthropic/claude-haiku-4-5", "", "x" * 101, 7, None, ["sandbox/video-keyed"],
])
_MODELS = st.lists(_MODEL, min_size=0, max_size=7) | st.sampled_from([["sandbox/video-keyed"], "sandbox/video-keyed",
                                                                       None, {}, 1])
_PARAM_VALUE = (st.integers(-5, 100) | st.floats(-5, 1e6, allow_nan=False) | st.just(10**400) | st.booleans()
                | st.none() | _STRINGS | st.just([1]) | st.just({"a": 1}) | st.just(1e308))
_PARAM_NAME = st.sampled_from(["render_s", "expected_s", "fail_render", "size_bytes", "size", "seed", "model",
                               "references", "unknown", "prompt2", "num_images"])
_NESTED = st.integers(0, 40).map(lambda depth: _nest(depth))


def _nest(depth):
    value = 1
    for _ in range(depth):
        value = [value]
    return value


@st.composite
def _input(draw):
    if draw(st.integers(0, 29)) == 0:
        return draw(_ANY_JSON)
    value = {}
    if draw(st.integers(0, 9)):
        value["prompt"] = draw(_STRINGS | st.integers() | st.none() if draw(st.integers(0, 6)) == 0 else
                               st.sampled_from(["a lighthouse at dusk", " a lighthouse ", "p"]))
    if draw(st.integers(0, 2)):  # parameters the sandbox's models declare, mostly in bounds
        value.update(draw(st.fixed_dictionaries({}, optional={
            "render_s": st.integers(0, 5) | st.floats(0, 5), "expected_s": st.floats(-1, 5, allow_nan=False),
            "size_bytes": st.integers(-1, 10**9), "fail_render": st.sampled_from(["refused", "x", "", 1])})))
    else:
        value.update(draw(st.dictionaries(_PARAM_NAME, _PARAM_VALUE, max_size=3)))
    if draw(st.integers(0, 9)) == 0:
        value["deep"] = draw(_NESTED)
    if draw(st.integers(0, 14)) == 0:
        value["references"] = draw(st.sampled_from([[], [{"output_key": "a.mp4"}], "x"]))
    return value


_NUMBERS = (st.integers(-3, 12) | st.integers(0, 4) | st.floats(1, 10) | st.floats(-3, 100, allow_nan=False) | st.booleans() | st.none()
            | st.sampled_from(["3", 10**400, 86400, 86400.0, 86401, 2592000, 2592001, 0.5, 1, 1.0]))


@st.composite
def _policy(draw):
    if draw(st.integers(0, 14)) == 0:
        return draw(_ANY_JSON)
    policy = {}
    for name, values in (
        ("attempts_per_model", _NUMBERS),
        ("fallback_on", st.lists(st.sampled_from(["exhausted", "unavailable", "refused", "window_expired", "x", 1,
                                                  None]), max_size=6) | st.sampled_from(["exhausted", None, {}])),
        ("window_s", _NUMBERS), ("paid_retries", _NUMBERS), ("deadline_s", _NUMBERS),
        ("deadline_at", st.sampled_from(["2999-01-01T00:00:00Z", "2000-01-01T00:00:00Z", "x"])),
        ("polcy", st.just(1)),
    ):
        if draw(st.integers(0, 2 if name not in ("deadline_at", "polcy") else 15)) == 0:
            policy[name] = draw(values)
    return policy


@st.composite
def valid_bodies(draw):
    """Valid plain media bodies, each field drawn from values the API takes."""
    body = {"kind": "media",
            "models": draw(st.lists(st.sampled_from(["sandbox/video-keyed", "sandbox/image-lookup", "sandbox/image-blind",
                                                     " sandbox/image-lookup"]), min_size=1, max_size=3, unique=True)),
            "input": {"prompt": draw(st.text(min_size=1, max_size=30).filter(str.strip)),
                      **draw(st.fixed_dictionaries({}, optional={
                          "render_s": st.integers(0, 5) | st.floats(0, 5), "size_bytes": st.integers(1, 10**6),
                          "expected_s": st.floats(0, 5)}))}}
    optional = {
        "policy": st.fixed_dictionaries({}, optional={
            "attempts_per_model": st.integers(1, 10), "window_s": st.integers(1, 86400) | st.floats(1, 86400),
            "deadline_s": st.integers(1, 10**6) | st.floats(1, 10**6), "paid_retries": st.integers(0, 1),
            "fallback_on": st.lists(st.sampled_from(["exhausted", "unavailable", "refused", "window_expired"]),
                                    max_size=4)}),
        "output_key": st.sampled_from(["renders/a.mp4", " renders/b.mp4", "x/y/z.png"]),
        "metadata": st.dictionaries(st.text(max_size=4), _ANY_JSON, max_size=3),
        "priority": st.integers(1, 5),
    }
    body.update(draw(st.fixed_dictionaries({}, optional=optional)))
    return body


@st.composite
def near_valid_bodies(draw):
    """A valid body with one field (or a part of one) replaced by anything the broad strategy draws."""
    body, broad = draw(valid_bodies()), draw(bodies())
    if isinstance(broad, dict) and broad and draw(st.booleans()):
        name = draw(st.sampled_from(sorted(broad)))
        if name == "input" and isinstance(broad["input"], dict) and broad["input"]:
            key = draw(st.sampled_from(sorted(broad["input"])))
            body["input"] = {**body["input"], key: broad["input"][key]}
        else:
            body[name] = broad[name]
    return body


@st.composite
def bodies(draw):
    if draw(st.integers(0, 29)) == 0:
        return draw(_ANY_JSON)
    body = {}
    if draw(st.integers(0, 19)):
        body["kind"] = draw(st.sampled_from(["media"] * 8 + ["report", "", "MEDIA", 1, None]))
    if draw(st.integers(0, 19)):
        body["models"] = draw(st.sampled_from([["sandbox/video-keyed"], ["sandbox/video-keyed", "sandbox/image-lookup"]])
                              if draw(st.integers(0, 2)) else _MODELS)
    if draw(st.integers(0, 19)):
        body["input"] = draw(_input())
    if draw(st.integers(0, 2)) == 0:
        body["policy"] = draw(_policy())
    if draw(st.integers(0, 4)) == 0:
        body["output_key"] = draw(st.sampled_from(["renders/a.mp4", " renders/b.mp4 ", "", "../x", "/abs", "a" * 2000,
                                                   1, None, "a\x00b", "ok.png"]))
    if draw(st.integers(0, 3)) == 0:
        body["metadata"] = draw(st.sampled_from([{}, {"campaign": "spring"}, {"n": 10**400}, {"big": "x" * 17000},
                                                 {"deep": _nest(40)}, [], "x", None, {"a": [1, 2.5, None]}])
                                | st.dictionaries(st.text(max_size=4), _ANY_JSON, max_size=3))
    if draw(st.integers(0, 3)) == 0:
        body["priority"] = draw(st.sampled_from([1, 3, 5, 0, 6, True, 3.0, "3", None]))
    if draw(st.integers(0, 19)) == 0:
        body["webhook_url"] = "not a url"
    if draw(st.integers(0, 29)) == 0:
        body["extra"] = 1
    return body


def _plain(body) -> bool:
    """A body the fast path is meant to take when it is valid: media, no references, webhook_url or deadline_at."""
    return (isinstance(body, dict) and body.get("kind") == "media" and "webhook_url" not in body
            and not (isinstance(body.get("input"), dict) and "references" in body["input"])
            and not (isinstance(body.get("policy"), dict) and "deadline_at" in body["policy"]))


@settings(max_examples=2500, deadline=None, suppress_health_check=list(HealthCheck))
@given(bodies() | valid_bodies() | near_valid_bodies())
def test_the_fast_path_accepts_only_what_the_serializer_accepts_with_the_same_data(body):
    fast = fastcreate.create_data(copy.deepcopy(body))
    slow = serializer_data(copy.deepcopy(body))
    event(f"fast={fast is not None} serializer={slow is not None}")
    if fast is not None:
        assert slow is not None, body
        assert typed(fast) == typed(slow), body
    elif slow is not None:
        # Not sure, yet valid: only bodies it leaves to the serializer on purpose.
        assert not _plain(body), body


@pytest.mark.parametrize("body", [
    media_body(),
    media_body(input={"prompt": " padded ", "render_s": 2.5, "fail_render": "refused", "size_bytes": 10}),
    media_body(models=["sandbox/video-keyed", "sandbox/image-lookup"], metadata={"campaign": "spring"}, priority=5,
               policy={"attempts_per_model": 3, "fallback_on": ["refused", "exhausted", "refused"]}),
    media_body(policy={"attempts_per_model": 2, "paid_retries": 2, "window_s": 30, "deadline_s": 60.5},
               output_key="renders/one.mp4"),
    media_body(models=["replicate/black-forest-labs/flux-dev"], input={"prompt": "x", "anything": {"at": [1, None]}}),
])
def test_plain_media_bodies_take_the_fast_path_with_the_serializers_data(body):
    fast = fastcreate.create_data(copy.deepcopy(body))
    assert fast is not None
    assert typed(fast) == typed(serializer_data(copy.deepcopy(body)))


@pytest.mark.parametrize("body", [
    media_body(webhook_url="https://example.com/hook"),
    media_body(policy={"deadline_at": "2999-01-01T00:00:00Z"}),
    media_body(input={"prompt": "x", "references": [{"output_key": "a.mp4"}]}),
    {"kind": "report", "models": ["sandbox/llm"], "input": {"subject": {"name": "Ada"}}},
    media_body(models=["sandbox/nope"]), media_body(polcy={}), media_body(input={"prompt": "x", "render_s": "2"}),
    media_body(models=["sandbox/video-keyed", "sandbox/video-keyed"]), media_body(priority=True), [], "x", None,
])
def test_what_the_fast_path_is_not_sure_of_is_the_serializers(body):
    assert fastcreate.create_data(body) is None


def test_a_fast_create_and_the_serializers_replay_of_it_are_one_job(api, monkeypatch):
    body = media_body(input={"prompt": " a lighthouse ", "render_s": 2}, policy={"fallback_on": ["refused"]},
                      metadata={"n": 1.0})
    first = api.create(body, key="fast-1")
    assert first.status_code == 201, first.content
    monkeypatch.setattr(fastcreate, "create_data", lambda body: None)  # the serializer alone, as before
    replay = api.create(body, key="fast-1")
    assert replay.status_code == 202, replay.content
    assert replay.json() == first.json()
    other = api.create({**body, "priority": 4}, key="fast-1")
    assert other.status_code == 409 and other.json()["error"]["code"] == "IDEMPOTENCY_CONFLICT"
    assert Job.objects.count() == 1


def test_a_serializer_create_and_the_fast_replay_of_it_are_one_job(api, monkeypatch):
    body = media_body(models=["sandbox/video-keyed", "sandbox/image-lookup"], priority=2, output_key="r/x.mp4")
    with monkeypatch.context() as patched:
        patched.setattr(fastcreate, "create_data", lambda body: None)
        first = api.create(body, key="slow-1")
    assert first.status_code == 201, first.content
    replay = api.create(body, key="slow-1")
    assert replay.status_code == 202, replay.content
    assert replay.json() == first.json()


def test_whatever_goes_wrong_in_the_fast_path_is_left_to_the_serializer(monkeypatch):
    def fails(*args):
        raise RuntimeError("the catalog could not be read")

    monkeypatch.setattr(fastcreate, "input_problems", fails)
    assert fastcreate.create_data(media_body()) is None


def test_the_catalog_is_asked_about_the_input_only_once_every_field_is_valid(monkeypatch):
    asked = []
    monkeypatch.setattr(fastcreate, "input_problems", lambda models, sent: asked.append(models) or {})
    assert fastcreate.create_data(media_body(priority=9)) is None
    assert asked == []  # as the serializer, whose validate() runs only once every field is valid
    assert fastcreate.create_data(media_body(priority=4)) is not None
    assert asked == [["sandbox/video-keyed"]]
