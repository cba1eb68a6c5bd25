"""The documents cannot rot: the README's quickstart runs, every link names a file and heading that exist,
and every document the code cites exists with the heading it names.

Every ```sh block of README.md runs, in order, in one `bash -euo pipefail` (as a reader's terminal
would: a block's variables and functions are the next block's), against the real `web` process, a
worker and the sandbox, with the README's `127.0.0.1:8000` and `127.0.0.1:8100` pointed at them and
`KEY` set to a client of the test's own. Only a block whose first line is `# not run by
tests/project/test_readme.py: <why>` is skipped (installing, `make run`, `make test`, a key to paste). Every
block that runs must show what it prints (`# prints: <line>`, where `...` stands for anything), and its
output must hold each of those lines, whole and in order: an example that stops working fails here.
The first job in each client library (```python, ```ts) runs the same way, each block on its own.
"""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jobs.services import client_create
from tests.support.books import assert_books_balance
from tests.support.procs import REPO_ROOT, process_env

README = REPO_ROOT / "README.md"
TEMPLATES_DOC = REPO_ROOT / "docs" / "report-templates.md"
DOCS = sorted((REPO_ROOT / "docs").glob("*.md"))
README_WEB = "http://127.0.0.1:8000"
README_SANDBOX = "http://127.0.0.1:8100"
SKIP_MARK = "# not run by tests/project/test_readme.py:"
PRINTS = re.compile(r"^\s*(?:#|//) prints: (.*?)\s*$", re.M)  # `//` in a TypeScript block
# The quickstart's examples: a first job (create, follow, the ledger), a failure and a retry, an order
# and its report, the month's spend. Fewer blocks running means examples were marked away.
MIN_BLOCKS_RUN = 6
BLOCK_MARKER = "::readme-block {}::"


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block, dedented (a block may sit in a list item)."""
    return [(lang, textwrap.dedent(body))
            for lang, body in re.findall(r"^[ \t]*```(\S*)[ \t]*\n(.*?)^[ \t]*```[ \t]*$", text, re.M | re.S)]


def readme_sh_blocks() -> list[str]:
    return [body for lang, body in fenced_blocks(README.read_text()) if lang == "sh"]


def expected_line(expected: str) -> re.Pattern:
    return re.compile(".*".join(re.escape(part) for part in expected.split("...")) + r"\Z")


def assert_prints(block: str, output: str) -> None:
    """Each `# prints:` line of the block is a whole line of its output, in order."""
    lines = [line.strip() for line in output.splitlines()]
    position = 0
    for expected in PRINTS.findall(block):
        pattern = expected_line(expected)
        found = next((i for i in range(position, len(lines)) if pattern.match(lines[i])), None)
        assert found is not None, f"the block\n{block}\nshould print {expected!r}; it printed:\n{output}"
        position = found + 1


def test_only_marked_blocks_are_skipped_and_every_other_one_shows_what_it_prints():
    languages = {lang for lang, _ in fenced_blocks(README.read_text())}
    # A shell example in a fence of another name (```bash, ```console, or none) would never run.
    assert languages <= {"sh", "json", "python", "ts"}, languages
    skipped, run = [], []
    for block in readme_sh_blocks():
        first = block.splitlines()[0]
        if first.startswith(SKIP_MARK):
            assert first[len(SKIP_MARK):].strip(), f"a skipped block says why: {first!r}"
            skipped.append(block)
        else:
            assert SKIP_MARK not in block, f"the mark is a block's first line, or nothing:\n{block}"
            assert PRINTS.search(block), f"a block that runs shows what it prints:\n{block}"
            # Only the two addresses the test points at its own processes.
            others = set(re.findall(r"(?:127\.0\.0\.1|localhost):\d+", block)) - {"127.0.0.1:8000", "127.0.0.1:8100"}
            assert not others, (others, block)
            run.append(block)
    assert len(run) >= MIN_BLOCKS_RUN, f"{len(run)} blocks run, {len(skipped)} skipped"
    assert any("make run" in block for block in skipped)  # the two commands are the quickstart's first


def run_sh_blocks(document: Path, web_stack, ledger, tmp_path, *, key: str, cwd: Path, env: dict | None = None) -> None:
    """Every ```sh block of `document` not marked skipped, in one bash, against the test's stack; each prints
    what it shows."""
    blocks = [body for lang, body in fenced_blocks(document.read_text())
              if lang == "sh" and not body.startswith(SKIP_MARK)]
    script = []
    for number, block in enumerate(blocks):
        assert PRINTS.search(block), f"a block that runs shows what it prints:\n{block}"
        script.append(f"printf '\\n{BLOCK_MARKER.format(number)}\\n'")
        script.append(block.replace(README_WEB, web_stack.url).replace(README_SANDBOX, ledger.url))
    script.append(f"printf '\\n{BLOCK_MARKER.format('end')}\\n'")
    path = tmp_path / "blocks.sh"
    path.write_text("\n".join(script) + "\n")
    done = subprocess.run(["bash", "-euo", "pipefail", str(path)], cwd=cwd, env={**(env or os.environ), "KEY": key},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    outputs = re.split(r"^::readme-block (\S+)::\n", done.stdout, flags=re.M)[1:]
    printed = dict(zip(outputs[::2], outputs[1::2]))
    if done.returncode != 0 or "end" not in printed:
        last = [name for name in printed if name != "end"][-1:] or ["0"]
        pytest.fail(f"{document.name} block {last[0]} stopped (exit {done.returncode}):\n{blocks[int(last[0])]}\n"
                    f"it printed:\n{printed.get(last[0], done.stdout)}")
    for number, block in enumerate(blocks):
        assert_prints(block, printed[str(number)])


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_the_readme_quickstart_runs_against_a_real_stack(web_stack, web_worker, ledger, tmp_path):
    credentials = client_create(name="readme")
    run_sh_blocks(README, web_stack, ledger, tmp_path, key=credentials["api_key"], cwd=tmp_path)
    # Every charge the examples made is one attempt of payonce's, at its recorded cost: the first
    # render, the failed one and its retry, and the report's synthesis and chapters.
    charges = assert_books_balance(ledger)
    assert sum(charge["model"] == "video-keyed" for charge in charges) == 3


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_the_report_templates_walkthrough_runs_against_a_real_stack(web_stack, web_worker, ledger, tmp_path):
    """docs/report-templates.md, run as a reader would from the project's root after `make run`: its
    `manage.py` lines find the demo client (var/demo_client.json, here the test's own client) in the
    test's database. The product it sells is one synthesis and three chapters, each paid once."""
    credentials = client_create(name="templates-walkthrough")
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "demo_client.json").write_text(json.dumps({"client_id": credentials["client_id"]}))
    env = process_env(PAYONCE_VAR_DIR=tmp_path / "var")
    run_sh_blocks(TEMPLATES_DOC, web_stack, ledger, tmp_path, key=credentials["api_key"], cwd=REPO_ROOT,
                  env={**os.environ, **env})
    charges = assert_books_balance(ledger)
    assert len(charges) == 4


@pytest.mark.e2e
@pytest.mark.xdist_group("typescript-dist")  # npm run build: see tests/clients/test_typescript_client.py
def test_the_first_job_in_each_client_library_runs_against_a_real_stack(web_stack, web_worker, ledger, tmp_path):
    """Every ```python and ```ts block of the README runs as a reader would run it (Python with the suite's
    venv, where clients/python is installed; TypeScript as an ES module on the machine's Node.js, importing
    `@payonce/client` built from clients/typescript), against the real stack, and prints what it shows."""
    key = client_create(name="readme-libraries")["api_key"]
    env = {**os.environ, "KEY": key}
    blocks = [(lang, body) for lang, body in fenced_blocks(README.read_text()) if lang in ("python", "ts")]
    assert {lang for lang, _ in blocks} == {"python", "ts"}, "the README shows a first job in each library"
    package = REPO_ROOT / "clients" / "typescript"
    build = subprocess.run(["npm", "run", "build"], cwd=package, capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stdout + build.stderr
    (tmp_path / "node_modules" / "@payonce").mkdir(parents=True)
    (tmp_path / "node_modules" / "@payonce" / "client").symlink_to(package)
    for number, (lang, body) in enumerate(blocks):
        assert PRINTS.search(body), f"a block that runs shows what it prints:\n{body}"
        source = body.replace(README_WEB, web_stack.url)
        path = tmp_path / (f"block{number}.py" if lang == "python" else f"block{number}.mjs")
        path.write_text(source)
        command = [sys.executable, str(path)] if lang == "python" else ["node", str(path)]
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"the README's {lang} block\n{body}\nfailed:\n{done.stdout}{done.stderr}"
        assert_prints(body, done.stdout)
    charges = assert_books_balance(ledger)
    assert len(charges) == len(blocks)  # one render each, paid once


# --- links and citations -------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, code marks and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+?)\s*$", text, re.M):
        base = slug(heading)
        count = seen.get(base, 0)
        found.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return found


def links(path: Path) -> list[str]:
    text = re.sub(r"^[ \t]*```.*?^[ \t]*```", "", path.read_text(), flags=re.M | re.S)
    text = re.sub(r"``.*?``|`[^`\n]*`", "code", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("document", [README, *DOCS], ids=lambda path: str(path.relative_to(REPO_ROOT)))
def test_every_relative_link_names_a_file_and_a_heading_that_exist(document):
    for target in links(document):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file_part, _, anchor = target.partition("#")
        linked = (document.parent / file_part).resolve() if file_part else document
        assert linked.exists(), f"{document.name}: {target} names no file"
        if anchor and linked.suffix == ".md":
            assert anchor in anchors(linked), f"{document.name}: {target}: no such heading in {linked.name}"


# --- what the code cites ---------------------------------------------------------------------------------

# The specification payonce was built from lives outside the repository: citing it sends a reader nowhere.
OUTSIDE_DOCUMENTS = re.compile("|".join(re.escape(name + ".md") for name in ("DESIGN", "API", "STYLE")))
# (docs/design.md, "Keys have a lifetime"): a document, and optionally the heading it names, in quotes.
CITATION = re.compile(r"(docs/[\w./-]+\.md)(?:,\s*\(?\"([^\"]+)\")?")


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    found = []
    for name in names.splitlines():
        path = REPO_ROOT / name
        if path.suffix in (".svg", ".png") or not path.is_file():
            continue
        try:
            found.append((path, path.read_text()))
        except UnicodeDecodeError:
            continue
    return found


def test_every_document_the_code_cites_exists_with_the_heading_it_names():
    cited = 0
    for path, text in tracked_text_files():
        where = path.relative_to(REPO_ROOT)
        assert not OUTSIDE_DOCUMENTS.search(text), f"{where} cites a document that is not in the repository"
        for document, section in CITATION.findall(text):
            cited += 1
            assert (REPO_ROOT / document).is_file(), f"{where} cites {document}, which does not exist"
            if section:
                headings = {slug(h) for h in re.findall(r"^#{1,6} (.+?)\s*$", (REPO_ROOT / document).read_text(), re.M)}
                assert slug(" ".join(section.split())) in headings, f"{where}: {document} has no heading {section!r}"
    assert cited >= 60  # the code's citations of design, API, operating and sandbox sections (83 when written)
