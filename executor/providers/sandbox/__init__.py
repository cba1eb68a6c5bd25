"""The sandbox (sandbox/, docs/sandbox.md): a local provider that keeps a ledger, for development and tests.
Not real money: REAL_PROVIDERS does not govern it, and it has no recorded answers (it is its own server)."""

from django.conf import settings

from executor.providers.base import CHEAP_LLM, Capabilities, ModelSpec, Param
from executor.providers.sandbox.adapter import SandboxProvider
from executor.providers.spec import ProviderSpec

# The sandbox's media models take what its server reads of `params` (sandbox/server.py `_render_params`,
# sandbox/state.py, sandbox/catalog.py), with the sandbox's own bounds (the size's is a setting,
# SANDBOX_MAX_SIZE_BYTES, a copy of the sandbox's: the executor imports nothing of the sandbox, which
# stands for a provider outside payonce); render_s keeps payonce's tighter
# bound of an hour (the sandbox takes a day), the one the API has always had: a longer render would
# outlast the default wait (WAIT_DEADLINE_S) and be paid for and given up.
_MEDIA_PARAMS = (
    Param("render_s", "number", minimum=0, maximum=3600),  # how long the render takes (default 1 s)
    Param("expected_s", "number", minimum=0, nullable=True),  # the duration it announces (null: none)
    Param("fail_render", "string"),  # the render fails with this message (paid: a failure script)
    Param("size_bytes", "integer", minimum=0, maximum=settings.SANDBOX_MAX_SIZE_BYTES),  # the output's size
)

# The sandbox answers every status_* fault before accepting anything (it never charges for one), and it
# remembers a request_id for ever unless SANDBOX_KEY_TTL_S tells it (and payonce) otherwise.
_UNPAID = frozenset({429, 500, 503})
_MODELS = {
    "video-keyed": ("video", "video/mp4", "mp4",
                    dict(idempotency_key=True, lookup=False, asynchronous=True, cancel=True), _MEDIA_PARAMS),
    "image-lookup": ("image", "image/png", "png",
                     dict(idempotency_key=False, lookup=True, asynchronous=True, cancel=False), _MEDIA_PARAMS),
    "image-blind": ("image", "image/png", "png",
                    dict(idempotency_key=False, lookup=False, asynchronous=True, cancel=False), _MEDIA_PARAMS),
    "llm": ("text", "text/markdown", "md", None, None),
}


def _capabilities(declared: dict | None) -> Capabilities:
    if declared is None:
        return CHEAP_LLM
    return Capabilities(**declared, unpaid_statuses=_UNPAID, key_ttl_s=settings.SANDBOX_KEY_TTL_S, callbacks=True)


def models() -> dict[str, ModelSpec]:
    """Built at call time: the key lifetime is a setting."""
    return {f"sandbox/{model}": ModelSpec("sandbox", model, kind, content_type, extension, _capabilities(declared),
                                          params)
            for model, (kind, content_type, extension, declared, params) in _MODELS.items()}


def callback_secret() -> str:
    """The sandbox rings only while it is the configured provider (REAL_PROVIDERS off): its secret has a
    development default (the sandbox's own, SANDBOX_CALLBACK_SECRET's default in config.settings), known to
    anyone who reads the repository, so with real providers on a callback signed with it is refused (404)
    instead of waking waiting steps into provider polls."""
    return "" if settings.REAL_PROVIDERS else settings.SANDBOX_CALLBACK_SECRET


SPEC = ProviderSpec(
    name="sandbox", package="sandbox", adapter=SandboxProvider, real=False, models=models,
    callback_secret_setting="SANDBOX_CALLBACK_SECRET", callback_secret=callback_secret,
)
