"""Models declare their parameters (executor.registry): a media job's `input` holds `prompt`, `references`
and only the parameters every declaring model of its chain takes, so a typo such as `rendr_s` is a 422
at submit, before any row or charge, instead of a default render paid for. A Replicate model, whose
parameters payonce cannot know, passes any other key through. No model, whatever it declares, takes a key
named like a field payonce sets in its provider's requests (the adapter's `own_fields`)."""

import json
import re
from pathlib import Path

import pytest

from executor import registry
from executor.models import Attempt, ModelConfig
from executor.registry import PAYONCE_INPUT_KEYS, code_spec, input_problems, own_fields, provider_params
from jobs.models import Job, Step
from sandbox import catalog as sandbox_catalog
from sandbox.server import ApiError, _render_params
from tests.conftest import media_body
from tests.support.books import charges_for
from tests.support.replay_server import ReplayServer

SANDBOX_MEDIA = ["sandbox/video-keyed", "sandbox/image-lookup", "sandbox/image-blind"]
REPLICATE = "replicate/black-forest-labs/flux-schnell"
SANDBOX_DIR = Path(__file__).resolve().parents[2] / "sandbox"


def declared(model: str) -> dict:
    return {param.name: param for param in code_spec(model).params}


# --- the declaration matches what the sandbox reads and enforces ----------------------------------------


def test_each_sandbox_media_model_declares_every_params_key_the_sandbox_reads():
    source = "\n".join(path.read_text() for path in SANDBOX_DIR.glob("*.py"))
    read = set(re.findall(r"""params(?:\.get\(|\[)\s*["'](\w+)["']""", source))
    read |= set(re.findall(r"""["'](\w+)["'] in params\b""", source))
    assert read == {"render_s", "expected_s", "fail_render", "size_bytes"}  # the scan finds them all
    for model in SANDBOX_MEDIA:
        assert set(declared(model)) == read, model


# Values around every bound the sandbox or payonce has, of every JSON type.
SAMPLES = [None, True, False, "", "2", -1, -0.5, 0, 0.5, 1, 2.0, 3600, 3600.5, 3601, 24 * 3600, 24 * 3600 + 1,
           sandbox_catalog.MAX_SIZE_BYTES, sandbox_catalog.MAX_SIZE_BYTES + 1, [], {}]


def sandbox_takes(key: str, value) -> bool:
    try:
        _render_params({key: value})
    except ApiError:
        return False
    return True


@pytest.mark.parametrize("key", ["render_s", "expected_s", "fail_render", "size_bytes"])
def test_a_value_the_registry_accepts_is_one_the_sandbox_accepts(key, db):  # db: the catalog reads its layers
    accepted = [value for value in SAMPLES if not input_problems(["sandbox/video-keyed"], {key: value})]
    assert accepted, "the samples reach no accepted value: the check would mean nothing"
    assert [value for value in accepted if not sandbox_takes(key, value)] == []


def test_only_render_s_is_tighter_than_the_sandbox_an_hour_as_the_api_always_had(db):
    refused_here = {key: [value for value in SAMPLES
                          if sandbox_takes(key, value) and input_problems(["sandbox/video-keyed"], {key: value})]
                    for key in declared("sandbox/video-keyed")}
    assert refused_here == {"render_s": [3600.5, 3601, 24 * 3600], "expected_s": [], "fail_render": [],
                            "size_bytes": []}


def test_text_and_replicate_models_declare_nothing_so_pass_through(db):
    for model in ("sandbox/llm", "anthropic/claude-sonnet-4-5", "openai/gpt-4o-mini", REPLICATE,
                  "replicate/stability-ai/sdxl:" + "a" * 64):
        assert code_spec(model).params is None, model
    assert input_problems([REPLICATE], {"prompt": "x", "seed": 7, "rendr_s": "anything"}) == {}


def test_the_provider_params_are_every_key_but_prompt_and_references(db):
    job_input = {"prompt": "x", "references": [{"data": "AA==", "content_type": "image/png"}], "render_s": 0,
                 "seed": 7}
    assert provider_params(job_input) == {"render_s": 0, "seed": 7}
    assert input_problems(SANDBOX_MEDIA, job_input) == {"seed": [
        "Not a parameter of sandbox/video-keyed, which takes: render_s, expected_s, fail_render, size_bytes."]}


# --- at submit: 422 naming input.<key>, no row, no charge ---------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("model", SANDBOX_MEDIA)
def test_an_undeclared_parameter_is_422_naming_it_with_no_row_and_no_charge(engine, ledger, api, model,
                                                                           django_capture_on_commit_callbacks):
    typo = api.create(media_body(models=[model], input={"prompt": "a typo", "rendr_s": 0}), key="typo")

    assert typo.status_code == 422, typo.content
    error = typo.json()["error"]
    assert error["code"] == "INVALID_REQUEST"
    assert error["fields"] == {"input": {"rendr_s": [
        f"Not a parameter of {model}, which takes: render_s, expected_s, fail_render, size_bytes."]}}
    assert Job.objects.count() == 0
    assert ledger.ledger()["charges"] == [] and ledger.calls() == []

    # The same body spelled right is a job the engine runs and pays for: had the typo made a job, it
    # would have been queued first and paid for too.
    with django_capture_on_commit_callbacks(execute=True):  # what the API enqueues goes to the engine
        right = api.create(media_body(models=[model], input={"prompt": "a typo", "render_s": 0}), key="right")
    assert right.status_code == 201, right.content
    job_id = right.json()["id"]
    engine.run()  # everything the API enqueued: had the typo made a job, it would run here too
    job = api.job(job_id)
    assert job["status"] == "succeeded", job
    assert [str(pk) for pk in Job.objects.values_list("id", flat=True)] == [job_id]
    charges = ledger.ledger()["charges"]
    assert len(charges) == 1 and charges == charges_for(ledger, job_id)
    submits = [call for call in ledger.calls() if call["kind"] == "submit"]
    assert [call["metadata"]["payonce_job"] for call in submits] == [job_id]


@pytest.mark.parametrize("model", SANDBOX_MEDIA)
@pytest.mark.parametrize("key, value", [
    ("render_s", "2"), ("render_s", True), ("render_s", -1), ("render_s", 3601), ("render_s", None),
    ("size_bytes", 1.5), ("size_bytes", -1), ("size_bytes", sandbox_catalog.MAX_SIZE_BYTES + 1),
    ("size_bytes", "4096"), ("expected_s", -1), ("expected_s", "soon"), ("fail_render", 3),
    ("fail_render", None), ("fail_render", ["a"]),
])
def test_a_declared_parameter_of_the_wrong_type_or_out_of_bounds_is_422_naming_it(api, model, key, value):
    response = api.create(media_body(models=[model], input={"prompt": "x", key: value}))

    assert response.status_code == 422, response.content
    assert response.json()["error"]["code"] == "INVALID_REQUEST"
    assert set(response.json()["error"]["fields"]) == {"input"}
    assert set(response.json()["error"]["fields"]["input"]) == {key}
    assert Job.objects.count() == 0


@pytest.mark.parametrize("key", ["render_s", "expected_s", "size_bytes"])
@pytest.mark.parametrize("value", [10 ** 309, -(10 ** 309), 10 ** 4000],
                         ids=["310 digits", "-310 digits", "4001 digits"])
def test_a_number_parameter_beyond_a_doubles_range_is_a_problem_not_an_overflow(key, value, db):
    # math.isfinite(10 ** 309) raises OverflowError: once a 500 at submit, whatever the parameter's bounds.
    problems = input_problems(["sandbox/video-keyed"], {"prompt": "x", key: value})

    assert list(problems) == [key]
    assert problems[key] == ["A finite number that fits a double (at most about 1.8e308 in size) is required."]


def test_a_typo_and_a_missing_prompt_are_named_together(api):
    response = api.create(media_body(input={"rendr_s": 1}))

    assert response.status_code == 422
    assert set(response.json()["error"]["fields"]["input"]) == {"prompt", "rendr_s"}


@pytest.mark.parametrize("model", SANDBOX_MEDIA)
def test_every_declared_parameter_is_accepted_and_the_job_created(api, model):
    job_input = {"prompt": "x", "render_s": 0.5, "expected_s": None, "fail_render": "no", "size_bytes": 0,
                 "references": [{"data": "iVBORw0KGgo=", "content_type": "image/png"}]}
    response = api.create(media_body(models=[model], input=job_input))

    assert response.status_code == 201, response.content
    assert response.json()["input"] == job_input
    assert Job.objects.get(id=response.json()["id"]).input == job_input


def test_a_replicate_model_passes_an_arbitrary_parameter_through(api):
    job_input = {"prompt": "x", "seed": 7, "aspect_ratio": "16:9", "rendr_s": 1}
    response = api.create(media_body(models=[REPLICATE], input=job_input))

    assert response.status_code == 201, response.content
    job = Job.objects.get(id=response.json()["id"])
    assert provider_params(job.input) == {"seed": 7, "aspect_ratio": "16:9", "rendr_s": 1}  # what is sent


def test_in_a_chain_with_a_replicate_model_the_declaring_models_rule_still_applies(api):
    chain = [REPLICATE, "sandbox/image-blind"]
    refused = api.create(media_body(models=chain, input={"prompt": "x", "seed": 7}), key="seed")
    accepted = api.create(media_body(models=chain, input={"prompt": "x", "render_s": 0}), key="render")

    assert refused.status_code == 422, refused.content
    assert refused.json()["error"]["fields"] == {"input": {"seed": [
        "Not a parameter of sandbox/image-blind, which takes: render_s, expected_s, fail_render, size_bytes."]}}
    assert accepted.status_code == 201, accepted.content
    assert Job.objects.count() == 1


def test_the_schema_says_which_parameters_the_sandbox_models_take(api):
    document = api.http.get("/v1/schema", headers={"Accept": "application/vnd.oai.openapi+json"}).json()

    described = document["components"]["schemas"]["JobCreateRequest"]["properties"]["input"]["description"]
    assert "render_s, expected_s, fail_render, size_bytes" in described
    assert "Replicate" in described


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)  # the manage.py process reads the client the test wrote
def test_the_cli_submit_refuses_an_undeclared_parameter_as_the_api_does(api):
    from tests.support.commands import manage

    body = media_body(input={"prompt": "x", "rendr_s": 1})
    answer = api.create(body, key="cli-typo")
    done = manage("submit", "--model", "sandbox/video-keyed", "--input", '{"prompt": "x", "rendr_s": 1}',
                  "--client", "acme", "--key", "cli-typo", "--json")

    assert answer.status_code == 422
    assert done.returncode == 2 and done.stdout == "", done.stderr
    error = json.loads(done.stderr.strip().splitlines()[-1])
    assert error == answer.json() and set(error["error"]["fields"]["input"]) == {"rendr_s"}
    assert Job.objects.count() == 0


# --- payonce's own fields are never parameters (issue 37, finding 4) ---------------------------------------

MINI = "openai-images/gpt-image-1-mini"
# A media model of each provider that has them, as the code declares its parameters (Replicate's: none).
MEDIA_MODEL_OF = {"sandbox": "sandbox/video-keyed", "fal": "fal/fal-ai/flux/dev", "openai-images": MINI,
                  "replicate": REPLICATE}
# (model, field, how the model takes its keys): as the code declares them, and declared "any" (a Replicate
# model takes any key as the code has it). The prompt is left out: it is the job's own `prompt`.
# OpenAI's `n`, which the code declares as the one value payonce sends (1), is the one own field a declared
# model takes (test_no_model_the_code_knows_declares_a_field_payonce_sets_but_as_the_one_value_it_sends).
OWN_FIELD_KEYS = [pytest.param(model, field, takes, id=f"{model}-{field}-{takes}")
                  for provider, model in MEDIA_MODEL_OF.items() for field in own_fields(provider)
                  if field not in PAYONCE_INPUT_KEYS
                  for takes in (("any",) if provider == "replicate" else ("declared", "any"))
                  if (model, field, takes) != (MINI, "n", "declared")]


def owned(field: str, model: str) -> list[str]:
    return [f"Not a parameter: payonce sets {field} in every request to {model}."]


@pytest.fixture
def takes_any_key(settings, tmp_path, db):
    """Declare models `"params": "any"`, as the admin's rows or in the models file (`how`)."""

    def declare(how: str, *names: str):
        if how == "admin row":
            ModelConfig.objects.bulk_create(ModelConfig(name=name, params="any") for name in names)
        else:
            path = tmp_path / "models.json"
            path.write_text(json.dumps({"models": [{"name": name, "params": "any"} for name in names]}))
            settings.MODELS_FILE = str(path)
        registry.forget_models()
        assert [registry.model_spec(name).params for name in names] == [None] * len(names)  # any key, now

    registry.forget_models()
    yield declare
    registry.forget_models()


@pytest.mark.parametrize("how", ["admin row", "models file"])
def test_a_model_key_is_422_for_a_model_that_takes_any_key_with_nothing_written_or_sent(api, settings, takes_any_key,
                                                                                        how):
    # The finding: gpt-image-1-mini declared "any" took {"model": "gpt-image-1", "quality": "high"}, and OpenAI
    # made (and billed) a gpt-image-1 high image, $0.2496 on the rate card, recorded as the mini model at $0.052.
    takes_any_key(how, MINI)
    with ReplayServer() as openai:  # OpenAI, were anything sent
        settings.REAL_PROVIDERS = True
        settings.OPENAI_API_KEY = "sk-proj-test-key"
        settings.OPENAI_BASE_URL = openai.url + "/v1"
        job_input = {"model": "gpt-image-1", "quality": "high", "prompt": "a lighthouse at dusk"}
        response = api.create(media_body(models=[MINI], input=job_input), key="bigger-model")

        assert response.status_code == 422, response.content
        assert response.json()["error"]["code"] == "INVALID_REQUEST"
        assert response.json()["error"]["fields"] == {"input": {"model": owned("model", MINI)}}
        assert (Job.objects.count(), Step.objects.count(), Attempt.objects.count()) == (0, 0, 0)
        assert openai.requests == []

    # "any" still takes the rest: without the model, the same input is a job.
    accepted = api.create(media_body(models=[MINI], input={"quality": "high", "prompt": "a lighthouse at dusk"}),
                          key="no-model")
    assert accepted.status_code == 201, accepted.content


@pytest.mark.parametrize(("model", "field", "takes"), OWN_FIELD_KEYS)
def test_a_key_named_like_a_field_payonce_sets_is_refused_whatever_the_model_takes(takes_any_key, model, field,
                                                                                    takes):
    if takes == "any":
        takes_any_key("models file", model)
    assert (code_spec(model).params is None) == (model == REPLICATE)  # "declared" cases declare, indeed

    assert input_problems([model], {"prompt": "x", field: "a value"}) == {field: owned(field, model)}


def test_in_a_chain_a_field_one_provider_sets_is_refused_though_the_first_model_takes_any_key(takes_any_key):
    takes_any_key("admin row", "sandbox/video-keyed")

    # version is Replicate's (a model's version), not the sandbox's: the chain's second model refuses it.
    assert input_problems(["sandbox/video-keyed", REPLICATE], {"prompt": "x", "version": "v2"}) == {
        "version": owned("version", REPLICATE)}
    assert input_problems(["sandbox/video-keyed", REPLICATE], {"prompt": "x", "seed": 7}) == {}


def test_no_model_the_code_knows_declares_a_field_payonce_sets_but_as_the_one_value_it_sends(settings, db):
    # OpenAI's images always took `"n": 1` (payonce makes one image a job): still taken, and only that.
    declaring = {name: spec for name, spec in registry._code_models().items() if spec.params is not None}
    assert set(MEDIA_MODEL_OF.values()) - {REPLICATE} <= set(declaring)  # the check reaches each provider's
    owned = {(name, p.name, p.minimum, p.maximum) for name, spec in declaring.items() for p in spec.params
             if p.name in own_fields(spec.provider)}
    assert owned == {(f"openai-images/{model}", "n", 1, 1) for model in ("gpt-image-1", "gpt-image-1-mini", "dall-e-3")}
    assert input_problems(["openai-images/gpt-image-1"], {"prompt": "x", "n": 1}) == {}
    assert input_problems(["openai-images/gpt-image-1"], {"prompt": "x", "n": 2}) == {
        "n": ["Ensure this value is less than or equal to 1."]}
