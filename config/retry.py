"""The one copy of the rules every retry in payonce follows: exponential back-off with jitter, and how a
`Retry-After` header is read (providers and webhook receivers alike)."""

import random


def jittered(seconds: float, low: float = 0.8, high: float = 1.2) -> float:
    """`seconds` spread by a random factor, so that retries that failed together do not return together."""
    return seconds * random.uniform(low, high)


def backoff_s(tries: int, *, base: float = 1.0, cap: float = 60.0) -> float:
    """After the `tries`-th failure: base, 2 x base, 4 x base, ... up to `cap`, each +-20%."""
    return jittered(min(base * 2 ** max(tries - 1, 0), cap))


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header given in seconds; an HTTP date or garbage is ignored (the caller's
    own schedule decides then)."""
    try:
        seconds = float(value) if value else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < 86400 else None
