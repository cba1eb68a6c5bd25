"""fal's recorded answers (executor.providers.replay): its queue takes a `fal-ai/...` submit with a request id
derived from model and input; any status of it answers COMPLETED, and its result is an image (a video for an
app named for video) under a replay media host that answers the same small PNG (or bytes named .mp4)."""

import json
import re
from urllib.parse import urlsplit

from executor.providers.replay import _digest, _recorded, fixture

MEDIA_PREFIX = "https://v3.fal.media/"
REPLAY_MEDIA_PREFIX = MEDIA_PREFIX + "files/replay/"


def routes(method: str, url: str, api: str, path: str, request):
    """fal's queue API, its webhook keys (`/.well-known/jwks.json`) and its media host; None for a
    request that is none of these. A submit (`POST /{owner}/{app}[/path]`, taken on fal's own hosts, or
    for a `fal-ai/` model on any: elsewhere such a path may be another provider's) is queued with a
    request id derived from the model and the input; any status of a request answers COMPLETED and its
    result one image (one video for an app named `...video...`) under REPLAY_MEDIA_PREFIX, so
    `IN_QUEUE -> COMPLETED` after one poll. A cancel is accepted."""
    if method == "GET" and path == "/.well-known/jwks.json":
        return _recorded(fixture("fal/jwks"))
    if match := re.fullmatch(r"/([^/]+/[^/]+(?:/[^/]+)?)/requests/([^/]+)(/status|/cancel)?", path):
        app, request_id, tail = match.groups()
        urls = {"response_url": f"{api}/{app}/requests/{request_id}",
                "status_url": f"{api}/{app}/requests/{request_id}/status",
                "cancel_url": f"{api}/{app}/requests/{request_id}/cancel"}
        if method == "GET" and tail == "/status":
            recorded = fixture("fal/status_completed")
            recorded["body"].update(request_id=request_id, **urls)
            return _recorded(recorded)
        if method == "GET" and tail is None:
            video = "video" in app
            recorded = fixture("fal/result_kling_video" if video else "fal/result_flux_dev")
            recorded["headers"]["x-fal-request-id"] = request_id
            if video:
                recorded["body"]["video"]["url"] = f"{REPLAY_MEDIA_PREFIX}{request_id}/output.mp4"
            else:
                recorded["body"]["images"] = [{"url": f"{REPLAY_MEDIA_PREFIX}{request_id}/out-0.png",
                                               "width": 1, "height": 1, "content_type": "image/png"}]
            return _recorded(recorded)
        if method == "PUT" and tail == "/cancel":
            return _recorded(fixture("fal/cancel_requested"))
        return None
    fal_host = (urlsplit(url).hostname or "").endswith((".fal.run", ".falrun.com"))
    if method != "POST" or not (fal_host or path.startswith("/fal-ai/")) or not re.fullmatch(r"(/[^/]+){2,}", path):
        return None
    try:
        body = json.loads(request.body or b"null")
    except ValueError:
        body = None
    if not isinstance(body, dict):
        recorded = fixture("fal/error_422_validation")
        recorded["body"]["detail"] = [{"loc": ["body"], "msg": "Input should be a valid dictionary",
                                       "type": "dict_type", "input": body}]
        return _recorded(recorded)
    model = path[1:]
    digest = _digest({"model": model, "input": body}).hex()
    request_id = f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
    segments = model.split("/")
    app = "/".join(segments[: 3 if segments[0] in ("workflows", "comfy") else 2])  # as fal names an app
    recorded = fixture("fal/submit_accepted")
    recorded["body"].update(request_id=request_id, response_url=f"{api}/{app}/requests/{request_id}",
                            status_url=f"{api}/{app}/requests/{request_id}/status",
                            cancel_url=f"{api}/{app}/requests/{request_id}/cancel")
    recorded["headers"]["x-fal-request-id"] = request_id
    return _recorded(recorded)
