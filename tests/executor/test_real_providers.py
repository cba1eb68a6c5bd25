"""Real providers are opt-in: off, their models answer from recorded fixtures with no network; on
without a key, payonce refuses to start."""

import subprocess
import sys
from decimal import Decimal as D

import pytest

from tests.conftest import media_body
from tests.support.procs import REPO_ROOT, process_env

pytestmark = pytest.mark.django_db


@pytest.mark.e2e
def test_real_providers_on_without_a_key_refuses_to_start(db):
    env = process_env(REAL_PROVIDERS="1", ANTHROPIC_API_KEY="", OPENAI_API_KEY="", REPLICATE_API_TOKEN="")
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    for variable in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "REPLICATE_API_TOKEN"):
        assert variable in done.stderr


@pytest.mark.e2e
def test_real_providers_on_with_a_key_starts(db):
    env = process_env(REAL_PROVIDERS="1", ANTHROPIC_API_KEY="sk-ant-test", OPENAI_API_KEY="", REPLICATE_API_TOKEN="")
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_provider_without_its_key_is_refused_at_submit_when_real_providers_are_on(api, settings):
    settings.REAL_PROVIDERS = True
    settings.ANTHROPIC_API_KEY = "sk-ant-test"
    settings.REPLICATE_API_TOKEN = ""
    response = api.create(media_body(models=["replicate/black-forest-labs/flux-schnell"]))
    assert response.status_code == 422
    assert "no API key" in str(response.json()["error"]["fields"]["models"])


def test_a_replicate_job_runs_on_recorded_fixtures_with_real_providers_off(engine, ledger, api):
    response = api.create(media_body(models=["replicate/black-forest-labs/flux-schnell"]), key="replay")
    assert response.status_code == 201, response.content
    engine.run_job(response.json()["id"])
    job = api.job(response.json()["id"])

    assert job["status"] == "succeeded", job
    [attempt] = job["attempts"]
    assert (attempt["provider"], attempt["model"], attempt["state"]) == (
        "replicate", "black-forest-labs/flux-schnell", "succeeded")
    download = api.http.get(f"/v1/jobs/{job['id']}/output", headers=api.headers())
    assert b"".join(download.streaming_content).startswith(b"\x89PNG")
    assert ledger.calls() == []  # the sandbox was not involved, and no real provider was reached


@pytest.mark.parametrize("model, params, content_type, cost", [
    # fal's queue: submitted, polled, the result's image downloaded from fal's media host (recorded).
    ("fal/fal-ai/flux/dev", {"image_size": "landscape_16_9", "num_images": 1}, "image/jpeg", "0.025000"),
    # OpenAI's image generation: answered at once with the image in the body (base64), kept from the answer.
    ("openai-images/gpt-image-1", {"quality": "medium", "size": "1024x1024"}, "image/png", None),
])
def test_a_fal_or_openai_image_job_runs_on_recorded_fixtures_with_real_providers_off(
        engine, ledger, api, model, params, content_type, cost):
    body = media_body(models=[model], input={"prompt": "a lighthouse at dusk", **params})
    response = api.create(body, key=f"replay-{model}")
    assert response.status_code == 201, response.content
    engine.run_job(response.json()["id"])
    job = api.job(response.json()["id"])

    assert job["status"] == "succeeded", job
    [attempt] = job["attempts"]
    assert (f"{attempt['provider']}/{attempt['model']}", attempt["state"]) == (model, "succeeded")
    download = api.http.get(f"/v1/jobs/{job['id']}/output", headers=api.headers())
    assert b"".join(download.streaming_content).startswith(b"\x89PNG")  # the replay's image
    if cost is not None:  # priced by its parameters: fal's 16:9 landscape is one megapixel
        assert attempt["cost_usd"] == cost, attempt
    else:  # billed by the tokens its answer reports: the image's 1,056 at $40 and the prompt's at $5 per million
        usage = attempt["usage"]
        assert usage["output_tokens"] == 1056 and usage["input_tokens"] > 0, attempt
        assert D(attempt["cost_usd"]) == (D(1056 * 40) + D(usage["input_tokens"] * 5)) / 1_000_000, attempt
    assert ledger.calls() == []


def test_a_fal_or_openai_image_job_with_a_parameter_they_do_not_take_is_refused_at_submit(api):
    for model, wrong in (("fal/fal-ai/flux/dev", {"image_size": "huge"}), ("openai-images/gpt-image-1", {"n": 4}),
                         ("openai-images/gpt-image-1", {"render_s": 1})):
        response = api.create(media_body(models=[model], input={"prompt": "x", **wrong}))
        assert response.status_code == 422, (model, wrong, response.content)
        assert list(response.json()["error"]["fields"]["input"]) == list(wrong), response.json()
