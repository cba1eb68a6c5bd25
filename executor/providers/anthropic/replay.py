"""Anthropic's recorded answers (executor.providers.replay): `POST /v1/messages` answers a text derived
from the last user message, with token counts of about four characters a token, cut at max_tokens."""

from executor.providers.replay import _digest, _json_body, _recorded, _text_of, fixture, llm_reply


def routes(method: str, url: str, api: str, path: str, request):
    if method == "POST" and path == "/v1/messages":
        return _anthropic(_json_body(request))
    return None


def _anthropic(body: dict):
    missing = next((f for f in ("model", "max_tokens", "messages") if not body.get(f)), None)
    if missing:
        recorded = fixture("anthropic/error_400_invalid_request")
        recorded["body"]["error"]["message"] = f"{missing}: Field required"
        return _recorded(recorded)
    reply = llm_reply(_text_of(body.get("system")), body["messages"], int(body["max_tokens"]))
    recorded = fixture("anthropic/message")
    answer = recorded["body"]
    answer["id"] = "msg_replay" + _digest(body).hex()[:22]
    answer["model"] = body["model"]
    answer["content"] = [{"type": "text", "text": reply["text"]}]
    answer["stop_reason"] = "max_tokens" if reply["truncated"] else "end_turn"
    answer["usage"] = {
        "input_tokens": reply["input_tokens"], "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
        "output_tokens": reply["output_tokens"], "service_tier": "standard",
    }
    recorded["headers"]["request-id"] = "req_replay" + _digest(body).hex()[22:44]
    return _recorded(recorded)
