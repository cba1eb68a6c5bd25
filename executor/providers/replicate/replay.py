"""Replicate's recorded answers (executor.providers.replay): predictions are created `starting` (id derived
from model, version and input) and any poll of them answers `succeeded` (so `starting -> succeeded` after one
poll), with one output URL under `https://replicate.delivery/replay/` that answers a small PNG. A poll cannot
echo the request's input (there is no state), so it carries the recorded prediction's model and input. The
prediction list is empty: reconciliation finds nothing and the resubmit gets the same deterministic id back.
`POST /v1/files` answers a file object whose id and checksums are those of the uploaded content."""

import base64
import hashlib
import re
from email.parser import BytesParser
from email.policy import HTTP

from executor.providers.replay import _digest, _json, _json_body, _recorded, fixture

MEDIA_PREFIX = "https://replicate.delivery/"
REPLAY_MEDIA_PREFIX = MEDIA_PREFIX + "replay/"


def routes(method: str, url: str, api: str, path: str, request):
    """`api`: where the call went (Replicate URLs in answers point back at it)."""
    if method == "POST" and (match := re.fullmatch(r"/v1/models/([^/]+)/([^/]+)/predictions", path)):
        return _prediction_create(api, f"{match[1]}/{match[2]}", None, _json_body(request))
    if method == "POST" and path == "/v1/predictions":
        body = _json_body(request)
        return _prediction_create(api, None, body.get("version"), body)
    if method == "GET" and path == "/v1/predictions":
        return _json(200, {"content-type": "application/json"}, {"next": None, "previous": None, "results": []})
    if method == "GET" and (match := re.fullmatch(r"/v1/predictions/([^/]+)", path)):
        return _prediction(api, match[1], "replicate/prediction_succeeded")
    if method == "POST" and (match := re.fullmatch(r"/v1/predictions/([^/]+)/cancel", path)):
        return _prediction(api, match[1], "replicate/prediction_canceled")
    if method == "POST" and path == "/v1/files":
        return _file(api, request)
    return None


def _replicate_id(value) -> str:
    """26 lower-case base32 characters, the shape of Replicate's ids."""
    return base64.b32encode(_digest(value)).decode().lower()[:26]


def _urls(api: str, prediction_id: str) -> dict:
    return {"cancel": f"{api}/v1/predictions/{prediction_id}/cancel", "get": f"{api}/v1/predictions/{prediction_id}",
            "stream": f"https://stream.replicate.com/v1/files/replay-{prediction_id}",
            "web": f"https://replicate.com/p/{prediction_id}"}


def _prediction_create(api: str, model: str | None, version: str | None, body: dict):
    prediction_input = body.get("input")
    if not isinstance(prediction_input, dict):
        recorded = fixture("replicate/error_422_invalid_input")
        detail = "- input: Invalid type. Expected: object, given: " + type(prediction_input).__name__
        recorded["body"].update(detail=detail + "\n", invalid_fields=[
            {"type": "invalid_type", "field": "input", "description": detail[len("- input: "):]}])
        return _recorded(recorded)
    recorded = fixture("replicate/prediction_starting")
    prediction = recorded["body"]
    prediction_id = _replicate_id({"model": model, "version": version, "input": prediction_input})
    prediction.update(id=prediction_id, input=prediction_input, urls=_urls(api, prediction_id))
    if model:
        prediction["model"] = model
    if version:
        prediction["version"] = version
    recorded["headers"]["location"] = f"{api}/v1/predictions/{prediction_id}"
    return _recorded(recorded)


def _prediction(api: str, prediction_id: str, name: str):
    recorded = fixture(name)
    prediction = recorded["body"]
    prediction.update(id=prediction_id, urls=_urls(api, prediction_id))
    if prediction.get("output"):
        prediction["output"] = [f"{REPLAY_MEDIA_PREFIX}{prediction_id}/out-0.png"]
    return _recorded(recorded)


def _file(api: str, request):
    content_type = request.headers.get("Content-Type", "")
    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + (request.body or b""))
    content, filename, file_type = b"", "file", "application/octet-stream"
    for part in message.iter_parts() if message.is_multipart() else []:
        if part.get_param("name", header="content-disposition") == "content":
            content = part.get_payload(decode=True) or b""
            filename = part.get_filename() or filename
            file_type = part.get_content_type() or file_type
    recorded = fixture("replicate/file_upload")
    file = recorded["body"]
    file_id = _replicate_id({"file": hashlib.sha256(content).hexdigest()})
    md5 = hashlib.md5(content).hexdigest()
    file.update(id=file_id, name=filename, content_type=file_type, size=len(content), etag=f'"{md5}"',
                checksums={"sha256": hashlib.sha256(content).hexdigest(), "md5": md5},
                urls={"get": f"{api}/v1/files/{file_id}"})
    return _recorded(recorded)
