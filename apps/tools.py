"""Tool (function) calling: typed tools and calls, rendering them into a prompt, parsing calls out of the output,
and the grammar that forces a call.

    tools + messages --render_messages--> prompt text   (the model's template with `tools`, or a system message)
    output text      --parse_tool_calls--> (content, [ToolCall])    streamed: ToolStream.push / finish  (tool_parse.py)
    forced choice    --forced_grammar----> runtime.constraint.Lark  (the output is exactly the call(s); tool_grammar.py)

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

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
OPEN, CLOSE = "<tool_call>", "</tool_call>"


def plain_json(x):
    """A JSON-serialisable copy of nested Mappings / sequences (tool schemas may be MappingProxy, tuples...)."""
    if isinstance(x, Mapping):
        return {str(k): plain_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain_json(v) for v in x]
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
            json.dumps(plain_json(self.parameters))
        except (TypeError, ValueError) as e:
            raise ValueError(f"tool {self.name}: parameters must be JSON ({e})") from None

    def openai(self) -> dict:
        """OpenAI's shape: {"type": "function", "function": {"name", "description", "parameters"}}."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": plain_json(self.parameters)}}

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
                        args if isinstance(args, str) else json.dumps(plain_json(args)))


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


def tools_of(specs: Iterable) -> list[Tool]:
    """Tool objects from Tool instances or OpenAI dicts; ValueError on a duplicate name."""
    out = [s if isinstance(s, Tool) else Tool.from_openai(s) for s in specs]
    names = [t.name for t in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"tool names must be unique, {dup} repeat")
    return out
