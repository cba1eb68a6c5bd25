"""OpenAI-compatible chat completions' recorded answers (executor.providers.replay): `POST .../chat/completions`
answers a text derived from the last user message, with token counts of about four characters a token, cut at
max_tokens."""

from executor.providers.replay import _digest, _json_body, _recorded, _text_of, fixture, llm_reply


def routes(method: str, url: str, api: str, path: str, request):
    if method == "POST" and path.endswith("/chat/completions"):
        return _openai(_json_body(request))
    return None


def _openai(body: dict):
    if not body.get("model") or not body.get("messages"):
        recorded = fixture("openai/error_400_invalid_request")
        recorded["body"]["error"].update(
            message="you must provide a model parameter" if not body.get("model") else "'messages' is required",
            param="model" if not body.get("model") else "messages", code=None)
        return _recorded(recorded)
    messages = body["messages"]
    system = "".join(_text_of(m.get("content")) for m in messages if m.get("role") == "system")
    reply = llm_reply(system, [m for m in messages if m.get("role") != "system"],
                      int(body.get("max_tokens") or body.get("max_completion_tokens") or 4096))
    recorded = fixture("openai/chat_completion")
    answer = recorded["body"]
    answer["id"] = "chatcmpl-replay" + _digest(body).hex()[:20]
    answer["model"] = body["model"]
    choice = answer["choices"][0]
    choice["message"]["content"] = reply["text"]
    choice["finish_reason"] = "length" if reply["truncated"] else "stop"
    answer["usage"].update(prompt_tokens=reply["input_tokens"], completion_tokens=reply["output_tokens"],
                           total_tokens=reply["input_tokens"] + reply["output_tokens"])
    answer["usage"]["prompt_tokens_details"]["cached_tokens"] = 0
    recorded["headers"]["x-request-id"] = "req_replay" + _digest(body).hex()[20:52]
    return _recorded(recorded)
