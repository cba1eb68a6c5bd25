"""A small, safe Markdown to HTML renderer for report chapters (LLM output): everything is escaped first,
so no text can inject markup; then headings, paragraphs, lists, emphasis and strong are rendered. No
dependency, no links, no images: nothing on the page is fetched from anywhere."""

import re
from html import escape

_STRONG = re.compile(r"\*\*(.+?)\*\*")
_EM = re.compile(r"(?<!\*)\*(?!\s)(.+?)(?<!\s)\*(?!\*)|_(?!\s)(.+?)(?<!\s)_")


def _inline(text: str) -> str:
    text = _STRONG.sub(r"<strong>\1</strong>", escape(text))
    return _EM.sub(lambda m: f"<em>{m.group(1) or m.group(2)}</em>", text)


def to_html(markdown: str) -> str:
    blocks, paragraph, items = [], [], []

    def flush():
        if paragraph:
            blocks.append(f"<p>{_inline(' '.join(paragraph))}</p>")
            paragraph.clear()
        if items:
            blocks.append("<ul>" + "".join(f"<li>{_inline(item)}</li>" for item in items) + "</ul>")
            items.clear()

    for line in markdown.splitlines():
        stripped = line.strip()
        heading = re.match(r"^(#{1,6})\s+(.*)$", stripped)
        if not stripped:
            flush()
        elif heading:
            flush()
            level = min(len(heading.group(1)) + 2, 6)  # the page's own h1 and h2 come first
            blocks.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
        elif re.match(r"^[-*]\s+", stripped):
            if paragraph:
                flush()
            items.append(re.sub(r"^[-*]\s+", "", stripped))
        else:
            if items:
                flush()
            paragraph.append(stripped)
    flush()
    return "\n".join(blocks)
