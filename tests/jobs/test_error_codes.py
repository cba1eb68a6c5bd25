"""Every error code the API answers with is in jobs.api.errors.ERROR_CODES (the OpenAPI document's
`ErrorCode` enum, from which the client libraries take their error classes) and in docs/api.md's table,
and the list holds no code nothing answers with. Likewise a job's own codes (`job.error.code`):
jobs.engine.outcomes.JobErrorCode is docs/api.md's table of them, and no code is written as a string."""

import ast
import re
from pathlib import Path

import pytest

from jobs.api import errors
from jobs.engine.outcomes import JobErrorCode, JobFailure

ROOT = Path(__file__).resolve().parents[2]
APPS = ("config", "jobs", "orders", "executor", "webhooks", "billing", "accounts")
# Calls whose argument at this position is an answer's error code.
CODE_ARGUMENT = {"error_body": 0, "_refuse": 2, "Refused": 1, "Answer": 1, "_error_response": 1}
# Codes of routes outside the API document (/metrics), which it does not describe.
OUTSIDE_THE_DOCUMENT = {"METRICS_UNAUTHORIZED", "METRICS_FORBIDDEN"}


def _called(node: ast.Call) -> str:
    return node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")


def codes_in_source() -> set[str]:
    found = set()
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and _called(node) in CODE_ARGUMENT:
                    position = CODE_ARGUMENT[_called(node)]
                    argument = node.args[position] if len(node.args) > position else None
                    # Other calls share these names (a URL check's Refused says why in words): a code is
                    # an upper-case constant.
                    if isinstance(argument, ast.Constant) and re.fullmatch(r"[A-Z][A-Z_]+", str(argument.value)):
                        found.add(argument.value)
    found |= {cls.code for cls in _subclasses(errors.ApiError)}
    found |= set(errors._DRF_CODES.values()) | {"ERROR"}  # ERROR: the handler's fallback
    return found


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_code_answered_is_listed_and_every_listed_code_is_answered():
    answered = codes_in_source()
    assert "CALLBACK_EARLY" in answered and "REQUEST_TIMEOUT" in answered  # the walk sees every kind of site
    assert answered - set(errors.ERROR_CODES) == set()
    assert set(errors.ERROR_CODES) - answered == set()
    assert len(errors.ERROR_CODES) == len(set(errors.ERROR_CODES))


def test_docs_table_names_every_code():
    text = (ROOT / "docs" / "api.md").read_text()
    table = text.split("## Every error code", 1)[1].split("\n## ", 1)[0]
    code_cells = [row.split("|")[2] for row in table.splitlines() if row.startswith("| ")]
    documented = set(re.findall(r"`([A-Z][A-Z_]+)`", "".join(code_cells)))
    assert set(errors.ERROR_CODES) - documented == set()
    assert documented - set(errors.ERROR_CODES) - OUTSIDE_THE_DOCUMENT == set()


def test_every_answer_of_the_callbacks_endpoint_is_in_its_table_and_in_every_error_code_with_its_status():
    answered = set()
    # The doorbell's own answers, and those of a provider's own verifier (its folder's callbacks.py: fal's).
    modules = [ROOT / "executor" / "callbacks.py", *sorted((ROOT / "executor" / "providers").glob("*/callbacks.py"))]
    for node in (node for module in modules for node in ast.walk(ast.parse(module.read_text()))):
        if isinstance(node, ast.Call) and _called(node) in ("Refused", "Answer") and len(node.args) >= 2:
            status, code = node.args[0], node.args[1]
            if isinstance(status, ast.Constant) and isinstance(code, ast.Constant):
                answered.add((status.value, code.value))
    assert (503, "CALLBACK_UNVERIFIED") in answered and (400, "CALLBACK_UNVERIFIED") in answered

    text = (ROOT / "docs" / "api.md").read_text()
    callbacks = text.split("## Provider callbacks", 1)[1].split("\n## ", 1)[0]
    every = text.split("## Every error code", 1)[1].split("\n## ", 1)[0]
    for status, code in sorted(answered):
        if not code.isupper():  # a status word (`rung`): the table shows its body
            assert f'| `{status} {{"status": "{code}"}}` |' in callbacks, (status, code)
            continue
        assert f"| `{status} {code}` |" in callbacks, (status, code)
        rows = [row.split("|") for row in every.splitlines() if row.startswith("| ")]
        assert [row for row in rows if row[1].strip() == str(status) and f"`{code}`" in row[2]], (status, code)


# --- a job's own error codes (job.error.code): jobs.engine.outcomes.JobErrorCode ----------------------------------

def _job_code_table() -> set[str]:
    text = (ROOT / "docs" / "api.md").read_text()
    table = text.split("## Job statuses and error codes", 1)[1].split("\n## ", 1)[0]
    return {match for row in table.splitlines() if row.startswith("| `")
            for match in re.findall(r"`([A-Z][A-Z_]+)`", row.split("|")[1])}


def test_docs_job_error_code_table_is_the_enum():
    documented = _job_code_table()
    assert "CHAPTER_FAILED" in documented and "UNCERTAIN_SUBMIT" in documented  # the table was found
    assert documented == set(JobErrorCode)


def test_no_job_error_code_is_a_string_literal_and_every_code_is_raised_somewhere():
    # A code written as a string (a JobFailure's, a policy table's, an `error` dict's) is one the enum
    # does not hold the documents to. jobs/api/errors.py answers OUTPUT_KEY_CONFLICT of its own: the API's
    # 409 of the same name, at submit (ERROR_CODES).
    literals, used = [], set()
    for app in APPS + ("operators",):
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" in path.parts or path == ROOT / "jobs" / "engine" / "outcomes.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and node.value in JobErrorCode.__members__.values():
                    if not (path.name == "errors.py" and node.value == "OUTPUT_KEY_CONFLICT"):
                        literals.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value}")
                if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                        and node.value.id == "JobErrorCode"):
                    used.add(node.attr)
    assert literals == []
    # INTERNAL_INPUT_ERROR is raised through JobInputError.CODE (jobs.engine.outcomes itself).
    assert set(JobErrorCode.__members__) - used == {"INTERNAL_INPUT_ERROR"}


def test_a_job_failure_refuses_a_code_outside_the_enum():
    assert JobFailure("CHAPTER_FAILED", "words").code is JobErrorCode.CHAPTER_FAILED
    with pytest.raises(ValueError):
        JobFailure("CHAPTER_FAILD", "a typo")
