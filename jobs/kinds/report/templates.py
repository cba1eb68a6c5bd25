"""Report templates (docs/design.md, "Report templates"): what a report is written from and how it reads, as a
client's own immutable versions; the built-in default is today's report, shipped as data
(default_template.json).

A version's text fields are templates in a sandbox: Jinja2's SandboxedEnvironment, with an undefined that
fails (a variable the subject lacks is an error naming it, never a blank), and, before that, a check of
the template's syntax tree against a short list of what a report's text may do: print a variable
(`subject.<field>`, `chapter.key`, `chapter.title`, `link`, `link_days`, each only where it has a value),
index it with a constant, pass it through a few text filters, and choose with `if`. No call, no loop, no
attribute that starts with `_`, no arithmetic: nothing reaches Python's internals or the file system, and
nothing makes a text larger than its variables and its template (what a report pays for is its prompts'
bytes). The sandbox stays the second wall, not the first.
"""

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Max
from django.utils import timezone
from jinja2 import StrictUndefined, TemplateError, nodes
from jinja2.sandbox import SandboxedEnvironment

from accounts.models import Client
from jobs.models import ReportTemplate, ReportTemplateVersion

# Filters a text may use: text in, text out, each bounded by its input.
SAFE_FILTERS = frozenset({"capitalize", "lower", "upper", "title", "trim", "replace", "join", "default", "string"})
# The syntax a text may use (jinja2.nodes): anything else is refused where the template is written.
_ALLOWED_NODES = (nodes.Template, nodes.Output, nodes.TemplateData, nodes.Name, nodes.Getattr, nodes.Getitem,
                  nodes.Const, nodes.Filter, nodes.If, nodes.CondExpr, nodes.Compare, nodes.Operand, nodes.And,
                  nodes.Or, nodes.Not, nodes.Test, nodes.Concat)
SAFE_TESTS = frozenset({"defined", "undefined", "none", "string", "number"})

# Where each variable has a value. A text naming one elsewhere is refused when it is written.
SUBJECT = frozenset({"subject"})
CHAPTER = frozenset({"subject", "chapter"})
MAIL = frozenset({"subject", "link", "link_days"})

# The longest text of one field; the most variables one text may print (a subject's field printed a thousand
# times would make a prompt of megabytes from a template of kilobytes); the longest a rendered text may be
# (a subject the template fills past it is refused at submit).
FIELD_MAX_CHARS = 20_000
FIELD_MAX_VARIABLES = 100
RENDERED_MAX_CHARS = 64_000


class TemplateProblem(ValueError):
    """A text that may not be a template here (refused where it is written), or one that cannot be
    rendered for this subject (refused at submit). `field` names where, as the API's error does."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field, self.message = field, message


class _Undefined(StrictUndefined):
    """Fails on any use, naming the variable the way the client wrote it (`subject.name`)."""

    __slots__ = ()

    @property
    def _undefined_message(self) -> str:
        if self._undefined_obj is not None and self._undefined_name is not None:
            return f"the subject has no {self._undefined_name!r}"
        return f"{self._undefined_name!r} has no value here"


class _Environment(SandboxedEnvironment):
    def is_safe_attribute(self, obj, attr, value):
        return not attr.startswith("_") and super().is_safe_attribute(obj, attr, value)


ENV = _Environment(undefined=_Undefined, autoescape=False, keep_trailing_newline=True, cache_size=400)


def check_source(field: str, source: str, names: frozenset[str]) -> None:
    """Refuse a text that is not a template a report may hold (see the module's docstring). Raises
    TemplateProblem naming `field`."""
    if not isinstance(source, str):
        raise TemplateProblem(field, "Must be a string.")
    if len(source) > FIELD_MAX_CHARS:
        raise TemplateProblem(field, f"At most {FIELD_MAX_CHARS} characters.")
    try:
        tree = ENV.parse(source)
    except TemplateError as exc:
        raise TemplateProblem(field, f"Not a valid template: {exc}.") from None
    for node in tree.find_all(nodes.Node):
        _check_node(field, node, names)
    if sum(1 for _ in tree.find_all(nodes.Name)) > FIELD_MAX_VARIABLES:
        raise TemplateProblem(field, f"At most {FIELD_MAX_VARIABLES} variables in one text.")


def _check_node(field: str, node, names: frozenset[str]) -> None:
    if not isinstance(node, _ALLOWED_NODES):
        raise TemplateProblem(field, f"A report's text may print variables, filter them and use `if`; "
                                     f"{type(node).__name__.lower()} is not allowed.")
    if isinstance(node, nodes.Name) and node.name not in names:
        raise TemplateProblem(field, f"Unknown variable {node.name!r}: this text may use {', '.join(sorted(names))}.")
    if isinstance(node, nodes.Getattr) and (node.attr.startswith("_") or not isinstance(node.node, (nodes.Name, nodes.Getattr, nodes.Getitem))):
        raise TemplateProblem(field, f"The attribute {node.attr!r} is not allowed: only a variable's fields.")
    if isinstance(node, nodes.Getitem) and not (isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, (str, int))
                                                and not str(node.arg.value).startswith("_")):
        raise TemplateProblem(field, "A field is read by a constant name (subject['name']), never one computed.")
    if isinstance(node, nodes.Filter) and node.name not in SAFE_FILTERS:
        raise TemplateProblem(field, f"The filter {node.name!r} is not allowed: {', '.join(sorted(SAFE_FILTERS))}.")
    if isinstance(node, nodes.Test) and node.name not in SAFE_TESTS:
        raise TemplateProblem(field, f"The test {node.name!r} is not allowed: {', '.join(sorted(SAFE_TESTS))}.")
    if isinstance(node, nodes.Const) and isinstance(node.value, str) and len(node.value) > FIELD_MAX_CHARS:
        raise TemplateProblem(field, "A constant that long is not allowed.")


@functools.lru_cache(maxsize=400)
def _compiled(source: str):
    return ENV.from_string(source)


def render(field: str, source: str, **variables) -> str:
    """The text for these variables. A variable without a value here (a field the subject lacks) raises
    TemplateProblem naming it; so does anything the sandbox refuses."""
    if "{" not in source:  # no tag at all: the text as it is (the built-in prompts; a bulk retry prices thousands)
        return source
    try:
        text = _compiled(source).render(**variables)
    except TemplateError as exc:  # UndefinedError and SecurityError are TemplateErrors
        raise TemplateProblem(field, f"{exc}.") from None
    except (TypeError, ValueError) as exc:  # a filter given what it cannot take (join of a number)
        raise TemplateProblem(field, f"{exc}.") from None
    if len(text) > RENDERED_MAX_CHARS:
        raise TemplateProblem(field, f"Rendered for this subject it is {len(text)} characters; at most {RENDERED_MAX_CHARS}.")
    return text


# --- a version -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chapter:
    key: str
    title: str  # a template (the default's derives it from the key)
    instruction: str  # a template


@dataclass(frozen=True)
class Version:
    """One version of a report template, as the engine reads it (immutable: a job pins one at submit).

    `chapters` are the version's own, in order; the built-in default has none and takes any keys the job
    names (`open_chapter` is their title and instruction, with `chapter.key` filled in)."""

    name: str
    number: int
    system: str
    synthesis: str | None
    chapters: tuple[Chapter, ...]
    synthesis_max_tokens: int
    chapter_max_tokens: int
    layout_title: str
    chapter_heading: str
    closing: str | None
    figures: bool  # the `_Figures: ..._` line under the title (the default's)
    mail_subject: str
    mail_body: str
    page_title: str
    open_chapter: Chapter | None = None

    @classmethod
    def from_body(cls, name: str, number: int, body: dict) -> "Version":
        """A version from its stored body (the API's form, as it was written)."""
        layout, mail = body.get("layout") or {}, body.get("mail") or {}
        default = DEFAULT_BODY
        tokens = body.get("max_output_tokens")
        open_chapter = body.get("open_chapter")
        return cls(
            name=name, number=number, system=body["system"], synthesis=body.get("synthesis"),
            chapters=tuple(Chapter(c["key"], c["title"], c["instruction"]) for c in body.get("chapters") or ()),
            synthesis_max_tokens=tokens or settings.REPORT_SYNTHESIS_MAX_TOKENS,
            chapter_max_tokens=tokens or settings.REPORT_CHAPTER_MAX_TOKENS,
            layout_title=layout.get("title", default["layout"]["title"]),
            chapter_heading=layout.get("chapter_heading", default["layout"]["chapter_heading"]),
            closing=layout.get("closing"), figures=bool(layout.get("figures", False)),
            mail_subject=mail.get("subject", default["mail"]["subject"]),
            mail_body=mail.get("body", default["mail"]["body"]),
            page_title=body.get("page_title") or layout.get("title", default["page_title"]),
            open_chapter=Chapter("", open_chapter["title"], open_chapter["instruction"]) if open_chapter else None,
        )

    def chapter(self, key: str) -> Chapter:
        for chapter in self.chapters:
            if chapter.key == key:
                return chapter
        if self.open_chapter is None:
            raise KeyError(key)
        return Chapter(key, self.open_chapter.title, self.open_chapter.instruction)

    def keys(self) -> list[str]:
        return [chapter.key for chapter in self.chapters]

    def longest_chapter(self, keys: list[str], subject: dict) -> str:
        """The key whose rendered instruction is the longest (the chapter a worst case prices). The built-in
        template's open chapters differ only by the key they print, so theirs is the longest key, found
        without rendering (a bulk retry's preview prices thousands of reports); a template's own chapters
        are rendered, each."""
        own = {chapter.key for chapter in self.chapters}
        if self.open_chapter is not None and not own.intersection(keys):
            return max(keys, key=len)
        return max(keys, key=lambda key: len(self.chapter_instruction(key, subject)))

    # --- its texts, rendered (the prompts' bytes must be the same in every run: they are pure functions of
    # the version, the subject and the key) ---

    def system_prompt(self, subject: dict) -> str:
        return render("system", self.system, subject=subject)

    def synthesis_instruction(self, subject: dict) -> str | None:
        return None if self.synthesis is None else render("synthesis", self.synthesis, subject=subject)

    def chapter_vars(self, key: str, subject: dict) -> dict:
        chapter = self.chapter(key)
        title = render(f"chapters.{key}.title", chapter.title, subject=subject, chapter={"key": key, "title": ""})
        return {"key": key, "title": title}

    def chapter_instruction(self, key: str, subject: dict) -> str:
        return render(f"chapters.{key}.instruction", self.chapter(key).instruction, subject=subject,
                      chapter=self.chapter_vars(key, subject))

    def heading(self, key: str, subject: dict) -> str:
        return render("layout.chapter_heading", self.chapter_heading, subject=subject,
                      chapter=self.chapter_vars(key, subject))

    def title(self, subject: dict) -> str:
        return render("layout.title", self.layout_title, subject=subject)

    def closing_text(self, subject: dict) -> str | None:
        return None if self.closing is None else render("layout.closing", self.closing, subject=subject)

    def page(self, subject: dict) -> str:
        return render("page_title", self.page_title, subject=subject)

    def mail(self, subject: dict, *, link: str) -> tuple[str, str]:
        days = settings.REPORT_LINK_MAX_AGE_S // 86400
        return (render("mail.subject", self.mail_subject, subject=subject, link=link, link_days=days),
                render("mail.body", self.mail_body, subject=subject, link=link, link_days=days))

    def check_subject(self, subject: dict, keys: list[str]) -> None:
        """Render every text a report of these chapters uses, for this subject: a variable it lacks is a
        TemplateProblem naming it, at submit, never a chapter written with a blank."""
        self.system_prompt(subject)
        self.synthesis_instruction(subject)
        self.title(subject)
        self.closing_text(subject)
        self.page(subject)
        self.mail(subject, link="https://example.invalid/r/token")
        for key in keys:
            self.chapter_instruction(key, subject)
            self.heading(key, subject)


def check_body(body: dict) -> None:
    """Every text of a version written by a client is a template a report may hold (check_source), each
    naming only the variables that have a value where it is used. Raises TemplateProblem."""
    check_source("system", body["system"], SUBJECT)
    if body.get("synthesis") is not None:
        check_source("synthesis", body["synthesis"], SUBJECT)
    for chapter in body.get("chapters") or ():
        check_source(f"chapters.{chapter['key']}.title", chapter["title"], SUBJECT)
        check_source(f"chapters.{chapter['key']}.instruction", chapter["instruction"], CHAPTER)
    layout, mail = body.get("layout") or {}, body.get("mail") or {}
    for name in ("title", "closing"):
        if layout.get(name) is not None:
            check_source(f"layout.{name}", layout[name], SUBJECT)
    if layout.get("chapter_heading") is not None:
        check_source("layout.chapter_heading", layout["chapter_heading"], CHAPTER)
    for name in ("subject", "body"):
        if mail.get(name) is not None:
            check_source(f"mail.{name}", mail[name], MAIL)
    if body.get("page_title") is not None:
        check_source("page_title", body["page_title"], SUBJECT)


# The built-in template: today's report, byte for byte (its prompts, its layout, its mail), for every report
# job that names no template. Version 1; a change to it is a new file version, never an edit in place.
DEFAULT_NAME = "default"
DEFAULT_BODY: dict = json.loads((Path(__file__).parent / "default_template.json").read_text())
DEFAULT = Version.from_body(DEFAULT_NAME, 1, DEFAULT_BODY)


# --- versions on the record (the state changes of templates) ------------------------------------------------

LIVE = "live"


class TooMany(ValueError):
    """A client at REPORT_TEMPLATES_MAX names, or a name at REPORT_TEMPLATE_VERSIONS_MAX versions."""


def version_create(*, client, name: str, body: dict, live: bool = True) -> "ReportTemplateVersion":
    """The name's next version, as written (`body` checked: check_body). The template is made by its first
    version. `live` (the default) points the template's `live` label at the new version (a template's first
    version is live whatever `live` says: a name always has one). TooMany: over the client's limits.

    The race this closes: two edits by one client at once. The client's row is locked (SELECT ... FOR
    UPDATE) before its templates are counted and a name's next number is read, so two first versions of
    one name make one template, two edits take numbers n and n+1 one after the other, and the limits hold
    whatever the concurrency. The named constraints (report_template_client_name,
    report_template_version_number) are the wall behind the lock."""
    with transaction.atomic():
        Client.objects.select_for_update().filter(id=client.id).first()
        template = ReportTemplate.objects.filter(client=client, name=name).first()
        if template is None:
            if ReportTemplate.objects.filter(client=client).count() >= settings.REPORT_TEMPLATES_MAX:
                raise TooMany(f"You have {settings.REPORT_TEMPLATES_MAX} report templates, the most allowed.")
            template = ReportTemplate.objects.create(client=client, name=name)
        last = template.versions.aggregate(n=Max("number"))["n"] or 0
        if last >= settings.REPORT_TEMPLATE_VERSIONS_MAX:
            raise TooMany(f"{name} has {last} versions, the most allowed.")
        version = ReportTemplateVersion.objects.create(template=template, number=last + 1, body=body)
        if live or last == 0:
            ReportTemplate.objects.filter(id=template.id).update(live=version.number, updated_at=timezone.now())
    return version


def version_set_live(*, client, name: str, number: int) -> int | None:
    """Point `live` at one of the template's versions. Returns the number it pointed at before (read under
    the row's lock, so an operator's audit row says what this move replaced, not what an earlier read saw);
    None: the client has no such template or version."""
    with transaction.atomic():
        template = ReportTemplate.objects.select_for_update().filter(client=client, name=name).first()
        if template is None or not template.versions.filter(number=number).exists():
            return None
        ReportTemplate.objects.filter(id=template.id).update(live=number, updated_at=timezone.now())
    return template.live


def version_row(*, client_id, name: str, number: int | None = None) -> "ReportTemplateVersion | None":
    """The client's version `number` of the template, or its live one; None when the client has none (another
    client's template of the same name is none of its own)."""
    template = ReportTemplate.objects.filter(client_id=client_id, name=name).first()
    if template is None:
        return None
    row = template.versions.filter(number=number if number is not None else template.live).first()
    if row is not None:
        row.template = template  # read already: the caller may ask where `live` points
    return row


def has_template(*, client_id, name: str) -> bool:
    return ReportTemplate.objects.filter(client_id=client_id, name=name).exists()


def templates_of(*, client_id) -> list[dict]:
    """The client's templates by name: where `live` points, and how many versions each has."""
    rows = (ReportTemplate.objects.filter(client_id=client_id).order_by("name")
            .annotate(count=Count("versions")).values_list("name", "live", "count"))
    return [{"name": name, "live": live, "versions": count} for name, live, count in rows]


@functools.lru_cache(maxsize=256)
def _version_by_id(version_id: int) -> Version:
    # A version never changes once written: what was read once is what it is.
    row = ReportTemplateVersion.objects.select_related("template").get(id=version_id)
    return Version.from_body(row.template.name, row.number, row.body)


def version_of(version_id: int | None) -> Version:
    """The version a report is written from: its pinned one, or the built-in default (None)."""
    return DEFAULT if version_id is None else _version_by_id(version_id)
