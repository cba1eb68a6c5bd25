"""No client broken by a release, as far as the documents tell (issue 42): clients/openapi.json against
the previous release's (deploy/previous-release), every break found by tests/support/openapi_compat.py
allowed only where this version's CHANGELOG.md section marks it **Breaking**. The comparator itself is
tested on small planted documents: each kind of break found, widenings not, a marked break allowed.

What a document cannot say (a field it types as any object, such as an order's `input`, refusing a key
it took before) is left to the previous release's client libraries, run against this server
(tests/clients/test_previous_release_clients.py)."""

from __future__ import annotations

import copy
import json

import pytest

import payonce
from tests.support.openapi_compat import Finding, allowed_places, breaking_changes, not_allowed
from tests.support.previous_release import previous
from tests.support.procs import REPO_ROOT

SPECTACULAR = ".venv/bin/python manage.py spectacular --format openapi-json --file clients/openapi.json"


def test_no_unmarked_break_from_the_previous_release():
    release = previous()
    old = json.loads(release.show("clients/openapi.json"))
    new = json.loads((REPO_ROOT / "clients" / "openapi.json").read_text())
    places = allowed_places((REPO_ROOT / "CHANGELOG.md").read_text(), payonce.__version__)

    unmarked = not_allowed(breaking_changes(old, new), places)

    assert not unmarked, (
        f"clients/openapi.json breaks clients of {release.version} ({release.commit[:7]}) where CHANGELOG.md's "
        f"{payonce.__version__} section does not say so (its head says how to mark a deliberate break; the "
        f"document is regenerated with `{SPECTACULAR}`):\n" + "\n".join(map(str, unmarked)))


def test_the_changelog_has_a_section_for_this_version():
    """Else every marked break would go unread, and every unmarked one be reported against nothing."""
    assert f"\n## {payonce.__version__} " in (REPO_ROOT / "CHANGELOG.md").read_text()


# --- the comparator, on planted documents -----------------------------------------------------------------

OLD = {
    "openapi": "3.0.3",
    "paths": {
        "/v1/orders": {"post": {
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/OrderCreateRequest"}}}},
            "responses": {"201": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Order"}}}},
                          "200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Order"}}}},
                          "422": {"content": {"application/json": {"schema": {"type": "object"}}}}}}},
        "/v1/orders/{order_id}": {"get": {
            "parameters": [{"in": "path", "name": "order_id", "required": True, "schema": {"type": "string"}},
                           {"in": "query", "name": "expand", "schema": {"type": "string"}}],
            "responses": {"200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Order"}}}}}}},
    },
    "components": {"schemas": {
        "OrderCreateRequest": {"type": "object", "properties": {
            "payment_id": {"type": "string", "maxLength": 255},
            "product": {"$ref": "#/components/schemas/Product"},
            "input": {"type": "object", "properties": {"email": {"type": "string", "format": "email"},
                                                       "chapters": {"type": "array", "items": {"type": "string"}}}},
            "notes": {"type": "string", "nullable": True},
            "quantity": {"type": "integer", "minimum": 1}},
            "required": ["payment_id", "product"]},
        "Product": {"type": "string", "enum": ["natal-chart", "garden-plan"]},
        "Order": {"type": "object", "properties": {
            "id": {"type": "string", "format": "uuid"},
            "status": {"type": "string", "enum": ["paid", "duplicate"]},
            "job_id": {"type": "string", "format": "uuid"},
            "job": {"allOf": [{"$ref": "#/components/schemas/OrderJob"}], "readOnly": True}},
            "required": ["id", "status", "job_id"]},
        "OrderJob": {"type": "object", "properties": {"status": {"type": "string"}, "cost": {"type": "number"}}},
    }},
}


def changed(edit) -> dict:
    new = copy.deepcopy(OLD)
    edit(new["components"]["schemas"], new["paths"])
    return new


def places(findings: list[Finding]) -> list[str]:
    return sorted(finding.place for finding in findings)


def test_an_unchanged_document_breaks_nothing():
    assert breaking_changes(OLD, copy.deepcopy(OLD)) == []


BREAKS = {
    "a request field removed": (
        lambda s, p: s["OrderCreateRequest"]["properties"]["input"]["properties"].pop("email"),
        "POST /v1/orders request input.email", "the field is gone"),
    "a request field renamed": (
        lambda s, p: s["OrderCreateRequest"]["properties"].__setitem__(
            "payment", s["OrderCreateRequest"]["properties"].pop("payment_id")),
        "POST /v1/orders request payment_id", "the field is gone"),
    "a request field newly required": (
        lambda s, p: s["OrderCreateRequest"]["required"].append("notes"),
        "POST /v1/orders request notes", "the field is newly required"),
    "a new required request field": (
        lambda s, p: (s["OrderCreateRequest"]["properties"].__setitem__("run_id", {"type": "string"}),
                      s["OrderCreateRequest"]["required"].append("run_id")),
        "POST /v1/orders request run_id", "a new required field"),
    "a request type narrowed": (
        lambda s, p: s["OrderCreateRequest"]["properties"]["notes"].__setitem__("type", "integer"),
        "POST /v1/orders request notes", "the type is integer, was string"),
    "a request enum value removed": (
        lambda s, p: s["Product"]["enum"].remove("garden-plan"),
        "POST /v1/orders request product", "no longer takes the values ['garden-plan']"),
    "a maxLength lowered": (
        lambda s, p: s["OrderCreateRequest"]["properties"]["payment_id"].__setitem__("maxLength", 64),
        "POST /v1/orders request payment_id", "maxLength is 64, was 255"),
    "a new maxItems on an array's": (
        lambda s, p: s["OrderCreateRequest"]["properties"]["input"]["properties"]["chapters"].__setitem__("maxItems", 3),
        "POST /v1/orders request input.chapters", "a new maxItems of 3"),
    "an array item's pattern": (
        lambda s, p: s["OrderCreateRequest"]["properties"]["input"]["properties"]["chapters"]["items"].__setitem__(
            "pattern", "^[a-z]+$"),
        "POST /v1/orders request input.chapters[]", "the pattern is '^[a-z]+$', was 'none'"),
    "a minimum raised": (
        lambda s, p: s["OrderCreateRequest"]["properties"]["quantity"].__setitem__("minimum", 2),
        "POST /v1/orders request quantity", "minimum is 2, was 1"),
    "nullable dropped from a request field": (
        lambda s, p: s["OrderCreateRequest"]["properties"]["notes"].pop("nullable"),
        "POST /v1/orders request notes", "null is no longer taken"),
    "additionalProperties newly false": (
        lambda s, p: s["OrderCreateRequest"]["properties"]["input"].__setitem__("additionalProperties", False),
        "POST /v1/orders request input", "other properties are newly refused (additionalProperties: false)"),
    "a path removed": (
        lambda s, p: p.pop("/v1/orders/{order_id}"),
        "GET /v1/orders/{order_id}", "the operation is gone"),
    "a method removed": (
        lambda s, p: p["/v1/orders"].__setitem__("get", p["/v1/orders"].pop("post")),
        "POST /v1/orders", "the operation is gone"),
    "a query parameter removed": (
        lambda s, p: p["/v1/orders/{order_id}"]["get"]["parameters"].pop(),
        "GET /v1/orders/{order_id} query expand", "the parameter is gone"),
    "a success status removed": (
        lambda s, p: p["/v1/orders"]["post"]["responses"].pop("200"),
        "POST /v1/orders status 200", "the success status 200 is gone"),
    "a response field removed": (
        lambda s, p: s["OrderJob"]["properties"].pop("cost"),
        "GET /v1/orders/{order_id} response job.cost", "the field is gone from the answer"),
    "a response field made nullable": (
        lambda s, p: s["Order"]["properties"]["job_id"].__setitem__("nullable", True),
        "GET /v1/orders/{order_id} response job_id", "may now be null"),
    "a response field's type changed": (
        lambda s, p: s["Order"]["properties"]["id"].__setitem__("type", "integer"),
        "GET /v1/orders/{order_id} response id", "the type is integer, was string"),
    "a response field no longer required": (
        lambda s, p: s["Order"]["required"].remove("job_id"),
        "GET /v1/orders/{order_id} response job_id", "the field is no longer always in the answer"),
}


@pytest.mark.parametrize("kind", BREAKS)
def test_a_break_is_found_naming_its_place_and_what_changed(kind):
    edit, place, change = BREAKS[kind]

    findings = breaking_changes(OLD, changed(edit))

    assert place in places(findings), findings
    assert any(f.place == place and f.change == change for f in findings), findings
    assert all(f.pointer.startswith("#/") for f in findings), findings


def test_a_removed_oneof_branch_of_a_request_is_found():
    def two_kinds(s, p):
        s["OrderCreateRequest"]["properties"]["input"] = {"oneOf": [
            {"$ref": "#/components/schemas/OrderJob"}, {"$ref": "#/components/schemas/Product"}]}
    old = changed(two_kinds)
    new = copy.deepcopy(old)
    new["components"]["schemas"]["OrderCreateRequest"]["properties"]["input"]["oneOf"].pop()

    findings = breaking_changes(old, new)

    assert [(f.place, f.change) for f in findings] == [
        ("POST /v1/orders request input", "the oneOf branch Product is gone")], findings


def test_a_response_field_removed_is_found_in_every_answer_naming_the_component():
    findings = breaking_changes(OLD, changed(lambda s, p: s["Order"]["properties"].pop("status")))

    assert places(findings) == ["GET /v1/orders/{order_id} response status"] + ["POST /v1/orders response status"] * 2
    assert {f.pointer for f in findings} == {"#/components/schemas/Order/properties/status"}


WIDENINGS = {
    "a new optional request field": lambda s, p: s["OrderCreateRequest"]["properties"].__setitem__(
        "run_id", {"type": "string"}),
    "a new enum value in a request": lambda s, p: s["Product"]["enum"].append("tarot"),
    "a maxLength raised": lambda s, p: s["OrderCreateRequest"]["properties"]["payment_id"].__setitem__(
        "maxLength", 1000),
    "a request field no longer required": lambda s, p: s["OrderCreateRequest"]["required"].remove("product"),
    "a request field made nullable": lambda s, p: s["OrderCreateRequest"]["properties"]["quantity"].__setitem__(
        "nullable", True),
    "an integer taking any number": lambda s, p: s["OrderCreateRequest"]["properties"]["quantity"].__setitem__(
        "type", "number"),
    "a new response field": lambda s, p: s["Order"]["properties"].__setitem__("run_id", {"type": "string"}),
    "a response field newly required": lambda s, p: s["OrderJob"].__setitem__("required", ["status"]),
    "a new operation": lambda s, p: p.__setitem__("/v1/refunds", {"post": {"responses": {}}}),
    "a new success status": lambda s, p: p["/v1/orders"]["post"]["responses"].__setitem__("202", {}),
    "an error status gone": lambda s, p: p["/v1/orders"]["post"]["responses"].pop("422"),
    "a path parameter renamed": lambda s, p: (
        p.__setitem__("/v1/orders/{id}", p.pop("/v1/orders/{order_id}")),
        p["/v1/orders/{id}"]["get"]["parameters"][0].__setitem__("name", "id")),
}


@pytest.mark.parametrize("kind", WIDENINGS)
def test_a_widening_breaks_nothing(kind):
    assert breaking_changes(OLD, changed(WIDENINGS[kind])) == []


CHANGELOG = """# Changelog

How to mark a break: `- **Breaking** <METHOD> <path> request|response <field>: why`.

## 0.43.0 (in progress)

- **Breaking** POST /v1/orders request input.email: an order's input no longer carries the buyer's email;
  send it as the order's own `email`.
- **Breaking** GET /v1/orders/{order_id}: gone, read the order from its job.
- Operators: **Breaking** nothing marked this way names an operation.

## 0.42.0 (2026-12-20)

- **Breaking** POST /v1/orders request payment_id: a bullet of an older release allows nothing now.
"""


def test_a_break_the_changelog_marks_is_allowed_and_only_that_one():
    def three_breaks(s, p):
        s["OrderCreateRequest"]["properties"]["input"]["properties"].pop("email")
        s["OrderCreateRequest"]["properties"]["payment_id"]["maxLength"] = 64
        p.pop("/v1/orders/{order_id}")

    findings = breaking_changes(OLD, changed(three_breaks))
    marked = allowed_places(CHANGELOG, "0.43.0")

    assert marked == ["POST /v1/orders request input.email", "GET /v1/orders/{order_id}"]
    assert [(f.place, f.change) for f in not_allowed(findings, marked)] == [
        ("POST /v1/orders request payment_id", "maxLength is 64, was 255")]


def test_a_mark_covers_what_lies_under_its_place_and_nothing_beside_it():
    finding = Finding("POST /v1/orders request input.email", "#/x", "the field is gone")
    beside = Finding("POST /v1/orders request inputs", "#/x", "the field is gone")
    other_path = Finding("POST /v1/orders/{id}/refund request input", "#/x", "the field is gone")

    assert not_allowed([finding, beside, other_path], ["POST /v1/orders request input"]) == [beside, other_path]
    assert not_allowed([finding], ["POST /v1/orders"]) == []
