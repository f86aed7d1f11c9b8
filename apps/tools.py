"""Tool (function) calling: typed tools and calls, rendering them into a prompt, parsing calls out of the output,
and the grammar that forces a call.

    tools + messages --render_messages--> prompt text   (the model's template with `tools`, or a system message)
    output text      --parse_tool_calls--> (content, [ToolCall])    streamed: ToolStream.push / finish
    forced choice    --forced_grammar----> runtime.constraint.Lark  (the output is exactly the call(s))

The call format is Hermes/Qwen's, which most small instruct models are trained on:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A template whose source mentions `tools` renders them itself (given OpenAI-shaped {"type": "function", "function":
{...}} specs); for any other template the tools are described in a system message (merged into the first one) and
past calls and results are rendered as text in the same format (results as <tool_response>...</tool_response> in a
user turn). tool_choice "none": the tools are not rendered and no call is parsed (the output is plain content).
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Iterable, Literal, Mapping, Sequence, Union

from ..runtime.constraint import JSON_WHITESPACE, Lark

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.S)


def _plain(x):
    """A JSON-serialisable copy of nested Mappings / sequences (tool schemas may be MappingProxy, tuples...)."""
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


@dataclass(frozen=True)
class Tool:
    """A function the model may call: `parameters` is a JSON Schema object for its arguments."""
    name: str
    description: str = ""
    parameters: Mapping = field(default_factory=lambda: {"type": "object", "properties": {}})

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"tool name must be 1-64 letters, digits, '_' or '-', got {self.name!r}")
        if not isinstance(self.description, str):
            raise ValueError(f"tool {self.name}: description must be a string, got {self.description!r}")
        if not isinstance(self.parameters, Mapping):
            raise ValueError(f"tool {self.name}: parameters must be a JSON Schema object, got {self.parameters!r}")
        try:
            json.dumps(_plain(self.parameters))
        except (TypeError, ValueError) as e:
            raise ValueError(f"tool {self.name}: parameters must be JSON ({e})") from None

    def openai(self) -> dict:
        """OpenAI's shape: {"type": "function", "function": {"name", "description", "parameters"}}."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": _plain(self.parameters)}}

    @staticmethod
    def from_openai(spec) -> "Tool":
        """From OpenAI's {"type": "function", "function": {...}}; ValueError naming what is wrong."""
        if not isinstance(spec, Mapping) or spec.get("type") != "function" or not isinstance(spec.get("function"),
                                                                                               Mapping):
            raise ValueError(f'each tool must be {{"type": "function", "function": {{"name", ...}}}}, got {spec!r}')
        f = spec["function"]
        unknown = sorted(set(f) - {"name", "description", "parameters", "strict"})
        if unknown:
            raise ValueError(f"tool function fields {unknown} are not supported (name, description, parameters, "
                             "strict)")
        params = f.get("parameters")
        return Tool(f.get("name"), f.get("description") or "",
                    {"type": "object", "properties": {}} if params is None else params)


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: `arguments` is a JSON string (as OpenAI's)."""
    id: str
    name: str
    arguments: str

    @property
    def args(self) -> dict:
        return json.loads(self.arguments)

    def openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    @staticmethod
    def from_openai(spec) -> "ToolCall":
        if not isinstance(spec, Mapping) or not isinstance(spec.get("function"), Mapping):
            raise ValueError(f'a tool call must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}, '
                             f"got {spec!r}")
        f = spec["function"]
        args = f.get("arguments", "{}")
        if not isinstance(f.get("name"), str) or not isinstance(args, (str, Mapping)):
            raise ValueError(f"a tool call needs a string name and arguments (a JSON string), got {spec!r}")
        return ToolCall(str(spec.get("id") or new_call_id()), f["name"],
                        args if isinstance(args, str) else json.dumps(_plain(args)))


@dataclass(frozen=True)
class ForceTool:
    """tool_choice forcing one named tool."""
    name: str


ToolChoice = Union[Literal["auto", "none", "required"], ForceTool]


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def resolve_choice(choice, tools: Sequence[Tool]) -> ToolChoice:
    """"auto" | "none" | "required" | ForceTool | a tool's name; ValueError if it names no given tool."""
    if choice is None:
        choice = "auto"
    if isinstance(choice, str) and choice not in ("auto", "none", "required"):
        choice = ForceTool(choice)
    if isinstance(choice, ForceTool):
        if choice.name not in {t.name for t in tools}:
            raise ValueError(f"tool_choice names {choice.name!r}, which is not among the tools "
                             f"({', '.join(t.name for t in tools) or 'none given'})")
        return choice
    if choice not in ("auto", "none", "required"):
        raise ValueError(f'tool_choice must be "auto", "none", "required" or a tool name, got {choice!r}')
    if choice == "required" and not tools:
        raise ValueError('tool_choice "required" needs at least one tool')
    return choice


# ---- rendering -----------------------------------------------------------------------------------------------------

def template_uses_tools(template: str) -> bool:
    return "tools" in template


def system_prompt(tools: Sequence[Tool]) -> str:
    """The tool description for templates that do not render tools (Qwen 2.5's wording)."""
    specs = "\n".join(json.dumps(t.openai(), ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            f"{specs}\n</tools>\n\nFor each function call, return a json object with function name and arguments "
            "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def call_text(name: str, arguments: str) -> str:
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError:
        args = arguments
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': args}, ensure_ascii=False)}\n{CLOSE}"


def _calls(m: Mapping) -> list[ToolCall]:
    return [c if isinstance(c, ToolCall) else ToolCall.from_openai(c) for c in (m.get("tool_calls") or [])]


def _as_text(messages: Sequence[Mapping]) -> list[dict]:
    """History with tool calls and results as text (templates without tool support)."""
    out: list[dict] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            parts = [content] if content else []
            parts += [call_text(c.name, c.arguments) for c in _calls(m)]
            out.append({"role": "assistant", "content": "\n".join(parts)})
        elif role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1].get("_tool"):  # consecutive results: one user turn
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool": True})
        else:
            out.append({"role": role, "content": content})
    return [{k: v for k, v in m.items() if k != "_tool"} for m in out]


def _for_template(messages: Sequence[Mapping]) -> list[dict]:
    """History for a template that renders tools: calls as HF's {"type", "id", "function": {name, arguments: dict}}."""
    out = []
    for m in messages:
        d = {k: v for k, v in m.items() if k != "tool_calls"}
        d["content"] = m.get("content") or ""
        if m.get("tool_calls"):
            calls = []
            for c in _calls(m):
                try:
                    args = json.loads(c.arguments)
                except json.JSONDecodeError:
                    args = c.arguments
                calls.append({"type": "function", "id": c.id, "function": {"name": c.name, "arguments": args}})
            d["tool_calls"] = calls
        out.append(d)
    return out


def render_messages(tokenizer, messages: Sequence[Mapping], tools: Sequence[Tool] = (),
                    choice: ToolChoice = "auto") -> str:
    """The prompt for `messages` with `tools` offered (none rendered when tools is empty or choice is "none")."""
    offered = list(tools) if choice != "none" else []
    has_tool_history = any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)
    if not offered and not has_tool_history:
        return tokenizer.apply_chat_template([{"role": m["role"], "content": m.get("content") or ""}
                                              for m in messages])
    if template_uses_tools(tokenizer.chat_template):
        variables = {"tools": [t.openai() for t in offered]} if offered else None
        return tokenizer.apply_chat_template(_for_template(messages), variables=variables)
    msgs = _as_text(messages)
    if offered:
        prompt = system_prompt(offered)
        if msgs and msgs[0]["role"] == "system":
            msgs[0] = {"role": "system", "content": (msgs[0]["content"] + "\n\n" + prompt).lstrip()}
        else:
            msgs.insert(0, {"role": "system", "content": prompt})
    return tokenizer.apply_chat_template(msgs)


# ---- parsing -------------------------------------------------------------------------------------------------------

def _call_of(obj, names: set[str]) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or obj["name"] not in names:
        return None
    args = obj.get("arguments", obj.get("parameters"))
    if args is None:
        args = {}
    if isinstance(args, str):
        try:
            json.loads(args)
        except json.JSONDecodeError:
            return None
        return ToolCall(new_call_id(), obj["name"], args)
    if not isinstance(args, dict):
        return None
    return ToolCall(new_call_id(), obj["name"], json.dumps(args, ensure_ascii=False))


def _block_call(inner: str, names: set[str]) -> ToolCall | None:
    try:
        return _call_of(json.loads(inner.strip()), names)
    except json.JSONDecodeError:
        return None


def parse_tool_calls(text: str, tools: Sequence[Tool]) -> tuple[str, list[ToolCall]]:
    """(content, calls): every <tool_call>{json}</tool_call> block naming a given tool becomes a ToolCall (ids
    call_<hex>); a whole output that is one JSON object {"name", "arguments" | "parameters"} is one call too. Blocks
    that do not parse or name no given tool stay in the content; an unclosed block at the end (a call cut by
    max_tokens) is dropped, never content. Content is the rest, stripped."""
    names = {t.name for t in tools}
    if not names:
        return text, []
    calls, kept, at = [], [], 0
    for m in _BLOCK.finditer(text):
        call = _block_call(m.group(1), names)
        if call is not None:
            kept.append(text[at:m.start()])
            at = m.end()
            calls.append(call)
    kept.append(_without_unclosed(text[at:]))
    content = "".join(kept).strip()
    if not calls and content.startswith("{"):
        try:
            call = _call_of(json.loads(content), names)
        except json.JSONDecodeError:
            call = None
        if call is not None:
            return "", [call]
    return content, calls


def _without_unclosed(tail: str) -> str:
    """The text before an unclosed <tool_call> block at the end of the output (all of it when none)."""
    i = tail.rfind(OPEN)
    return tail if i < 0 or CLOSE in tail[i:] else tail[:i]


def _held(text: str, marker: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of marker."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class ToolStream:
    """parse_tool_calls over a stream of text pieces: `push` returns the events the new text completes, content
    ("content", str) and calls ("call", ToolCall); text that may begin a <tool_call> is held back (as stop strings
    are), a call is emitted when its block closes, and an output that begins with "{" is held to the end (it may
    be a bare JSON call). `consumed`: characters of input the events so far account for."""

    def __init__(self, tools: Sequence[Tool]) -> None:
        self.names = {t.name for t in tools}
        self.buf, self.consumed, self.started = "", 0, False

    def push(self, text: str) -> list[tuple[str, object]]:
        self.buf += text
        if not self.names:
            return self._emit_content(len(self.buf))
        events: list[tuple[str, object]] = []
        if not self.started:
            head = self.buf.lstrip()
            if not head or head.startswith("{"):
                return events  # nothing yet, or a possible bare JSON call: wait for the end
            self.started = True
        while True:
            i = self.buf.find(OPEN)
            if i < 0:
                events += self._emit_content(len(self.buf) - _held(self.buf, OPEN))
                return events
            events += self._emit_content(i)
            j = self.buf.find(CLOSE)
            if j < 0:
                return events
            end = j + len(CLOSE)
            call = _block_call(self.buf[len(OPEN):j], self.names)
            events += [("call", call)] if call is not None else [("content", self.buf[:end])]
            self.consumed += end
            self.buf = self.buf[end:]

    def finish(self) -> list[tuple[str, object]]:
        """The events left at the end: a bare JSON call, held-back text; an unclosed block (a call cut by
        max_tokens) is dropped, as parse_tool_calls drops it."""
        if not self.started and self.buf.strip():
            content, calls = parse_tool_calls(self.buf, [Tool(n) for n in self.names])
            if calls:
                self.consumed += len(self.buf)
                self.buf = ""
                return ([("content", content)] if content else []) + [("call", c) for c in calls]
        keep = len(_without_unclosed(self.buf)) if self.names else len(self.buf)
        events = self._emit_content(keep)
        self.consumed += len(self.buf)
        self.buf = ""
        return events

    def _emit_content(self, n: int) -> list[tuple[str, object]]:
        if n <= 0:
            return []
        out, self.buf = self.buf[:n], self.buf[n:]
        self.consumed += n
        return [("content", out)]


# ---- forcing a call ------------------------------------------------------------------------------------------------

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
    schema = _plain(parameters)
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
    return _fix(_plain(schema), reroot=False)


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


def tools_of(specs: Iterable) -> list[Tool]:
    """Tool objects from Tool instances or OpenAI dicts; ValueError on a duplicate name."""
    out = [s if isinstance(s, Tool) else Tool.from_openai(s) for s in specs]
    names = [t.name for t in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"tool names must be unique, {dup} repeat")
    return out
