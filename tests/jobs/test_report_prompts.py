"""A cached prefix is one client's (issue 37, finding 6): the block a report marks for caching starts with a
line only that client's requests carry, so a provider's cache (per organisation, and payonce is one)
never serves one client's prefix to another. The prompts as jobs.kinds.report.reports builds them, cut where a
provider's cache cuts them (the sandbox's own rule, Anthropic's: the prompt up to the breakpoint), and
compared the way OpenAI's automatic cache compares them (the longest shared beginning). No database: the
report is an unsaved row."""

import uuid

from jobs.kinds.report import reports
from jobs.models import Report
from sandbox import catalog

SUBJECT = {"name": "Ada Example", "born": "1990-04-12T06:30", "notes": "Ada keeps a garden by the river. " * 200}


def report() -> Report:
    return Report(subject=SUBJECT, chapter_keys=["sun", "moon"], synthesis="The synthesis every chapter reads.")


def cache_key(client_id, key: str) -> str:
    """What a cache entry of the chapter's prompt is keyed by (sandbox.catalog.cache_prefix)."""
    chars, canonical = catalog.cache_prefix(reports.SYSTEM_PROMPT,
                                            reports.chapter_messages(report(), key, client_id=client_id))
    assert catalog.prefix_tokens(chars) >= catalog.CACHE_MIN_TOKENS  # long enough to be cached at all
    return canonical


def flat(system: str, messages: list[dict]) -> str:
    """A prompt as one string in the order a provider reads it."""
    content = messages[0]["content"]
    return system + "".join(block["text"] for block in content) if isinstance(content, list) else system + content


def shared_beginning(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_one_clients_chapters_share_one_prefix_and_another_client_never_has_it():
    ada, bob = uuid.uuid4(), uuid.uuid4()

    assert cache_key(ada, "sun") == cache_key(ada, "moon")  # byte for byte, chapter after chapter
    assert cache_key(ada, "sun") != cache_key(bob, "sun")  # the same subject and synthesis, another entry


def test_the_marked_block_starts_with_the_clients_scope_so_no_long_beginning_is_shared():
    # OpenAI caches the longest beginning it has seen, marked or not: two clients' prompts, chapters and
    # syntheses alike, share no more than the system prompt, far under the 1,024 tokens any cache needs.
    ada, bob = uuid.uuid4(), uuid.uuid4()
    for build in (lambda client: reports.chapter_messages(report(), "sun", client_id=client),
                  lambda client: reports.synthesis_messages(report(), client_id=client)):
        shared = shared_beginning(flat(reports.SYSTEM_PROMPT, build(ada)), flat(reports.SYSTEM_PROMPT, build(bob)))
        assert shared < len(reports.SYSTEM_PROMPT) + len("Scope: ") + reports.SCOPE_TAG_CHARS
        assert catalog.prefix_tokens(shared) < catalog.CACHE_MIN_TOKENS

    [marked] = reports.chapter_messages(report(), "sun", client_id=ada)[0]["content"][:1]
    assert marked["text"].startswith(f"Scope: {reports.scope_tag(ada)}\n\nSubject:\n")


def test_the_scope_tag_is_stable_opaque_and_of_one_length(settings):
    client = uuid.uuid4()
    tag = reports.scope_tag(client)

    assert reports.scope_tag(str(client)) == tag  # the same for every run and resume of the client's jobs
    assert len(tag) == reports.SCOPE_TAG_CHARS and int(tag, 16) >= 0  # hex: worst cases are the same for all
    assert str(client).replace("-", "")[:8] not in tag  # the client's id is not in it
    # Keyed by the deployment's secret: knowing a client's id is not enough to make its tag.
    settings.SECRET_KEY = "another-deployment-" + "k" * 40
    assert reports.scope_tag(client) != tag
