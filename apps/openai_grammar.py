"""A request's output constraint for `specedge serve`: OpenAI's `response_format`, or one of the extensions
`json_schema` (a schema object), `grammar` (GBNF; llama.cpp's server names both) and our `regex`, as a runtime
Grammar; at most one per request, every key checked (an unknown one is refused naming it, never ignored).

    {"response_format": {"type": "json_schema", "json_schema": {"schema": {...}}}} --grammar_of--> JsonSchema(...)
"""
from __future__ import annotations

from ..runtime.constraint import Gbnf, Grammar, JsonObject, JsonSchema, Regex
from .openai_errors import invalid
from .tool_grammar import closed_objects

# the keys each response_format type takes: OpenAI's, and llama-server's {"type": "json_object", "schema": {...}}
# (instructor's JSON_SCHEMA mode sends it); any other key is refused naming it, never ignored
_RESPONSE_FORMAT_KEYS = {"text": {"type"}, "json_object": {"type", "schema"}, "json_schema": {"type", "json_schema"}}
_JSON_SCHEMA_KEYS = {"name", "schema", "strict", "description"}


def _unknown_keys(value: dict, allowed: set[str], where: str) -> None:
    extra = sorted(set(value) - allowed)
    if extra:
        raise invalid(f"{where} does not take {', '.join(map(repr, extra))} (it takes {', '.join(sorted(allowed))})",
                      f"{where}.{extra[0]}")


def constraint_field(body: dict) -> str | None:
    """The request field that sets the output constraint (response_format unless it is text, json_schema, grammar,
    regex), for errors that name it."""
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") == "text":
        rf = None
    given = [k for k in ("response_format", "json_schema", "grammar", "regex")
             if (rf if k == "response_format" else body.get(k)) is not None]
    return given[0] if given else None


def grammar_of(body: dict) -> Grammar | None:
    """The output constraint: response_format (OpenAI), or one of the extensions `json_schema` (a schema object),
    `grammar` (GBNF; llama.cpp's server names both) and `regex`; at most one of them. Every schema form closes the
    objects that do not say otherwise (`additionalProperties: false`), as llama.cpp's server does and as OpenAI's
    strict mode requires: a small model given an open object invents keys until the token limit (instructor's
    JSON_SCHEMA mode sends no `strict`); a schema that wants extra keys says `additionalProperties`."""
    given = [k for k in ("response_format", "json_schema", "grammar", "regex") if body.get(k) is not None]
    rf = body.get("response_format")
    if rf is not None and (not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema")):
        raise invalid(f'response_format must be {{"type": "text" | "json_object" | "json_schema", ...}}, got {rf!r}',
                      "response_format")
    if rf is not None:
        _unknown_keys(rf, _RESPONSE_FORMAT_KEYS[rf["type"]], "response_format")
    if rf is not None and rf["type"] == "text":
        given.remove("response_format")
        rf = None
    if len(given) > 1:
        raise invalid(f"{given[1]} cannot be combined with {given[0]}: give one output constraint", given[1])
    if not given:
        return None
    name = given[0]
    if name == "response_format":
        if rf["type"] == "json_object":
            schema = rf.get("schema")
            if schema is None:
                return JsonObject()
            if not isinstance(schema, dict):  # llama-server's form: an object that follows this schema
                raise invalid(f"response_format.schema must be a JSON Schema object, got {schema!r}",
                              "response_format.schema")
            return JsonSchema(closed_objects(schema), strict=False)
        js = rf.get("json_schema")
        if not isinstance(js, dict) or not isinstance(js.get("schema", {}), dict):
            raise invalid('response_format json_schema must be {"name", "schema": {...}, "strict"}',
                          "response_format")
        _unknown_keys(js, _JSON_SCHEMA_KEYS, "response_format.json_schema")
        strict = js.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise invalid(f"response_format.json_schema.strict must be true or false, got {strict!r}",
                          "response_format")
        return JsonSchema(closed_objects(js.get("schema", {})), strict=bool(strict), name=js.get("name"))
    v = body[name]
    if name == "json_schema":
        if not isinstance(v, dict):
            raise invalid(f"json_schema must be a JSON Schema object, got {v!r}", name)
        return JsonSchema(closed_objects(v), strict=False)
    if not isinstance(v, str) or not v:
        raise invalid(f"{name} must be a non-empty string, got {v!r}", name)
    return Gbnf(v) if name == "grammar" else Regex(v)
