"""Models declare their parameters (executor.registry): a media job's `input` holds `prompt`, `references`
and only the parameters every declaring model of its chain takes, so a typo such as `rendr_s` is a 422
at submit, before any row or charge, instead of a default render paid for. A Replicate model, whose
parameters payonce cannot know, passes any key through."""

import json
import re
from pathlib import Path

import pytest

from executor.registry import code_spec, input_problems, provider_params
from jobs.models import Job
from sandbox import catalog as sandbox_catalog
from sandbox.server import ApiError, _render_params
from tests.conftest import media_body
from tests.e2e.test_media import charges_for, wait_for

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


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("model", SANDBOX_MEDIA)
def test_an_undeclared_parameter_is_422_naming_it_with_no_row_and_no_charge(jobs_worker, ledger, api, model):
    typo = api.create(media_body(models=[model], input={"prompt": "a typo", "rendr_s": 0}), key="typo")

    assert typo.status_code == 422, typo.content
    error = typo.json()["error"]
    assert error["code"] == "INVALID_REQUEST"
    assert error["fields"] == {"input": {"rendr_s": [
        f"Not a parameter of {model}, which takes: render_s, expected_s, fail_render, size_bytes."]}}
    assert Job.objects.count() == 0
    assert ledger.ledger()["charges"] == [] and ledger.calls() == []

    # The same body spelled right is a job the worker runs and pays for: had the typo made a job, it
    # would have been queued first and paid for too.
    right = api.create(media_body(models=[model], input={"prompt": "a typo", "render_s": 0}), key="right")
    assert right.status_code == 201, right.content
    job_id = right.json()["id"]
    job, _ = wait_for(api, job_id, {"succeeded", "failed"})
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


@pytest.mark.django_db(transaction=True)  # the manage.py process reads the client the test wrote
def test_the_cli_submit_refuses_an_undeclared_parameter_as_the_api_does(api):
    from tests.operators.test_cli import manage

    body = media_body(input={"prompt": "x", "rendr_s": 1})
    answer = api.create(body, key="cli-typo")
    done = manage("submit", "--model", "sandbox/video-keyed", "--input", '{"prompt": "x", "rendr_s": 1}',
                  "--client", "acme", "--key", "cli-typo", "--json")

    assert answer.status_code == 422
    assert done.returncode == 2 and done.stdout == "", done.stderr
    error = json.loads(done.stderr.strip().splitlines()[-1])
    assert error == answer.json() and set(error["error"]["fields"]["input"]) == {"rendr_s"}
    assert Job.objects.count() == 0
