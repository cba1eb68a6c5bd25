"""One real, paid LLM call to check a provider's key and wiring (docs/design.md, "Real money is opt-in").
One attempt, no retry; refuses without --i-will-spend-money, with REAL_PROVIDERS off, or with no key for the
provider."""

import json

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from billing import rates
from executor.providers import provider_for, real
from executor.providers.base import ProviderError
from executor.registry import model_spec

TEXT_PROVIDERS = ("anthropic", "openai")


class Command(BaseCommand):
    help = "Make one real paid LLM call: smoke_provider PROVIDER MODEL --i-will-spend-money"

    def add_arguments(self, parser):
        parser.add_argument("provider", choices=TEXT_PROVIDERS)
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
            raise CommandError(f"{real.KEY_SETTINGS[provider]} is not set: there is no key to call {provider} with.")
        name = f"{provider}/{model}"
        spec = model_spec(name)
        if spec is None or spec.kind != "text":
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
