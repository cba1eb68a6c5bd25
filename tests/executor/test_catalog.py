"""Models from configuration (executor.registry, billing.rates): the code's models, then a models file's,
then the admin's Models page, each over the one before, with their prices; no release, no restart."""

import json
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
from tests.e2e.test_media import wait_for
from tests.support.procs import REPO_ROOT, process_env

SCHNELL = "fal/fal-ai/flux/schnell"  # a fal model the code does not name
SCHNELL_ENTRY = {
    "name": SCHNELL, "provider": "fal", "kind": "image", "content_type": "image/jpeg",
    "params": [{"name": "image_size", "type": "string", "choices": ["square", "landscape_4_3"]},
               {"name": "num_inference_steps", "type": "integer", "minimum": 1, "maximum": 12}],
    "price": {"per_unit": "0.003", "unit": "image"},
}


@pytest.fixture
def fresh_catalog(settings):
    registry.forget_models()
    rates.forget_overrides()
    yield settings
    registry.forget_models()
    rates.forget_overrides()


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
    entry = {"provider": provider, "kind": "image", "params": [{"name": "seed", "type": "integer"},
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
        "unit": "image"})
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
