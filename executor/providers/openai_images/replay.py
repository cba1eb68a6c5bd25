"""OpenAI image generation's recorded answers (executor.providers.replay): `POST .../images/generations`
answers a tiny PNG derived from the prompt, as base64."""

import base64
import hashlib
import math
import struct
import zlib

from executor.providers.replay import _digest, _json_body, _recorded, fixture


def routes(method: str, url: str, api: str, path: str, request):
    if method == "POST" and path.endswith("/images/generations"):
        return _openai_image(_json_body(request))
    return None


def _openai_image(body: dict):
    """OpenAI's image generation: a 4x4 grey PNG whose pixels are the prompt's digest, as base64 for
    every model (where OpenAI would answer dall-e-3 with a URL too), so the same prompt always makes the
    same bytes and no media host is needed. Always a PNG, whatever output_format asked."""
    if not body.get("model") or not body.get("prompt"):
        missing = "model" if not body.get("model") else "prompt"
        recorded = fixture("openai/error_400_invalid_request")
        recorded["body"]["error"].update(message=f"Missing required parameter: '{missing}'.", param=missing,
                                         code="missing_required_parameter")
        return _recorded(recorded)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    pixels = hashlib.sha256(str(body["prompt"]).encode()).digest()
    rows = b"".join(b"\x00" + pixels[4 * row:4 * row + 4] for row in range(4))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 4, 8, 0, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b""))
    recorded = fixture("openai_images/images_generation")
    answer = recorded["body"]
    answer["data"] = [{"b64_json": base64.b64encode(png).decode()}]
    if str(body["model"]).startswith("dall-e"):  # no tokens, no echo of the GPT image models' settings
        for name in ("background", "output_format", "quality", "size", "usage"):
            answer.pop(name, None)
    else:
        answer.update({name: body[name] for name in ("quality", "size") if body.get(name) not in (None, "auto")})
        text_tokens = max(1, math.ceil(len(str(body["prompt"])) / 4))
        usage = answer["usage"]
        usage.update(input_tokens=text_tokens, total_tokens=text_tokens + usage["output_tokens"])
        usage["input_tokens_details"]["text_tokens"] = text_tokens
    recorded["headers"]["x-request-id"] = "req_replay" + _digest(body).hex()[:32]
    return _recorded(recorded)
