"""What a release's OpenAPI document breaks for a client written against the document before it, and
which of those breaks the release's CHANGELOG.md entry owns up to (tests/project/test_release_openapi.py).

A client writes requests and reads answers. A request the old document allowed must still be allowed
(nothing removed, renamed, newly required or narrowed); an answer must still be what the old document
promised (no field gone, none made nullable or of another type, no success status gone). Widening is
free: a new optional field, a new enum value in a request, a looser bound.

Each finding names its place as a changelog bullet names it: `POST /v1/orders request input.email`
(`<METHOD> <path> request|response <field>`, an array's items as `[]`; `query|path|header <name>` for a
parameter; `status <code>`; the operation alone when it is gone). A bullet of the current version's
section of CHANGELOG.md, `- **Breaking** <place>: <why>`, allows every finding at that place or under it."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
# A request bound that, newly set or moved this way, refuses a value the old document allowed.
TIGHTER_WHEN_LOWER = ("maxLength", "maxItems", "maxProperties", "maximum")
TIGHTER_WHEN_HIGHER = ("minLength", "minItems", "minProperties", "minimum")


@dataclass(frozen=True)
class Finding:
    place: str  # as a changelog bullet names it: "POST /v1/orders request input.email"
    pointer: str  # where in the documents: a JSON pointer, through the $refs followed (" -> ")
    change: str  # what changed, in words

    def __str__(self) -> str:
        return f"{self.place}: {self.change} (at {self.pointer})"


def breaking_changes(old: dict, new: dict) -> list[Finding]:
    """Every change from `old` to `new` that breaks a client written against `old`."""
    return _Compare(old, new).run()


def allowed_places(changelog: str, version: str) -> list[str]:
    """The places the `## <version>` section of a changelog marks `**Breaking**` (see the module's docstring)."""
    section = re.search(rf"^## {re.escape(version)}\b.*?$(.*?)(?=^## |\Z)", changelog, re.M | re.S)
    if section is None:
        return []
    bullet = re.compile(r"^\s*[-*]\s+\*\*Breaking\*\*\s+(?P<place>(?:%s) /[^:\n]*?)\s*:" % "|".join(
        method.upper() for method in METHODS), re.M)
    return [match["place"] for match in bullet.finditer(section.group(1))]


def not_allowed(findings: list[Finding], places: list[str]) -> list[Finding]:
    """The findings no place of `places` covers: a place covers itself and whatever lies under it."""
    return [finding for finding in findings if not any(_under(finding.place, place) for place in places)]


def _under(place: str, prefix: str) -> bool:
    """`place` lies under `prefix`: the same, or `prefix` followed by a field, an item or a word."""
    return place == prefix or (place.startswith(prefix) and place[len(prefix)] in " .[")


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


class _Compare:
    def __init__(self, old: dict, new: dict):
        self.old, self.new = old, new
        self.findings: list[Finding] = []

    def run(self) -> list[Finding]:
        new_paths = {_template(path): path for path in self.new.get("paths", {})}
        for path, old_item in self.old.get("paths", {}).items():
            new_item = self.new["paths"].get(new_paths.get(_template(path), path))
            for method in METHODS:
                if method not in old_item:
                    continue
                operation = f"{method.upper()} {path}"
                pointer = f"#/paths/{_escape(path)}/{method}"
                if new_item is None or method not in new_item:
                    self.found(operation, pointer, "the operation is gone")
                    continue
                self.operation(operation, pointer, old_item, new_item, method)
        return self.findings

    def found(self, place: str, pointer: str, change: str) -> None:
        self.findings.append(Finding(place, pointer, change))

    # --- an operation -----------------------------------------------------------------------------------

    def operation(self, name: str, pointer: str, old_item: dict, new_item: dict, method: str) -> None:
        old, new = old_item[method], new_item[method]
        old_params = self.parameters(old_item, old, self.old)
        new_params = self.parameters(new_item, new, self.new)
        for key, param in old_params.items():
            place, at = f"{name} {param['in']} {param['name']}", f"{pointer}/parameters[{param['in']} {param['name']}]"
            if key not in new_params:
                self.found(place, at, "the parameter is gone")
                continue
            if new_params[key].get("required") and not param.get("required"):
                self.found(place, at, "the parameter is newly required")
            if "schema" in param and "schema" in new_params[key]:
                self.schema(place, f"{at}/schema", param["schema"], new_params[key]["schema"], request=True, field="")
        for key, param in new_params.items():
            if key not in old_params and param.get("required"):
                self.found(f"{name} {param['in']} {param['name']}", f"{pointer}/parameters[{param['in']} {param['name']}]",
                           "a new required parameter")

        old_body = self.resolve(old.get("requestBody"), self.old)
        new_body = self.resolve(new.get("requestBody"), self.new)
        if new_body and new_body.get("required") and not (old_body and old_body.get("required")):
            self.found(f"{name} request", f"{pointer}/requestBody", "a request body is newly required")
        if old_body:
            for media, content in old_body.get("content", {}).items():
                at = f"{pointer}/requestBody/content/{_escape(media)}"
                theirs = (new_body or {}).get("content", {}).get(media)
                if theirs is None:
                    self.found(f"{name} request", at, f"a request body of type {media} is no longer taken")
                elif "schema" in content and "schema" in theirs:
                    self.schema(f"{name} request", f"{at}/schema", content["schema"], theirs["schema"],
                                request=True, field="")

        new_responses = new.get("responses", {})
        for status, old_response in old.get("responses", {}).items():
            at = f"{pointer}/responses/{status}"
            if status not in new_responses:
                if str(status).startswith("2"):
                    self.found(f"{name} status {status}", at, f"the success status {status} is gone")
                continue
            old_response = self.resolve(old_response, self.old)
            new_response = self.resolve(new_responses[status], self.new)
            for header, spec in old_response.get("headers", {}).items():
                if self.resolve(spec, self.old).get("required") and header not in new_response.get("headers", {}):
                    self.found(f"{name} response {header}", f"{at}/headers/{header}",
                               f"the answer's required header {header} is gone")
            for media, content in old_response.get("content", {}).items():
                theirs = new_response.get("content", {}).get(media)
                media_at = f"{at}/content/{_escape(media)}"
                if theirs is None:
                    self.found(f"{name} status {status}", media_at, f"the {status} answer is no longer {media}")
                elif "schema" in content and "schema" in theirs:
                    self.schema(f"{name} response", f"{media_at}/schema", content["schema"], theirs["schema"],
                                request=False, field="")

    def parameters(self, item: dict, operation: dict, document: dict) -> dict[tuple[str, str], dict]:
        """The operation's parameters (the path item's, overridden by its own), by (in, name); a path
        parameter by its position, since renaming `{id}` to `{job_id}` changes nothing for a client."""
        found: dict[tuple[str, str], dict] = {}
        path_params = 0
        for param in [*item.get("parameters", []), *operation.get("parameters", [])]:
            param = self.resolve(param, document)
            if param["in"] == "path":
                path_params += 1
                found[("path", f"#{path_params}")] = param
            else:
                found[(param["in"], param["name"])] = param
        return found

    @staticmethod
    def resolve(node: Any, document: dict) -> Any:
        """A `$ref` followed, in the document it was found in, to a non-reference."""
        for _ in range(32):
            if not (isinstance(node, dict) and "$ref" in node):
                return node
            node = _pointer(document, node["$ref"])
        raise ValueError("a $ref chain longer than 32")

    # --- a schema ---------------------------------------------------------------------------------------

    def schema(self, place: str, pointer: str, old: Any, new: Any, *, request: bool, field: str,
               seen: frozenset = frozenset()) -> None:
        """Compare one schema of a request (the client writes: the new must take all the old took) or of
        an answer (the client reads: the new must give only what the old promised)."""
        pair = (json.dumps(old, sort_keys=True), json.dumps(new, sort_keys=True), request)
        if pair in seen:  # a recursive schema: this pair is being compared further up
            return
        seen = seen | {pair}
        pointer = _named(new) or pointer
        old, new = self.flat(old, self.old), self.flat(new, self.new)
        if request:
            self.request(place, field, pointer, old, new)
        else:
            self.response(f"{place} {field}" if field else place, pointer, old, new)
        self.children(place, pointer, old, new, request=request, field=field, seen=seen)

    def flat(self, node: Any, document: dict) -> dict:
        """A schema with its $ref followed and its allOf merged (drf-spectacular writes a nullable or
        described reference as `allOf: [{$ref}]`)."""
        node = self.resolve(node, document)
        if not isinstance(node, dict):
            return {}
        if "allOf" not in node:
            return node
        merged = {key: value for key, value in node.items() if key != "allOf"}
        for part in node["allOf"]:
            part = self.flat(part, document)
            for key, value in part.items():
                if key == "properties":
                    merged["properties"] = {**value, **merged.get("properties", {})}
                elif key == "required":
                    merged["required"] = sorted({*value, *merged.get("required", [])})
                else:
                    merged.setdefault(key, value)
        return merged

    def request(self, place: str, field: str, pointer: str, old: dict, new: dict) -> None:
        here = f"{place} {field}" if field else place
        old_type, new_type = old.get("type"), new.get("type")
        if new_type is not None and old_type != new_type and not (old_type == "integer" and new_type == "number"):
            self.found(here, pointer, f"the type is {new_type}, was {old_type or 'anything'}")
        if "enum" in new:
            gone = [value for value in old.get("enum", []) if value not in new["enum"]]
            if "enum" not in old:
                self.found(here, pointer, f"newly limited to the values {new['enum']}")
            elif gone:
                self.found(here, pointer, f"no longer takes the values {gone}")
        for bound in TIGHTER_WHEN_LOWER + TIGHTER_WHEN_HIGHER:
            if bound not in new:
                continue
            if bound not in old:
                self.found(here, pointer, f"a new {bound} of {new[bound]}")
            elif (new[bound] < old[bound]) if bound in TIGHTER_WHEN_LOWER else (new[bound] > old[bound]):
                self.found(here, pointer, f"{bound} is {new[bound]}, was {old[bound]}")
        for exclusive in ("exclusiveMaximum", "exclusiveMinimum"):
            if new.get(exclusive) is True and not old.get(exclusive):
                self.found(here, pointer, f"{exclusive} is newly set")
        if "pattern" in new and new["pattern"] != old.get("pattern"):
            self.found(here, pointer, f"the pattern is {new['pattern']!r}, was {old.get('pattern', 'none')!r}")
        if "format" in new and new["format"] != old.get("format"):
            self.found(here, pointer, f"the format is {new['format']}, was {old.get('format', 'none')}")
        if old.get("nullable") and not new.get("nullable"):
            self.found(here, pointer, "null is no longer taken")
        if new.get("additionalProperties") is False and old.get("additionalProperties") is not False:
            self.found(here, pointer, "other properties are newly refused (additionalProperties: false)")
        old_required, new_required = set(old.get("required", [])), set(new.get("required", []))
        for name in sorted(new_required - old_required):
            known = name in old.get("properties", {})
            self.found(f"{place} {_join(field, name)}", f"{pointer}/properties/{_escape(name)}",
                       "the field is newly required" if known else "a new required field")
        for branch in self.branches(old) - self.branches(new):
            self.found(here, pointer, f"the {branch[0]} branch {branch[1]} is gone")

    def response(self, here: str, pointer: str, old: dict, new: dict) -> None:
        old_type, new_type = old.get("type"), new.get("type")
        if old_type is not None and old_type != new_type and not (old_type == "number" and new_type == "integer"):
            self.found(here, pointer, f"the type is {new_type or 'anything'}, was {old_type}")
        if new.get("nullable") and not old.get("nullable"):
            self.found(here, pointer, "may now be null")

    def children(self, place: str, pointer: str, old: dict, new: dict, *, request: bool, field: str,
                 seen: frozenset) -> None:
        old_props, new_props = old.get("properties", {}), new.get("properties", {})
        skip = "readOnly" if request else "writeOnly"  # not part of what the client writes, or reads
        for name, old_prop in old_props.items():
            if self.flat(old_prop, self.old).get(skip):
                continue
            child = _join(field, name)
            here = f"{place} {child}"
            at = f"{pointer}/properties/{_escape(name)}"
            if name not in new_props:
                self.found(here, at, "the field is gone" if request else "the field is gone from the answer")
                continue
            if not request and name in old.get("required", []) and name not in new.get("required", []):
                self.found(here, at, "the field is no longer always in the answer")
            self.schema(place, at, old_prop, new_props[name], request=request, field=child, seen=seen)
        if "items" in old and "items" in new:
            self.schema(place, f"{pointer}/items", old["items"], new["items"], request=request,
                        field=f"{field}[]", seen=seen)
        old_extra, new_extra = old.get("additionalProperties"), new.get("additionalProperties")
        if isinstance(old_extra, dict) and isinstance(new_extra, dict) and old_extra and new_extra:
            self.schema(place, f"{pointer}/additionalProperties", old_extra, new_extra, request=request,
                        field=_join(field, "*"), seen=seen)
        new_branches = {self.branch_key(kind, branch): branch for kind in ("oneOf", "anyOf")
                        for branch in new.get(kind, [])}
        for kind in ("oneOf", "anyOf"):
            for branch in old.get(kind, []):
                key = self.branch_key(kind, branch)
                if key in new_branches and "$ref" in branch:
                    self.schema(place, branch["$ref"], branch, new_branches[key], request=request, field=field,
                                seen=seen)

    def branches(self, schema: dict) -> set[tuple[str, str]]:
        return {self.branch_key(kind, branch) for kind in ("oneOf", "anyOf") for branch in schema.get(kind, [])}

    @staticmethod
    def branch_key(kind: str, branch: dict) -> tuple[str, str]:
        """A branch by the component it names, else by its whole text."""
        return kind, branch["$ref"].rsplit("/", 1)[-1] if "$ref" in branch else json.dumps(branch, sort_keys=True)


def _named(schema: Any) -> str | None:
    """The component a schema is: a `$ref`, or one wrapped alone in an `allOf` (nullable, described)."""
    if isinstance(schema, dict) and "$ref" in schema:
        return schema["$ref"]
    parts = schema.get("allOf", []) if isinstance(schema, dict) else []
    return parts[0]["$ref"] if len(parts) == 1 and "$ref" in parts[0] else None


def _join(field: str, name: str) -> str:
    return f"{field}.{name}" if field else name


def _template(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path)


def _pointer(document: dict, ref: str) -> Any:
    if not ref.startswith("#/"):
        raise ValueError(f"only local $refs are followed, not {ref}")
    node: Any = document
    for token in ref[2:].split("/"):
        node = node[token.replace("~1", "/").replace("~0", "~")]
    return node
