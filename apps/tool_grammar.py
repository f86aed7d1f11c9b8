"""The grammar that forces a tool call (tool_choice "required" or a named tool): each tool's parameter schema
embedded in the call wrapper {"name": ..., "arguments": ...} with its definitions re-rooted and its objects closed,
as a Lark grammar llguidance enforces; `closed_objects` is the same closing for response_format schemas.

    [Tool], "required" --forced_grammar--> Lark: <tool_call>\n{"name": "get_weather", "arguments": {...}}\n</tool_call>
"""
from __future__ import annotations

import json
from typing import Mapping, Sequence

from ..runtime.constraint import JSON_WHITESPACE, Lark
from .tools import ForceTool, Tool, ToolChoice, plain_json

_DEFINITIONS = ("$defs", "definitions")  # where JSON Schema keeps named subschemas (2019-09+, draft 7 and earlier)
_ARGUMENTS = "#/properties/arguments"  # where a tool's parameter schema sits in the call wrapper


def embedded_arguments(parameters: Mapping) -> tuple[dict, dict]:
    """A tool's parameter schema as the `arguments` property of the call wrapper `{"name": ..., "arguments": ...}`,
    and the definitions the wrapper's root must carry.

    References are root-relative, and the root is now the wrapper: `$defs` / `definitions` (pydantic's nested models
    and enums: `{"$ref": "#/$defs/Color"}`) move to the wrapper's root, where those references resolve as written;
    any other root reference (`#` for a recursive schema, `#/properties/...`) is re-rooted under
    properties.arguments. Each tool is its own wrapper, so tools whose definitions share names do not collide.
    Objects that do not say otherwise are closed (`additionalProperties: false`): OpenAI's `strict` meaning, and
    what keeps a small model from filling a forced call with invented keys until the token limit.
    Example: {"properties": {"c": {"$ref": "#/$defs/C"}}, "$defs": {"C": {"enum": ["r", "g"]}}} ->
    ({"properties": {"c": {"$ref": "#/$defs/C"}}, "additionalProperties": False}, {"$defs": {"C": {"enum": [...]}}})"""
    schema = plain_json(parameters)
    defs = {k: schema.pop(k) for k in _DEFINITIONS if k in schema}
    return _fix(schema), {k: _fix_map(v) for k, v in defs.items()}


_ONE = ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else", "additionalItems",
        "unevaluatedProperties", "unevaluatedItems")  # keywords whose value is one subschema
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")  # ... a list of subschemas
_MAP = ("properties", "patternProperties", "dependentSchemas", *_DEFINITIONS)  # ... a map of name -> subschema


def closed_objects(schema: Mapping) -> dict:
    """A JSON Schema whose objects that do not say otherwise are closed (`additionalProperties: false`), its
    references untouched: llama.cpp's server reads a `json_schema` so (its grammar converter's default), and a
    small model given an open object invents keys until the token limit."""
    return _fix(plain_json(schema), reroot=False)


def _fix_map(m, reroot: bool = True):
    return {k: _fix(v, reroot) for k, v in m.items()} if isinstance(m, dict) else m


def _fix(s, reroot: bool = True):
    """One subschema, walked by its keywords (embedded_arguments): re-rooted references, closed objects."""
    if not isinstance(s, dict):
        return s
    out = dict(s)
    for k, v in s.items():
        if k in _MAP:
            out[k] = _fix_map(v, reroot)
        elif k in _LIST and isinstance(v, list):
            out[k] = [_fix(x, reroot) for x in v]
        elif k in _ONE:
            out[k] = _fix(v, reroot)
    ref = out.get("$ref")
    if reroot and isinstance(ref, str) and (ref == "#" or ref.startswith("#/")) and \
            not ref.startswith(tuple(f"#/{k}/" for k in _DEFINITIONS)):
        out["$ref"] = _ARGUMENTS + ref[1:]
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def forced_grammar(tools: Sequence[Tool], choice: ToolChoice, *, parallel: bool = True,
                   max_calls: int | None = None) -> Lark:
    """The grammar of an output that is only tool calls: for a ForceTool, calls of that tool; for "required", of
    any given tool; a named tool or parallel=False: exactly one call, else one to `max_calls` (default: as many as
    there are tools; newline-separated): a small model forced to call keeps repeating its call until max_tokens
    when the grammar allows any number, and OpenAI's models rarely call more tools than they were given. Each call's
    arguments follow its tool's parameter schema (llguidance's %json embedding; embedded_arguments: its definitions
    and references re-rooted, its objects closed)."""
    if isinstance(choice, ForceTool):
        chosen = [t for t in tools if t.name == choice.name]
    elif choice == "required":
        chosen = list(tools)
    else:
        raise ValueError(f"only a forced tool_choice (\"required\" or a tool name) has a grammar, got {choice!r}")
    if not chosen:
        raise ValueError(f"tool_choice {choice!r} names no given tool")
    parallel = parallel and not isinstance(choice, ForceTool)  # a named tool: one call of it (as OpenAI's models do)
    most = max(1, max_calls if max_calls is not None else len(chosen)) if parallel else 1
    more = ""
    for _ in range(most - 1):  # call ("\n" call ("\n" call)?)?: at most `most` calls
        more = f' ("\\n" call{more})?'
    lines = [f"start: call{more}",
             'call: "<tool_call>\\n" body "\\n</tool_call>"',
             "body: " + " | ".join(f"body{i}" for i in range(len(chosen)))]
    for i, t in enumerate(chosen):
        arguments, defs = embedded_arguments(t.parameters)
        schema = {"type": "object", "properties": {"name": {"const": t.name}, "arguments": arguments},
                  "required": ["name", "arguments"], "additionalProperties": False, **defs,
                  "x-guidance": {"whitespace_pattern": JSON_WHITESPACE}}  # bounded, as for response_format
        lines.append(f"body{i}: %json {json.dumps(schema, ensure_ascii=False)}")
    return Lark("\n".join(lines) + "\n")
