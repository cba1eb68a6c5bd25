"""OpenAI's image generation as recorded: the endpoint's path and the PNG of its recorded answer
(executor.providers.replay.fixture), for the tests that serve it from a local replay server."""

import base64

from executor.providers.replay import fixture


PATH = "/v1/images/generations"
PNG = base64.b64decode(fixture("openai_images/images_generation")["body"]["data"][0]["b64_json"])
