"""The sandbox provider over real HTTP: charges, keys, renders, lookup, cancel, LLM usage, faults, durability.

One supervisor process (`python -m sandbox`) serves the module; every test starts from a reset.
"""

from __future__ import annotations

import hashlib
import math
import os
import socket
import threading
import time
from decimal import ROUND_HALF_UP, Decimal

import pytest
import requests

from tests.support.procs import free_port
from tests.support.sandbox import SandboxPortTaken, SandboxProcess

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def sandbox():
    with SandboxProcess() as process:
        yield process


@pytest.fixture(autouse=True)
def clean(sandbox):
    sandbox.reset()


def submit(sandbox, model, prompt="a lighthouse at dusk", **fields):
    return requests.post(
        f"{sandbox.url}/v1/generations", json={"model": model, "prompt": prompt, **fields}, timeout=10
    )


def get(sandbox, path, **kwargs):
    return requests.get(f"{sandbox.url}{path}", timeout=10, **kwargs)


def wait_until_done(sandbox, gen_id, timeout=5.0):
    deadline = time.monotonic() + timeout
    while True:
        gen = get(sandbox, f"/v1/generations/{gen_id}").json()
        if gen["status"] != "running":
            return gen
        assert time.monotonic() < deadline, f"{gen_id} still running after {timeout}s"
        time.sleep(0.05)


def charges(sandbox):
    return sandbox.ledger()["charges"]


def error_type(response):
    return response.json()["error"]["type"]


# -- catalog and acceptance ------------------------------------------------------------------------


def test_models_endpoint_lists_the_catalog(sandbox):
    models = {m["id"]: m for m in get(sandbox, "/v1/models").json()["data"]}

    assert set(models) == {"video-keyed", "image-lookup", "image-blind", "llm"}
    assert models["video-keyed"]["price_usd"] == "0.400000"
    assert models["video-keyed"]["idempotency_key"] is True and models["video-keyed"]["cancel"] is True
    assert models["image-lookup"]["lookup"] is True and models["image-lookup"]["idempotency_key"] is False
    assert models["image-blind"]["price_usd"] == "0.040000" and models["image-blind"]["lookup"] is False
    assert models["llm"]["price_usd"] is None
    assert models["llm"]["input_per_mtok_usd"] == "3.000000"
    assert models["llm"]["output_per_mtok_usd"] == "15.000000"


@pytest.mark.parametrize(
    "model, price", [("video-keyed", "0.400000"), ("image-lookup", "0.040000"), ("image-blind", "0.040000")]
)
def test_submit_is_accepted_and_charged_with_request_id_and_metadata(sandbox, model, price):
    metadata = {"payonce_job": "job-1", "payonce_attempt": 1, "upstream_key": "payonce-job-1-1", "n": {"x": [1]}}

    response = submit(sandbox, model, request_id="payonce-job-1-1", metadata=metadata, params={"render_s": 5})

    assert response.status_code == 202
    gen = response.json()
    assert gen["id"] == "gen_000001"
    assert gen["status"] == "running"
    assert gen["model"] == model
    assert gen["cost_usd"] == price
    assert gen["request_id"] == "payonce-job-1-1" and gen["metadata"] == metadata
    ledger = sandbox.ledger()
    assert ledger["total_usd"] == price
    [charge] = ledger["charges"]
    assert charge["id"] == "ch_000001"
    assert charge["model"] == model
    assert charge["amount_usd"] == price
    assert charge["request_id"] == "payonce-job-1-1"
    assert charge["metadata"] == metadata
    assert charge["generation_id"] == "gen_000001"


def test_keyed_repeat_returns_the_same_generation_and_charges_once(sandbox):
    body = {"request_id": "payonce-j-1", "params": {"render_s": 5}, "metadata": {"upstream_key": "payonce-j-1"}}

    first = submit(sandbox, "video-keyed", **body)
    second = submit(sandbox, "video-keyed", **body)

    assert first.status_code == second.status_code == 202
    assert first.json()["id"] == second.json()["id"]
    assert second.headers.get("Idempotent-Replayed") == "true"
    assert len(charges(sandbox)) == 1
    assert sandbox.ledger()["total_usd"] == "0.400000"


@pytest.mark.parametrize(
    "change", [{"prompt": "a different prompt"}, {"params": {"render_s": 5, "size_bytes": 10}}]
)
def test_keyed_repeat_with_changed_prompt_or_params_is_409(sandbox, change):
    submit(sandbox, "video-keyed", request_id="k-1", params={"render_s": 5})

    fields = {"prompt": "a lighthouse at dusk", "request_id": "k-1", "params": {"render_s": 5}, **change}
    conflict = requests.post(f"{sandbox.url}/v1/generations", json={"model": "video-keyed", **fields}, timeout=5)

    assert conflict.status_code == 409
    assert error_type(conflict) == "idempotency_conflict"
    assert len(charges(sandbox)) == 1


def test_keyed_concurrent_submits_of_one_key_charge_once(sandbox):
    barrier = threading.Barrier(8)
    ids = []

    def go():
        barrier.wait()
        ids.append(submit(sandbox, "video-keyed", request_id="race-1", params={"render_s": 5}).json()["id"])

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert len(set(ids)) == 1 and len(ids) == 8
    assert len(charges(sandbox)) == 1


@pytest.mark.parametrize("model", ["image-lookup", "image-blind"])
def test_unkeyed_repeat_is_a_second_generation_and_a_second_charge(sandbox, model):
    first = submit(sandbox, model, request_id="same-key", params={"render_s": 5})
    second = submit(sandbox, model, request_id="same-key", params={"render_s": 5})

    assert first.json()["id"] != second.json()["id"]
    ledger = sandbox.ledger()
    assert [c["request_id"] for c in ledger["charges"]] == ["same-key", "same-key"]
    assert ledger["total_usd"] == "0.080000"


def test_keys_are_per_model(sandbox):
    keyed = submit(sandbox, "video-keyed", request_id="k", params={"render_s": 5}).json()
    blind = submit(sandbox, "image-blind", request_id="k", params={"render_s": 5}).json()

    assert keyed["id"] != blind["id"]
    assert len(charges(sandbox)) == 2


# -- renders and media -----------------------------------------------------------------------------


def test_render_runs_for_render_s_then_serves_deterministic_media(sandbox):
    params = {"render_s": 0.4, "size_bytes": 1000}
    started = time.monotonic()
    gen = submit(sandbox, "image-blind", params=params).json()

    assert get(sandbox, f"/v1/generations/{gen['id']}").json()["status"] == "running"
    not_ready = get(sandbox, f"/v1/generations/{gen['id']}/media")
    assert not_ready.status_code == 409 and error_type(not_ready) == "not_ready"

    done = wait_until_done(sandbox, gen["id"])
    assert time.monotonic() - started >= 0.35
    assert done["status"] == "succeeded"
    assert done["completed_at"] is not None and done["error"] is None
    output = done["output"]
    assert output["url"] == f"{sandbox.url}/v1/generations/{gen['id']}/media"
    assert output["content_type"] == "image/png"
    assert output["bytes"] == 1000

    media = requests.get(output["url"], timeout=5)
    assert media.status_code == 200
    assert media.headers["Content-Type"] == "image/png"
    assert len(media.content) == 1000
    assert hashlib.sha256(media.content).hexdigest() == output["sha256"]

    # Same (model, prompt, params): same bytes. Another prompt: other bytes.
    again = wait_until_done(sandbox, submit(sandbox, "image-blind", params=params).json()["id"])
    other = wait_until_done(
        sandbox, submit(sandbox, "image-blind", prompt="another", params=params).json()["id"]
    )
    assert again["output"]["sha256"] == output["sha256"]
    assert other["output"]["sha256"] != output["sha256"]


def test_default_media_size_and_video_content_type(sandbox):
    gen = submit(sandbox, "video-keyed", params={"render_s": 0}).json()

    done = wait_until_done(sandbox, gen["id"])

    assert done["output"]["bytes"] == 4096
    assert done["output"]["content_type"] == "video/mp4"
    assert len(requests.get(done["output"]["url"], timeout=5).content) == 4096


def test_fail_render_param_is_accepted_charged_then_failed(sandbox):
    response = submit(sandbox, "image-blind", params={"render_s": 0.2, "fail_render": "GPU on fire"})

    assert response.status_code == 202 and response.json()["status"] == "running"
    done = wait_until_done(sandbox, response.json()["id"])
    assert done["status"] == "failed"
    assert done["error"]["message"] == "GPU on fire"
    assert done["output"] is None
    assert len(charges(sandbox)) == 1
    assert get(sandbox, f"/v1/generations/{done['id']}/media").status_code == 409


def test_unknown_generation_is_404(sandbox):
    for path in ("/v1/generations/gen_999999", "/v1/generations/gen_999999/media"):
        response = get(sandbox, path)
        assert response.status_code == 404 and error_type(response) == "not_found"


# -- lookup ----------------------------------------------------------------------------------------


def test_lookup_finds_only_lookup_models_and_ands_filters(sandbox):
    first = submit(sandbox, "image-lookup", metadata={"job": "j1", "attempt": 1}, params={"render_s": 5}).json()
    second = submit(sandbox, "image-lookup", metadata={"job": "j1", "attempt": 2}, params={"render_s": 5}).json()
    submit(sandbox, "image-lookup", metadata={"job": "j2", "attempt": 1}, params={"render_s": 5})
    submit(sandbox, "image-blind", metadata={"job": "j1", "attempt": 1}, params={"render_s": 5})
    submit(sandbox, "video-keyed", metadata={"job": "j1", "attempt": 1}, params={"render_s": 5})

    by_job = get(sandbox, "/v1/generations", params={"metadata.job": "j1"})
    both = get(sandbox, "/v1/generations", params={"metadata.job": "j1", "metadata.attempt": "1"})
    with_model = get(sandbox, "/v1/generations", params={"metadata.job": "j1", "model": "image-lookup"})
    nothing = get(sandbox, "/v1/generations", params={"metadata.job": "j1", "metadata.attempt": "3"})

    assert by_job.status_code == 200
    assert [g["id"] for g in by_job.json()["data"]] == [first["id"], second["id"]]
    assert [g["id"] for g in both.json()["data"]] == [first["id"]]
    assert [g["id"] for g in with_model.json()["data"]] == [first["id"], second["id"]]
    assert nothing.json()["data"] == []


def test_lookup_rejects_no_filter_and_non_lookup_models(sandbox):
    no_filter = get(sandbox, "/v1/generations")
    keyed = get(sandbox, "/v1/generations", params={"metadata.job": "j1", "model": "video-keyed"})

    assert no_filter.status_code == 422 and error_type(no_filter) == "invalid_request"
    assert keyed.status_code == 400 and error_type(keyed) == "not_supported"


# -- cancel ----------------------------------------------------------------------------------------


def test_cancel_running_keyed_render_then_cancel_again_is_409(sandbox):
    gen = submit(sandbox, "video-keyed", params={"render_s": 5}).json()

    cancelled = requests.post(f"{sandbox.url}/v1/generations/{gen['id']}/cancel", timeout=5)
    again = requests.post(f"{sandbox.url}/v1/generations/{gen['id']}/cancel", timeout=5)

    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert get(sandbox, f"/v1/generations/{gen['id']}").json()["status"] == "cancelled"
    assert again.status_code == 409 and error_type(again) == "conflict"
    assert "cancelled" in again.json()["error"]["message"]
    assert sandbox.ledger()["total_usd"] == "0.400000"  # cancel does not refund


def test_cancel_finished_render_is_409_and_unsupported_model_is_400(sandbox):
    done = wait_until_done(sandbox, submit(sandbox, "video-keyed", params={"render_s": 0}).json()["id"])
    blind = submit(sandbox, "image-blind", params={"render_s": 5}).json()

    finished = requests.post(f"{sandbox.url}/v1/generations/{done['id']}/cancel", timeout=5)
    unsupported = requests.post(f"{sandbox.url}/v1/generations/{blind['id']}/cancel", timeout=5)
    unknown = requests.post(f"{sandbox.url}/v1/generations/gen_999999/cancel", timeout=5)

    assert finished.status_code == 409 and "succeeded" in finished.json()["error"]["message"]
    assert unsupported.status_code == 400 and error_type(unsupported) == "not_supported"
    assert get(sandbox, f"/v1/generations/{blind['id']}").json()["status"] == "running"
    assert unknown.status_code == 404


# -- llm -------------------------------------------------------------------------------------------


def expected_llm_cost(input_tokens, output_tokens):
    amount = (Decimal(input_tokens) * 3 + Decimal(output_tokens) * 15) / Decimal(1_000_000)
    return str(amount.quantize(Decimal("0.000001"), rounding=ROUND_HALF_UP))


def test_llm_usage_and_charge_arithmetic(sandbox):
    system = "You write chapters." * 7
    messages = [
        {"role": "user", "content": "Write chapter one about lighthouses"},
        {"role": "assistant", "content": "Sure."},
        {"role": "user", "content": "Now chapter two, please, with more detail on the keepers"},
    ]
    body = {"model": "llm", "system": system, "messages": messages, "max_tokens": 4000,
            "metadata": {"payonce_job": "r1"}, "request_id": "payonce-r1-1"}

    response = requests.post(f"{sandbox.url}/v1/messages", json=body, timeout=5)

    assert response.status_code == 200
    reply = response.json()
    assert reply["id"] == "msg_000001" and reply["type"] == "message" and reply["model"] == "llm"
    text = reply["content"][0]["text"]
    assert text.startswith("Sandbox answer to: " + messages[-1]["content"][:80])
    assert reply["stop_reason"] == "end_turn"
    chars = len(system) + sum(len(m["content"]) for m in messages)
    assert reply["usage"]["input_tokens"] == math.ceil(chars / 4)
    assert reply["usage"]["output_tokens"] == math.ceil(len(text) / 4)
    assert 150 <= reply["usage"]["output_tokens"] <= 250
    [charge] = charges(sandbox)
    assert charge["amount_usd"] == expected_llm_cost(reply["usage"]["input_tokens"], reply["usage"]["output_tokens"])
    assert charge["request_id"] == "payonce-r1-1" and charge["metadata"] == {"payonce_job": "r1"}
    assert charge["generation_id"] == "msg_000001" and charge["model"] == "llm"

    # Deterministic text; request_id is not honoured, so the repeat is charged again.
    repeat = requests.post(f"{sandbox.url}/v1/messages", json=body, timeout=5).json()
    assert repeat["content"][0]["text"] == text
    assert len(charges(sandbox)) == 2


def test_llm_max_tokens_truncates_output(sandbox):
    body = {"model": "llm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}

    reply = requests.post(f"{sandbox.url}/v1/messages", json=body, timeout=5).json()

    assert reply["stop_reason"] == "max_tokens"
    assert reply["usage"] == {"input_tokens": 1, "output_tokens": 10, "cache_creation_input_tokens": 0,
                              "cache_read_input_tokens": 0}
    assert len(reply["content"][0]["text"]) == 40
    assert charges(sandbox)[0]["amount_usd"] == "0.000153"  # (1*3 + 10*15) / 1e6


def _cached_call(sandbox, prefix: str, tail: str = "Write the chapter.", marked: bool = True) -> dict:
    shared = {"type": "text", "text": prefix, **({"cache_control": {"type": "ephemeral"}} if marked else {})}
    body = {"model": "llm", "system": "Be brief.", "max_tokens": 10,
            "messages": [{"role": "user", "content": [shared, {"type": "text", "text": tail}]}]}
    answer = requests.post(f"{sandbox.url}/v1/messages", json=body, timeout=5)
    assert answer.status_code == 200, answer.text
    return answer.json()["usage"]


def test_llm_prompt_cache_writes_a_marked_prefix_once_then_reads_it_and_charges_each_at_its_price(sandbox):
    prefix = "x" * 4_400  # with "Be brief." (9 characters): 4,409 characters, 1,103 tokens
    first = _cached_call(sandbox, prefix, "Write the chapter sun.")
    second = _cached_call(sandbox, prefix, "Write the chapter moon.")
    assert (first["cache_creation_input_tokens"], first["cache_read_input_tokens"]) == (1103, 0)
    assert (second["cache_creation_input_tokens"], second["cache_read_input_tokens"]) == (0, 1103)
    # The rest of the prompt (ceil(4,431 / 4) = 1,108 tokens in all) is plain input.
    assert first["input_tokens"] == second["input_tokens"] == 1108 - 1103
    [write, read] = [c["amount_usd"] for c in charges(sandbox)]
    assert write == "0.004301"  # (5 * 3 + 1,103 * 3.75 + 10 * 15) / 1e6 = 0.00430125
    assert read == "0.000496"  # (5 * 3 + 1,103 * 0.30 + 10 * 15) / 1e6 = 0.0004959
    other = _cached_call(sandbox, "y" * 4_400)  # another prefix: its own entry
    assert other["cache_creation_input_tokens"] == 1103


def test_llm_prompt_cache_ignores_a_short_or_unmarked_prefix_and_expires(sandbox):
    assert _cached_call(sandbox, "x" * 4_000)["cache_creation_input_tokens"] == 0  # 1,003 tokens: under 1,024
    unmarked = _cached_call(sandbox, "x" * 4_400, marked=False)
    assert (unmarked["cache_creation_input_tokens"], unmarked["cache_read_input_tokens"]) == (0, 0)
    assert requests.post(f"{sandbox.url}/control/cache", json={"ttl_s": 0.3}, timeout=5).json() == {"ttl_s": 0.3}
    assert _cached_call(sandbox, "x" * 4_400)["cache_creation_input_tokens"] == 1103
    time.sleep(0.5)
    assert _cached_call(sandbox, "x" * 4_400)["cache_creation_input_tokens"] == 1103  # expired: written again
    assert requests.post(f"{sandbox.url}/control/cache", json={"ttl_s": 0}, timeout=5).status_code == 422
    bad = {"model": "llm", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi", "cache_control": {"type": "forever"}}]}]}
    assert requests.post(f"{sandbox.url}/v1/messages", json=bad, timeout=5).status_code == 422


def test_llm_validation(sandbox):
    def post(body):
        return requests.post(f"{sandbox.url}/v1/messages", json=body, timeout=5)

    ok_messages = [{"role": "user", "content": "hi"}]
    assert post({"model": "llm", "messages": ok_messages}).status_code == 422  # no max_tokens
    assert post({"model": "llm", "messages": [], "max_tokens": 5}).status_code == 422
    assert post({"model": "llm", "messages": [{"role": "bot", "content": "x"}], "max_tokens": 5}).status_code == 422
    assert post({"model": "video-keyed", "messages": ok_messages, "max_tokens": 5}).status_code == 422
    assert error_type(post({"model": "nope", "messages": ok_messages, "max_tokens": 5})) == "model_not_found"
    assert charges(sandbox) == []


# -- validation and routing ------------------------------------------------------------------------


def test_submit_validation_errors_charge_nothing(sandbox):
    url = f"{sandbox.url}/v1/generations"
    malformed = requests.post(url, data=b"{not json", headers={"Content-Type": "application/json"}, timeout=5)
    no_prompt = requests.post(url, json={"model": "image-blind"}, timeout=5)
    empty_prompt = submit(sandbox, "image-blind", prompt="")
    bad_params = submit(sandbox, "image-blind", params=[1])
    bad_metadata = submit(sandbox, "image-blind", metadata="x")
    bad_request_id = submit(sandbox, "video-keyed", request_id=7)
    bad_render = submit(sandbox, "image-blind", params={"render_s": -1})
    unknown_model = submit(sandbox, "no-such-model")
    llm_here = submit(sandbox, "llm")

    assert malformed.status_code == 400 and error_type(malformed) == "invalid_json"
    for response in (no_prompt, empty_prompt, bad_params, bad_metadata, bad_request_id, bad_render, llm_here):
        assert response.status_code == 422 and error_type(response) == "invalid_request", response.text
    assert unknown_model.status_code == 404 and error_type(unknown_model) == "model_not_found"
    assert charges(sandbox) == []


def test_unknown_path_is_404_and_wrong_method_is_405(sandbox):
    missing = get(sandbox, "/v2/nothing")
    wrong = requests.delete(f"{sandbox.url}/v1/generations", timeout=5)

    assert missing.status_code == 404 and error_type(missing) == "not_found"
    assert wrong.status_code == 405


# -- faults ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fault, status, type_",
    [
        ({"action": "status_429", "seconds": 3}, 429, "rate_limited"),
        ({"action": "status_500"}, 500, "server_error"),
        ({"action": "status_503", "seconds": 2}, 503, "unavailable"),
        ({"action": "status_422"}, 422, "invalid_request"),
        ({"action": "status_401"}, 401, "authentication_error"),
        ({"action": "refuse"}, 400, "content_refused"),
    ],
)
def test_error_faults_answer_their_status_and_charge_nothing(sandbox, fault, status, type_):
    sandbox.faults([{"model": "video-keyed", **fault}])

    response = submit(sandbox, "video-keyed", request_id="k-1", params={"render_s": 5})

    assert response.status_code == status
    assert error_type(response) == type_
    assert response.json()["error"]["message"]
    if "seconds" in fault:
        assert response.headers["Retry-After"] == str(fault["seconds"])
    assert charges(sandbox) == []
    assert sandbox.pending_faults() == []
    # The fault was used up: the same call now goes through and is charged once.
    retry = submit(sandbox, "video-keyed", request_id="k-1", params={"render_s": 5})
    assert retry.status_code == 202
    assert len(charges(sandbox)) == 1
    assert [(c["fault"], c["status"]) for c in sandbox.calls()] == [(fault["action"], status), (None, 202)]


def test_fault_defaults_429_retry_after_1_and_messages(sandbox):
    sandbox.faults([
        {"model": "*", "action": "status_429"},
        {"model": "*", "action": "status_422"},
        {"model": "*", "action": "refuse", "message": "no lighthouses"},
    ])

    rate_limited = submit(sandbox, "image-blind")
    invalid = submit(sandbox, "image-blind")
    refused = submit(sandbox, "image-blind")

    assert rate_limited.headers["Retry-After"] == "1"
    assert "duration_secs" in invalid.json()["error"]["message"]
    assert refused.json()["error"]["message"] == "no lighthouses"


def test_delay_fault_answers_late_but_normally(sandbox):
    sandbox.faults([{"model": "image-blind", "action": "delay", "seconds": 0.5}])

    started = time.monotonic()
    response = submit(sandbox, "image-blind", params={"render_s": 5})
    elapsed = time.monotonic() - started

    assert elapsed >= 0.5
    assert response.status_code == 202
    assert len(charges(sandbox)) == 1


def test_accept_then_drop_charges_but_the_client_sees_a_connection_error(sandbox):
    sandbox.faults([{"model": "video-keyed", "action": "accept_then_drop"}])

    with pytest.raises(requests.ConnectionError):
        submit(sandbox, "video-keyed", request_id="payonce-j-1", params={"render_s": 5})

    [charge] = charges(sandbox)
    assert charge["request_id"] == "payonce-j-1"
    [call] = sandbox.calls()
    assert call["fault"] == "accept_then_drop" and call["status"] is None
    assert call["generation_id"] == charge["generation_id"]
    # The retry under the same key finds the render it already paid for.
    retry = submit(sandbox, "video-keyed", request_id="payonce-j-1", params={"render_s": 5})
    assert retry.status_code == 202 and retry.json()["id"] == charge["generation_id"]
    assert len(charges(sandbox)) == 1


def test_crash_after_accept_restarts_with_its_ledger(sandbox):
    earlier = submit(sandbox, "image-blind", params={"render_s": 5}).json()
    pid_before = sandbox.health()["pid"]
    sandbox.faults([{"model": "video-keyed", "action": "crash_after_accept"}])

    with pytest.raises(requests.ConnectionError):
        submit(sandbox, "video-keyed", request_id="payonce-j-2", params={"render_s": 5})

    health = sandbox.wait_healthy(timeout=10)
    assert health["pid"] != pid_before
    ledger = sandbox.ledger()
    assert [c["generation_id"] for c in ledger["charges"]] == [earlier["id"], "gen_000002"]
    assert ledger["charges"][1]["request_id"] == "payonce-j-2"
    assert ledger["total_usd"] == "0.440000"
    # The fault was consumed before the crash, the call log survived, and keys and ids carry on.
    assert sandbox.pending_faults() == []
    assert [(c["fault"], c["status"]) for c in sandbox.calls()] == [(None, 202), ("crash_after_accept", None)]
    retry = submit(sandbox, "video-keyed", request_id="payonce-j-2", params={"render_s": 5})
    assert retry.status_code == 202 and retry.json()["id"] == "gen_000002"
    assert submit(sandbox, "image-blind", params={"render_s": 5}).json()["id"] == "gen_000003"
    assert len(charges(sandbox)) == 3


def test_crashes_it_was_told_to_make_never_make_the_supervisor_give_up(sandbox):
    # The storm once injected five crashes that each came within a second of the last restart: the
    # supervisor took them for a server that cannot start (a taken port) and gave up for good.
    sandbox.faults([{"model": "video-keyed", "action": "crash_after_accept", "times": 7}])
    for n in range(7):
        sandbox.wait_healthy(timeout=10)
        with pytest.raises(requests.ConnectionError):
            submit(sandbox, "video-keyed", request_id=f"payonce-crash-{n}", params={"render_s": 5})
    sandbox.wait_healthy(timeout=10)
    assert sandbox.proc.poll() is None  # the supervisor is still there
    assert len(charges(sandbox)) == 7


def test_fail_render_fault_accepts_charges_then_fails(sandbox):
    sandbox.faults([{"model": "image-lookup", "action": "fail_render", "message": "NSFW output filtered"}])

    response = submit(sandbox, "image-lookup", params={"render_s": 0.1})

    assert response.status_code == 202
    done = wait_until_done(sandbox, response.json()["id"])
    assert done["status"] == "failed" and done["error"]["message"] == "NSFW output filtered"
    assert len(charges(sandbox)) == 1


def test_faults_added_first_go_before_the_pending_ones(sandbox):
    sandbox.faults([{"model": "*", "action": "status_429", "times": 2}])
    pending = sandbox.faults([{"model": "*", "action": "status_503"}], first=True)
    assert [f["action"] for f in pending] == ["status_503", "status_429"]
    assert submit(sandbox, "video-keyed", params={"render_s": 5}).status_code == 503  # the one added first
    assert submit(sandbox, "video-keyed", params={"render_s": 5}).status_code == 429
    assert requests.post(f"{sandbox.url}/control/faults", json={"faults": [], "first": "yes"},
                         timeout=5).status_code == 422


def test_faults_are_consumed_in_order_by_matching_calls_only(sandbox):
    pending = sandbox.faults([
        {"model": "image-blind", "action": "status_500"},
        {"model": "*", "action": "status_429", "times": 2},
        {"model": "*", "action": "status_503", "on": "poll"},
    ])
    assert [(f["action"], f["times"]) for f in pending] == [("status_500", 1), ("status_429", 2), ("status_503", 1)]

    # video-keyed skips the image-blind fault and takes the first `*` submit fault.
    assert submit(sandbox, "video-keyed", params={"render_s": 5}).status_code == 429
    assert [f["times"] for f in sandbox.pending_faults()] == [1, 1, 1]
    assert submit(sandbox, "image-blind", params={"render_s": 5}).status_code == 500
    assert submit(sandbox, "image-blind", params={"render_s": 5}).status_code == 429
    accepted = submit(sandbox, "image-blind", params={"render_s": 5})
    assert accepted.status_code == 202
    # The poll fault waited for a poll.
    assert get(sandbox, f"/v1/generations/{accepted.json()['id']}").status_code == 503
    assert get(sandbox, f"/v1/generations/{accepted.json()['id']}").status_code == 200
    assert sandbox.pending_faults() == []
    assert len(charges(sandbox)) == 1


def test_bad_fault_shape_is_422(sandbox):
    for fault in ({"model": "*", "action": "explode"}, {"model": "*", "action": "delay", "times": 0},
                  {"model": "nope", "action": "delay"}, {"model": "*", "action": "delay", "on": "never"}):
        response = requests.post(f"{sandbox.url}/control/faults", json={"faults": [fault]}, timeout=5)
        assert response.status_code == 422, fault
    assert requests.post(f"{sandbox.url}/control/faults", json={"x": 1}, timeout=5).status_code == 422
    assert sandbox.pending_faults() == []


# -- call log, reset, inputs -----------------------------------------------------------------------


def test_call_log_records_request_id_metadata_and_status(sandbox):
    submit(sandbox, "video-keyed", request_id="payonce-j-1", metadata={"a": 1}, params={"render_s": 5})
    submit(sandbox, "video-keyed", request_id="payonce-j-1", metadata={"a": 1}, params={"render_s": 5})
    submit(sandbox, "video-keyed", request_id="payonce-j-1", prompt="changed", params={"render_s": 5})
    submit(sandbox, "image-blind", prompt="")
    get(sandbox, "/v1/generations/gen_000001")

    calls = sandbox.calls()

    assert [c["seq"] for c in calls] == [1, 2, 3, 4, 5]
    assert [(c["method"], c["path"], c["status"]) for c in calls] == [
        ("POST", "/v1/generations", 202),
        ("POST", "/v1/generations", 202),
        ("POST", "/v1/generations", 409),
        ("POST", "/v1/generations", 422),
        ("GET", "/v1/generations/gen_000001", 200),
    ]
    assert [c["request_id"] for c in calls[:3]] == ["payonce-j-1"] * 3
    assert calls[0]["metadata"] == {"a": 1} and calls[0]["model"] == "video-keyed"
    assert calls[4]["model"] == "video-keyed" and calls[4]["generation_id"] == "gen_000001"
    assert all(c["fault"] is None for c in calls)


def test_reset_empties_ledger_calls_faults_and_counters(sandbox):
    submit(sandbox, "image-blind", params={"render_s": 5})
    sandbox.faults([{"model": "*", "action": "status_500", "times": 3}])

    sandbox.reset()

    assert sandbox.ledger() == {"charges": [], "total_usd": "0.000000"}
    assert sandbox.calls() == []
    assert sandbox.pending_faults() == []
    assert get(sandbox, "/v1/generations/gen_000001").status_code == 404
    assert submit(sandbox, "image-blind", params={"render_s": 5}).json()["id"] == "gen_000001"


@pytest.mark.parametrize("model, send", [
    ("video-keyed", lambda sandbox: submit(sandbox, "video-keyed", request_id="payonce-held-1", params={"render_s": 5})),
    ("llm", lambda sandbox: requests.post(f"{sandbox.url}/v1/messages", timeout=10, json={
        "model": "llm", "max_tokens": 64, "messages": [{"role": "user", "content": "held"}]})),
])
def test_a_call_held_across_a_reset_charges_nothing_after_it(sandbox, model, send):
    # A test's call held by the provider (or a timed-out call of a test that has ended) must not charge into
    # the next test's ledger, nor give its status to the new call that takes its sequence number.
    sandbox.faults([{"model": model, "action": "delay", "seconds": 1}])
    answers = []
    held = threading.Thread(target=lambda: answers.append(send(sandbox)))
    held.start()
    deadline = time.monotonic() + 5
    while not sandbox.calls():
        assert time.monotonic() < deadline, "the call never reached the sandbox"
        time.sleep(0.02)

    sandbox.reset()
    fresh = submit(sandbox, "image-blind", params={"render_s": 5})  # the new state's call number 1
    held.join(timeout=10)

    assert answers[0].status_code == 503 and "reset" in answers[0].json()["error"]["message"]
    [charge] = charges(sandbox)
    assert charge["generation_id"] == fresh.json()["id"]
    [call] = sandbox.calls()
    assert (call["model"], call["status"]) == ("image-blind", 202)


def test_input_upload_is_stored_and_free(sandbox):
    data = os.urandom(3000)

    response = requests.post(f"{sandbox.url}/v1/inputs", data=data, headers={"Content-Type": "image/jpeg"}, timeout=5)

    assert response.status_code == 201
    record = response.json()
    assert record["id"] == "inp_000001"
    assert record["bytes"] == 3000
    assert record["sha256"] == hashlib.sha256(data).hexdigest()
    assert record["content_type"] == "image/jpeg"
    assert get(sandbox, "/v1/inputs/inp_000001").json()["sha256"] == record["sha256"]
    assert get(sandbox, "/v1/inputs/inp_000001/content").content == data
    assert get(sandbox, "/v1/inputs/inp_999999").status_code == 404
    assert charges(sandbox) == []
    assert sandbox.calls()[0]["kind"] == "upload" and sandbox.calls()[0]["status"] == 201


def test_upload_faults_match_only_star(sandbox):
    sandbox.faults([{"model": "video-keyed", "action": "status_503", "on": "upload"},
                    {"model": "*", "action": "status_500", "on": "upload"}])

    response = requests.post(f"{sandbox.url}/v1/inputs", data=b"x", timeout=5)

    assert response.status_code == 500
    assert [f["model"] for f in sandbox.pending_faults()] == ["video-keyed"]


# -- the supervisor --------------------------------------------------------------------------------


def test_sigterm_stops_cleanly_and_a_restart_keeps_the_ledger():
    with SandboxProcess() as first:
        server_pid = first.health()["pid"]
        submit(first, "video-keyed", request_id="k-1", params={"render_s": 5})

        assert first.stop() == 0
        with pytest.raises(ProcessLookupError):
            os.kill(server_pid, 0)  # the supervisor took its server down with it

        with SandboxProcess(state_dir=first.state_dir) as second:
            assert [c["request_id"] for c in second.ledger()["charges"]] == ["k-1"]
            assert second.health()["pid"] != server_pid


def test_supervisor_gives_up_when_the_port_is_taken():
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))  # bound, not listening: the server can't bind, probes are refused
        process = SandboxProcess(port=port)
        try:
            with pytest.raises(RuntimeError, match="giving up"):
                process.start(timeout=15)
            assert process.proc.returncode not in (0, None)
        finally:
            process.stop()
            process.cleanup()


def test_a_second_sandbox_given_a_taken_port_says_so_instead_of_sharing_the_first_ones_ledger():
    # The suite's session sandbox depends on this (tests/conftest.py): two test workers on one port would
    # read and reset each other's ledger.
    with SandboxProcess() as first:
        second = SandboxProcess(port=first.port)
        try:
            with pytest.raises(SandboxPortTaken, match=f"answers on port {first.port}"):
                second.start()
        finally:
            second.stop()
            second.cleanup()
        assert first.health()["ok"] is True
