"""One real, paid call to check a provider's key and wiring (docs/design.md, "Real money is opt-in"): an LLM
call (Anthropic, OpenAI), or the cheapest render a media provider sells (fal, OpenAI's images, Replicate),
waited on to its end. One attempt, no retry; refuses without --i-will-spend-money, with REAL_PROVIDERS off,
or with no key for the provider."""

import json
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from billing import rates
from executor.models import ModelKind
from executor.providers import PROVIDERS, provider_for, real, spec_of
from executor.providers.base import ProviderError
from executor.registry import model_spec

# What each provider's spec offers (`smoke`); a media provider's `smoke_params` are the cheapest output its
# default models make: one small, low-quality image.
TEXT_PROVIDERS = tuple(spec.name for spec in PROVIDERS if spec.smoke == "text")
MEDIA_PROVIDERS = tuple(spec.name for spec in PROVIDERS if spec.smoke == "media")
MEDIA_WAIT_S = 600.0


class Command(BaseCommand):
    help = "Make one real paid call: smoke_provider PROVIDER MODEL --i-will-spend-money"

    def add_arguments(self, parser):
        parser.add_argument("provider", choices=TEXT_PROVIDERS + MEDIA_PROVIDERS)
        parser.add_argument("model")
        parser.add_argument("--i-will-spend-money", action="store_true", dest="spend")
        parser.add_argument("--max-tokens", type=int, default=16)

    def handle(self, *args, provider, model, spend, max_tokens, **options):
        if not spend:
            raise CommandError("This makes a real, paid call. Say --i-will-spend-money to make it.")
        if not real.real_providers_on():
            raise CommandError("REAL_PROVIDERS is off: the adapters answer from recorded fixtures, and nothing "
                               "real would be called. Set REAL_PROVIDERS=1 and the provider's key.")
        if not real.provider_is_usable(provider):
            raise CommandError(f"{real.key_settings()[provider]} is not set: there is no key to call {provider} with.")
        name = f"{provider}/{model}"
        spec = model_spec(name)
        if provider in MEDIA_PROVIDERS:
            if spec is None or spec.kind == ModelKind.TEXT:
                raise CommandError(f"{name} is not a media model payonce knows.")
            self.stdout.write(json.dumps(self._render(name, spec)))
            return
        if spec is None or spec.kind != ModelKind.TEXT:
            raise CommandError(f"{name} is not a text model payonce knows.")
        adapter = provider_for(provider)
        try:  # one attempt, no retry: whatever it answers is the answer
            completion = adapter.complete(spec.model, system="Answer in one word.",
                                          messages=[{"role": "user", "content": "Say ready."}],
                                          max_tokens=max(1, min(max_tokens, 64)),
                                          upstream_key="payonce-smoke-1", metadata={})
        except ProviderError as exc:
            raise CommandError(f"{name} answered {exc.kind}: {exc.message}") from None
        usage = completion.usage.as_dict()
        cost = rates.cost_of(name, usage)
        self.stdout.write(json.dumps({"model": name, "text": completion.text, "usage": usage,
                                      "cost_usd": str(cost) if cost is not None else None,
                                      "real_providers": settings.REAL_PROVIDERS}))

    def _render(self, name: str, spec) -> dict:
        """One render, polled to its end (at most MEDIA_WAIT_S): what the provider answered and what the rate
        card makes of it. A lost answer is said plainly: the render may have been made and charged."""
        adapter = provider_for(spec.provider)
        params = dict(spec_of(spec.provider).smoke_params)
        try:
            submitted = adapter.submit(spec.model, upstream_key="payonce-smoke-1", prompt="a red square",
                                       params=params, metadata={}, inputs=[])
            status, output, usage = submitted.status, submitted.output_url, submitted.usage
            deadline = time.monotonic() + MEDIA_WAIT_S
            while status == "running" and time.monotonic() < deadline:
                time.sleep(2.0)
                polled = adapter.poll(spec.model, submitted.upstream_id)
                status, output, usage = polled.status, polled.output_url, polled.usage or usage
        except ProviderError as exc:
            unknown = " (the outcome is unknown: it may have been made and charged)" if exc.outcome_unknown else ""
            raise CommandError(f"{name} answered {exc.kind}: {exc.message}{unknown}") from None
        usage_dict = usage.as_dict() if usage else {}
        cost = rates.cost_of(name, usage_dict, params=params)
        return {"model": name, "upstream_id": submitted.upstream_id, "status": status,
                "output": output or (f"{len(submitted.output)} bytes in the answer" if submitted.output else None),
                "usage": usage_dict, "cost_usd": str(cost) if cost is not None else None,
                "real_providers": settings.REAL_PROVIDERS}
