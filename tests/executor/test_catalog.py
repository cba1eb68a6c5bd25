"""Models from configuration (executor.registry, billing.rates): the code's models, then a models file's,
then the admin's Models page, each over the one before, with their prices; no release, no restart."""

import json
import logging
import subprocess
import sys
import time
from decimal import Decimal as D

import pytest

from billing import rates
from billing.models import ModelPrice
from executor import registry
from executor.models import ModelConfig
from executor.providers import ADAPTERS
from executor.registry import PAYONCE_INPUT_KEYS
from tests.conftest import media_body
from tests.support.waiting import wait_for
from tests.support.books import assert_books_balance
from tests.support.engine import media_job
from tests.support.procs import REPO_ROOT, process_env

SCHNELL = "fal/fal-ai/flux/schnell"  # a fal model the code does not name
SCHNELL_ENTRY = {
    "name": SCHNELL, "provider": "fal", "kind": "image", "content_type": "image/jpeg",
    "params": [{"name": "image_size", "type": "string", "choices": ["square", "landscape_4_3"]},
               {"name": "num_inference_steps", "type": "integer", "minimum": 1, "maximum": 12}],
    "price": {"per_unit": "0.003", "unit": "image"},
}


@pytest.fixture
def models_file(tmp_path, fresh_catalog):
    path = tmp_path / "models.json"

    def write(*entries):
        path.write_text(json.dumps({"models": list(entries)}))
        fresh_catalog.MODELS_FILE = str(path)
        registry.forget_models()
        rates.forget_overrides()
        return path

    return write


def test_the_code_knows_its_models_and_no_others(fresh_catalog, db):
    assert registry.model_spec("sandbox/video-keyed").capabilities.idempotency_key
    assert registry.model_spec("fal/fal-ai/flux/dev").params is not None
    assert registry.model_spec("openai-images/gpt-image-1").kind == "image"
    assert registry.model_spec(SCHNELL) is None
    assert not rates.rate_for(SCHNELL).known


def test_a_models_file_adds_a_model_with_its_capabilities_parameters_and_price(models_file, db):
    models_file({**SCHNELL_ENTRY, "capabilities": {"key_ttl_s": 3600, "unpaid_statuses": [429, 503]}})
    spec = registry.model_spec(SCHNELL)
    assert (spec.provider, spec.model, spec.kind, spec.content_type, spec.extension) == (
        "fal", "fal-ai/flux/schnell", "image", "image/jpeg", "jpg")
    assert spec.capabilities.key_ttl_s == 3600 and spec.capabilities.unpaid_statuses == frozenset({429, 503})
    assert spec.capabilities.cancel  # the rest is fal's own
    assert registry.input_problems([SCHNELL], {"prompt": "p", "image_size": "square"}) == {}
    assert registry.input_problems([SCHNELL], {"prompt": "p", "image_size": "huge"}) == {
        "image_size": ["Must be one of: square, landscape_4_3."]}
    assert "Not a parameter" in registry.input_problems([SCHNELL], {"seed": 1})["seed"][0]
    assert rates.worst_case(SCHNELL, params={}) == D("0.003000")
    assert rates.cost_of(SCHNELL, {"units": 1.2}) == D("0.003000")


def test_a_models_file_overrides_a_code_model_field_by_field_and_can_disable_one(models_file, db):
    models_file({"name": "sandbox/video-keyed", "capabilities": {"key_ttl_s": 60}, "price": {"per_unit": "0.5",
                                                                                             "unit": "render"}},
                {"name": "sandbox/image-blind", "enabled": False})
    spec = registry.model_spec("sandbox/video-keyed")
    assert spec.capabilities.key_ttl_s == 60 and spec.capabilities.idempotency_key  # the rest stays the code's
    assert spec.params == registry.code_spec("sandbox/video-keyed").params
    assert rates.worst_case("sandbox/video-keyed") == D("0.500000")
    assert registry.model_spec("sandbox/image-blind") is None


def test_a_changed_models_file_is_read_again_without_a_restart(models_file, db, settings):
    settings.MODELS_CACHE_S = 0
    path = models_file(SCHNELL_ENTRY)
    assert registry.model_spec(SCHNELL) is not None
    time.sleep(0.01)  # a new modification time
    path.write_text(json.dumps({"models": [{**SCHNELL_ENTRY, "enabled": False}]}))
    assert registry.model_spec(SCHNELL) is None


@pytest.mark.parametrize("entry, named", [
    ({"name": "nobody/some-model", "provider": "nobody", "kind": "image"}, "no adapter for provider 'nobody'"),
    ({"name": SCHNELL, "provider": "fal"}, "kind must be one of"),
    ({**SCHNELL_ENTRY, "capabilities": {"idempotent": True}}, "unknown capabilities: idempotent"),
    ({**SCHNELL_ENTRY, "capabilities": {"unpaid_statuses": [200]}}, "unpaid_statuses is a list of HTTP statuses"),
    ({**SCHNELL_ENTRY, "params": [{"name": "size", "type": "float"}]}, "type is number, integer or string"),
    ({**SCHNELL_ENTRY, "params": [{"name": "prompt", "type": "string"}]}, "payonce's own keys"),
    ({**SCHNELL_ENTRY, "params": [{"name": "model", "type": "string"}]},
     "model is a field payonce sets in every fal request, never a parameter"),
    ({**SCHNELL_ENTRY, "price": {"per_unit": "-1"}}, "not negative"),
    ({**SCHNELL_ENTRY, "price": {"input": "1"}}, "both input and output"),
])
@pytest.mark.e2e
def test_a_wrong_models_file_refuses_to_start_naming_the_model_and_the_problem(tmp_path, entry, named):
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": [entry]}))
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=REPO_ROOT, env=process_env(MODELS_FILE=str(path)),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert entry["name"] in done.stderr and named in done.stderr, done.stderr[-2000:]


def test_the_admin_refuses_a_wrong_model_where_it_is_written(admin_client, fresh_catalog):
    answer = admin_client.post("/admin/executor/modelconfig/add/", {
        "name": SCHNELL, "enabled": "on", "provider": "fal", "kind": "image",
        "params": json.dumps([{"name": "image_size", "type": "enum"}])})
    assert answer.status_code == 200 and "type is number, integer or string" in answer.content.decode()
    answer = admin_client.post("/admin/executor/modelconfig/add/", {
        "name": SCHNELL, "enabled": "on", "provider": "fal", "kind": "image", "price_override": "on",
        "variants": json.dumps({"by": ["image_size"], "prices": {"square,extra": "0.01"}})})
    assert answer.status_code == 200 and "does not name a value for each of image_size" in answer.content.decode()
    assert not ModelConfig.objects.exists() and not ModelPrice.objects.exists()


@pytest.mark.parametrize(("provider", "field"), [(provider, field) for provider, adapter in ADAPTERS.items()
                                                  for field in adapter.own_fields if field not in PAYONCE_INPUT_KEYS])
def test_an_entry_declaring_a_parameter_named_like_a_field_payonce_sets_is_refused_naming_both(provider, field):
    name = f"{provider}/a-model"
    kind = "image" if callable(getattr(ADAPTERS[provider], "submit", None)) else "text"  # what its adapter makes
    entry = {"provider": provider, "kind": kind, "params": [{"name": "seed", "type": "integer"},
                                                           {"name": field, "type": "string"}]}
    with pytest.raises(ValueError) as refused:
        registry.spec_from(name, entry, None)
    assert str(refused.value) == (
        f"{name}: {field} is a field payonce sets in every {provider} request, never a parameter")


def test_the_admin_refuses_a_parameter_named_model_where_it_is_written(admin_client, fresh_catalog):
    answer = admin_client.post("/admin/executor/modelconfig/add/", {
        "name": "openai-images/gpt-image-1-mini", "enabled": "on",
        "params": json.dumps([{"name": "quality", "type": "string"}, {"name": "model", "type": "string"}])})

    assert answer.status_code == 200
    assert ("openai-images/gpt-image-1-mini: model is a field payonce sets in every openai-images request, never a "
            "parameter") in answer.content.decode()
    assert not ModelConfig.objects.exists()


@pytest.mark.e2e
def test_a_model_added_in_the_admin_is_usable_by_the_next_job_priced_and_its_parameters_checked(
        jobs_worker, ledger, api, admin_client, fresh_catalog):
    # Before: nobody knows the model, so a job naming it is refused at submit.
    body = media_body(models=[SCHNELL], input={"prompt": "a lighthouse at dusk", "image_size": "square"})
    refused = api.create(body)
    assert refused.status_code == 422 and "models" in refused.json()["error"]["fields"], refused.json()

    added = admin_client.post("/admin/executor/modelconfig/add/", {
        "name": SCHNELL, "enabled": "on", "provider": "fal", "kind": "image", "content_type": "image/jpeg",
        "params": json.dumps(SCHNELL_ENTRY["params"]), "price_override": "on", "per_unit_usd": "0.003",
        "unit": "image", "price_reason": "fal's published price"})
    assert added.status_code == 302, added.content.decode()[:3000]
    # Every process reads a name it did not know again within MISS_RELOAD_S (the worker, started before the
    # model existed, among them): no restart.
    time.sleep(max(registry.MISS_RELOAD_S, rates.MISS_RELOAD_S))

    wrong = api.create({**body, "input": {"prompt": "x", "image_size": "huge"}})
    assert wrong.status_code == 422 and wrong.json()["error"]["fields"]["input"] == {
        "image_size": ["Must be one of: square, landscape_4_3."]}

    response = api.create(body, key="admin-added")
    assert response.status_code == 201, response.content
    job, _ = wait_for(api, response.json()["id"], {"succeeded", "failed", "waiting"})
    assert job["status"] == "succeeded", job
    [attempt] = job["attempts"]
    assert (attempt["provider"], attempt["model"], attempt["state"]) == ("fal", "fal-ai/flux/schnell", "succeeded")
    assert attempt["cost_usd"] == "0.003000" and attempt["cost_source"] == "derived", attempt  # priced, not unpriced
    assert ledger.calls() == []  # recorded answers (REAL_PROVIDERS off): the sandbox was not involved


# --- one validator, wherever a model is written (issue 37, finding 3) ---------------------------------------

KEYED = "sandbox/video-keyed"


@pytest.mark.parametrize("entry, named", [
    ({"name": KEYED, "enabled": "false"}, "enabled: true or false"),
    ({"name": KEYED, "enable": False}, "unknown fields: enable"),
    ({**SCHNELL_ENTRY, "params": [{"name": "steps", "type": "integer", "minimum": "abc"}]}, "minimum is a number"),
    ({**SCHNELL_ENTRY, "params": [{"name": "steps", "type": "integer", "minimum": True}]}, "minimum is a number"),
    ({**SCHNELL_ENTRY, "params": [{"name": "steps", "type": "integer", "minimum": 5, "maximum": 1}]},
     "minimum is above maximum"),
    ({**SCHNELL_ENTRY, "params": [{"name": "size", "type": "string", "choices": ["a", 1]}]}, "choices is a list of string"),
    ({**SCHNELL_ENTRY, "params": [{"name": "a", "type": "string"}, {"name": "a", "type": "string"}]}, "declared twice"),
    ({**SCHNELL_ENTRY, "params": [{"name": "a", "type": "string", "nullable": "yes"}]}, "nullable is true or false"),
    ({**SCHNELL_ENTRY, "price": {"per_unit": "1e30", "unit": "image"}}, "more than an amount can be"),
    ({**SCHNELL_ENTRY, "price": {"per_unit": 1e30, "unit": "image"}}, "more than an amount can be"),
    ({**SCHNELL_ENTRY, "price": {"per_unit": "0.0000001", "unit": "image"}}, "more than 6 decimal places"),
    ({**SCHNELL_ENTRY, "price": {"variants": {"by": ["image_size"], "prices": {"square": "1e30"}}}},
     "more than an amount can be"),
    ({**SCHNELL_ENTRY, "price": {"per_unit": True, "unit": "image"}}, "is not an amount"),
    ({"name": KEYED, "price": {"free": "false"}}, "free: true or false"),
    ({"name": KEYED, "price": {"input": "3", "output": "15"}}, "a media model is priced per unit"),
    ({"name": "sandbox/llm", "price": {"per_unit": "0.01", "unit": "render"}}, "a text model is priced by tokens"),
    ({"name": KEYED, "kind": "text"}, "kind: sandbox/video-keyed makes video"),
    ({"name": "fal/fal-ai/flux/dev", "kind": "text"}, "makes image, not text"),
    ({**SCHNELL_ENTRY, "kind": "text"}, "provider fal makes no text"),
    ({"name": "anthropic/other-model", "provider": "anthropic", "kind": "video"}, "provider anthropic makes no video"),
    ({**SCHNELL_ENTRY, "capabilities": {"window_s": 1e12}}, "window_s is a number of seconds"),
    ({**SCHNELL_ENTRY, "capabilities": {"unpaid_statuses": [True]}}, "unpaid_statuses is a list of HTTP statuses"),
])
def test_a_wrong_entry_is_refused_naming_the_model_and_the_field(tmp_path, entry, named):
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": [entry]}))
    with pytest.raises(registry.ModelsFileInvalid) as refused:
        registry.read_models_file(str(path))
    [problem] = refused.value.problems
    assert f"model {entry['name']}:" in problem and named in problem, problem


@pytest.mark.parametrize("text, named", [
    ('{"models": [{"name": "fal/fal-ai/flux/schnell", "provider": "fal", "kind": "image", '
     '"capabilities": {"window_s": NaN}}]}', "NaN is not JSON"),
    ('{"models": [{"name": "sandbox/video-keyed", "capabilities": {"key_ttl_s": Infinity}}]}', "Infinity is not JSON"),
    ('{"models": [{"name": "sandbox/image-blind", "enabled": false}, {"name": "sandbox/image-blind"}]}',
     "model sandbox/image-blind: named twice"),
    ('{"models": [], "modles": []}', 'the models file is {"models"'),
])
def test_a_wrong_file_is_refused_whole(tmp_path, text, named):
    path = tmp_path / "models.json"
    path.write_text(text)
    with pytest.raises(registry.ModelsFileInvalid) as refused:
        registry.read_models_file(str(path))
    assert named in str(refused.value), refused.value.problems


def test_the_codes_own_models_and_prices_pass_the_operators_validator():
    # One validator for every layer: the code's catalog, stated as an operator would state it, passes it.
    for name in ["sandbox/video-keyed", "sandbox/image-lookup", "sandbox/image-blind", "sandbox/llm",
                 "fal/fal-ai/flux/dev", "fal/fal-ai/kling-video/v2.5-turbo/pro/text-to-video",
                 "openai-images/gpt-image-1", "openai-images/gpt-image-1-mini", "openai-images/dall-e-3",
                 "anthropic/claude-sonnet-4-5", "openai/gpt-4.1-mini", "replicate/black-forest-labs/flux-schnell"]:
        spec = registry.code_spec(name)
        stated = {"name": name, "provider": spec.provider, "kind": spec.kind, "content_type": spec.content_type}
        price = rates.DEFAULTS.get(name)
        if price is not None:
            variants = price.get("variants")
            stated["price"] = {**{k: str(v) for k, v in price.items() if k not in ("variants", "unit")},
                               **({"unit": price["unit"]} if "unit" in price else {}),
                               **({"variants": {"by": list(variants["by"]), "defaults": variants["defaults"],
                                                "prices": {",".join(key): str(amount)
                                                           for key, amount in variants["prices"].items()}}}
                                  if variants else {})}
        assert registry.check_entry(name, stated, spec) is not None, name


def test_a_models_file_changed_wrong_at_run_time_keeps_the_last_good_one_and_says_so(models_file, db, settings,
                                                                                    caplog):
    settings.MODELS_CACHE_S = 0
    path = models_file(SCHNELL_ENTRY, {"name": KEYED, "price": {"per_unit": "0.5", "unit": "render"}})
    assert registry.model_spec(SCHNELL) is not None and rates.worst_case(KEYED) == D("0.500000")

    time.sleep(0.01)  # a new modification time
    path.write_text(json.dumps({"models": [{**SCHNELL_ENTRY, "price": {"per_unit": "-1", "unit": "image"}},
                                           {"name": KEYED, "enabled": "false"}]}))
    with caplog.at_level(logging.ERROR, logger="executor.registry"):
        registry.forget_models()
        rates.forget_overrides()
        assert registry.model_spec(SCHNELL) is not None and registry.model_spec(KEYED) is not None
        assert rates.worst_case(KEYED) == D("0.500000") and rates.worst_case(SCHNELL) == D("0.003000")
    [said] = [r for r in caplog.records if r.getMessage().startswith("models_file.rejected")]
    assert "model fal/fal-ai/flux/schnell: price: per_unit: an amount is finite and not negative" in said.getMessage()
    assert "model sandbox/video-keyed: enabled: true or false" in said.getMessage()

    path.unlink()  # removed: the same
    registry.forget_models()
    rates.forget_overrides()
    assert registry.model_spec(SCHNELL) is not None and rates.worst_case(KEYED) == D("0.500000")

    path.write_text(json.dumps({"models": [{**SCHNELL_ENTRY, "enabled": False}]}))  # right again: in force
    registry.forget_models()
    rates.forget_overrides()
    assert registry.model_spec(SCHNELL) is None and rates.worst_case(KEYED) == D("0.400000")


@pytest.mark.django_db
def test_jobs_run_on_while_a_wrong_models_file_is_refused(engine, models_file, api, ledger, settings):
    # The repro: one negative price written into the running file left every new job `running` with no
    # attempt (a ValueError at each reservation). Now the file is refused and the last good one stays.
    settings.MODELS_CACHE_S = 0
    path = models_file({"name": KEYED, "price": {"per_unit": "0.4", "unit": "render"}})
    registry.model_spec(KEYED)
    time.sleep(0.01)
    path.write_text(json.dumps({"models": [{"name": KEYED, "price": {"per_unit": "-0.4", "unit": "render"}}]}))
    registry.forget_models()
    rates.forget_overrides()

    job = media_job(api.client_id)
    engine.run_job(job)
    job.refresh_from_db()
    assert job.status == "succeeded", job.error
    assert len(assert_books_balance(ledger)) == 1


@pytest.mark.parametrize("field, value, named", [
    ("capabilities", '{"window_s": NaN}', "is not a number JSON can hold"),
    ("capabilities", '{"key_ttl_s": Infinity}', "is not a number JSON can hold"),
    ("params", '[{"name": "steps", "type": "integer", "maximum": "abc"}]', "maximum is a number"),
    ("variants", '{"by": ["image_size"], "prices": {"square": "1e30"}}', "more than an amount can be"),
])
def test_the_admin_refuses_what_the_file_refuses_never_a_500(admin_client, fresh_catalog, field, value, named):
    form = {"name": SCHNELL, "enabled": "on", "provider": "fal", "kind": "image", field: value}
    if field == "variants":
        form.update(price_override="on", unit="image", price_reason="a table")
    answer = admin_client.post("/admin/executor/modelconfig/add/", form)
    assert answer.status_code == 200 and named in answer.content.decode(), answer.content.decode()[-3000:]
    assert not ModelConfig.objects.exists() and not ModelPrice.objects.exists()
