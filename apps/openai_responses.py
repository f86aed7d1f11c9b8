"""OpenAI's Responses API (POST /v1/responses) for `specedge serve`: request bodies -> chat requests, results ->
Response objects and the streamed event sequence the openai client parses.

A Responses request is a chat request in other words: `instructions` + `input` (a string, or a list of messages
and function_call / function_call_output items) become chat messages, `max_output_tokens` is max_completion_tokens,
`text.format` is response_format, function `tools` are chat tools with their fields one level up. So a body is
translated (`to_chat`) and parsed by the chat route's own parser (apps/openai_protocol.py parse_chat), and errors are
named with the Responses field (`max_output_tokens`, `text.format`, ...). What a local server cannot honour is
refused with a 400 naming it: stored responses (`store: true`, `previous_response_id`, `conversation`,
`background`), built-in tools (web search, file search, ...), `reasoning` effort, prompt templates (`prompt`),
non-text input parts, truncation "auto". Nothing is stored: GET /v1/responses/{id} does not exist.

Output: a `message` item with one `output_text` part (when there is text or no call), then one `function_call`
item per parsed tool call; status "completed", or "incomplete" with reason "max_output_tokens" when the answer was
cut (max_output_tokens or the context). Streamed (SSE, `event:` + `data:` per event, no [DONE], as OpenAI sends):
response.created, response.in_progress, response.output_item.added, response.content_part.added,
response.output_text.delta ..., response.output_text.done, response.content_part.done, response.output_item.done,
the function_call items (added, function_call_arguments.delta, .done, output_item.done), response.completed (or
response.incomplete); each event carries a sequence_number.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Sequence

from ..runtime.stats import CallStats
from ..runtime.types import FinishReason, TokenLogprob
from .openai_protocol import APIError, GenRequest, WIRE_FIELDS, invalid, parse_chat
from .openai_shapes import TokenText, chat_logprobs, extension
from .tools import ToolCall

# field -> how it maps to the chat route's body (None: handled here)
_MAPPED = {"model": "model", "temperature": "temperature", "top_p": "top_p", "stream": "stream",
           "parallel_tool_calls": "parallel_tool_calls", "max_output_tokens": "max_completion_tokens",
           "user": "user", "safety_identifier": "safety_identifier", "prompt_cache_key": "prompt_cache_key",
           "metadata": "metadata", "service_tier": "service_tier",
           # extensions, as on the chat route (llama.cpp's server names)
           "seed": "seed", "stop": "stop", **{k: k for k in WIRE_FIELDS}}
_HERE = {"input", "instructions", "text", "tools", "tool_choice", "store", "previous_response_id", "conversation",
         "background", "reasoning", "include", "truncation", "prompt", "top_logprobs", "stream_options",
         "max_tool_calls", "context_management"}
FIELDS = set(_MAPPED) | _HERE
# the chat route's field names in its errors -> ours
_PARAM_BACK = {v: k for k, v in _MAPPED.items()} | {"response_format": "text.format", "messages": "input",
                                                   "max_tokens": "max_output_tokens"}
_REFUSED = {
    "previous_response_id": "previous_response_id is not supported: nothing is stored on this server; send the "
                            "whole conversation in input",
    "conversation": "conversation is not supported: nothing is stored on this server; send the whole conversation "
                    "in input",
    "prompt": "prompt (a stored prompt template) is not supported: send instructions and input",
    "context_management": "context_management is not supported: send the conversation to keep in input",
}
LOGPROBS_INCLUDE = "message.output_text.logprobs"


def _text_parts(content, where: str, assistant: bool) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"{where}.content must be a string or a list of input_text parts", "input")
    kinds = ("input_text", "output_text", "text") if assistant else ("input_text", "text")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "refusal" and assistant:
            out.append(str(part.get("refusal", "")))
            continue
        if kind not in kinds or not isinstance(part.get("text"), str):
            raise invalid(f"{where}.content[{j}]: only text parts ({{\"type\": \"input_text\", \"text\": ...}}) are "
                          f"supported, got type {kind!r}", "input")
        out.append(part["text"])
    return "".join(out)


def messages_of(body: dict) -> list[dict]:
    """instructions + input as chat-completions messages (function_call items become an assistant message's
    tool_calls, function_call_output items tool messages)."""
    out: list[dict] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise invalid(f"instructions must be a string, got {instructions!r}", "instructions")
        out.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        return out + [{"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise invalid("input must be a string or a non-empty list of messages and items", "input")
    for i, item in enumerate(given):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(f"{where} must be an object, got {item!r}", "input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise invalid(f"{where}.role must be user, system, developer or assistant, got {role!r}", "input")
            out.append({"role": role, "content": _text_parts(item.get("content"), where, role == "assistant")})
        elif kind == "function_call":
            name, args, call_id = item.get("name"), item.get("arguments", "{}"), item.get("call_id")
            if not (isinstance(name, str) and isinstance(args, str) and isinstance(call_id, str)):
                raise invalid(f"{where} (function_call) needs string call_id, name and arguments", "input")
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if isinstance(output, list):
                output = _text_parts(output, where, False)
            if not (isinstance(call_id, str) and isinstance(output, str)):
                raise invalid(f"{where} (function_call_output) needs a string call_id and output", "input")
            out.append({"role": "tool", "tool_call_id": call_id, "content": output})
        else:
            raise invalid(f"{where}: input items of type {kind!r} are not supported (messages, function_call and "
                          "function_call_output are)", "input")
    return out


def _tools(body: dict) -> list[dict] | None:
    specs = body.get("tools")
    if specs is None:
        return None
    if not isinstance(specs, list):
        raise invalid(f"tools must be a list of function tools, got {specs!r}", "tools")
    out = []
    for i, t in enumerate(specs):
        kind = t.get("type") if isinstance(t, dict) else None
        if kind != "function":
            raise invalid(f"tools[{i}]: only function tools are supported here (built-in tools such as "
                          f"{kind or 'web_search'} run on OpenAI's servers), got type {kind!r}", "tools")
        extra = sorted(set(t) - {"type", "name", "description", "parameters", "strict"})
        if extra:
            raise invalid(f"tools[{i}] does not take {extra[0]!r}", "tools")
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(body: dict):
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise invalid(f'tool_choice must be "auto", "none", "required" or {{"type": "function", "name": ...}}, '
                          f"got {choice!r}", "tool_choice")
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _format(body: dict) -> dict | None:
    """text.format -> the chat route's response_format."""
    text = body.get("text")
    if text is None:
        return None
    if not isinstance(text, dict):
        raise invalid(f'text must be an object such as {{"format": {{"type": "text"}}}}, got {text!r}', "text")
    extra = sorted(set(text) - {"format", "verbosity"})
    if extra:
        raise invalid(f"text does not take {extra[0]!r} (it takes format, verbosity)", f"text.{extra[0]}")
    if text.get("verbosity") not in (None, "medium"):
        raise invalid(f'text.verbosity is not supported (only the default "medium"), got {text["verbosity"]!r}',
                      "text.verbosity")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise invalid(f'text.format must be {{"type": "text" | "json_object" | "json_schema", ...}}, got {fmt!r}',
                      "text.format")
    if fmt["type"] != "json_schema":
        extra = sorted(set(fmt) - {"type"})
        if extra:
            raise invalid(f"text.format does not take {extra[0]!r} with type {fmt['type']}",
                          f"text.format.{extra[0]}")
        return {"type": fmt["type"]}
    extra = sorted(set(fmt) - {"type", "name", "schema", "strict", "description"})
    if extra:
        raise invalid(f"text.format does not take {extra[0]!r} (it takes name, schema, strict, description)",
                      f"text.format.{extra[0]}")
    return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}


def _refuse_unhonoured(body: dict) -> None:
    for name, why in _REFUSED.items():
        if body.get(name) is not None:
            raise invalid(why, name)
    if body.get("store"):
        raise invalid("store: true is not supported: nothing is stored on this server (leave store out or false)",
                      "store")
    if body.get("background"):
        raise invalid("background: true is not supported: stream the response instead", "background")
    reasoning = body.get("reasoning")
    if reasoning is not None and (not isinstance(reasoning, dict) or any(v is not None for v in reasoning.values())):
        raise invalid(f"reasoning is not supported (the model has no reasoning mode), got {reasoning!r}",
                      "reasoning")
    if body.get("truncation") not in (None, "disabled"):
        raise invalid(f'truncation must be "disabled": a prompt over the context is refused, not cut (got '
                      f"{body['truncation']!r})", "truncation")
    so = body.get("stream_options")
    if so is not None and (not isinstance(so, dict) or set(so) - {"include_obfuscation"}
                           or so.get("include_obfuscation")):
        raise invalid(f"stream_options supports include_obfuscation: false only, got {so!r}", "stream_options")
    mtc = body.get("max_tool_calls")
    if mtc is not None and (isinstance(mtc, bool) or not isinstance(mtc, int) or mtc < 1):
        raise invalid(f"max_tool_calls must be a positive integer, got {mtc!r}", "max_tool_calls")


def to_chat(body: dict) -> tuple[dict, list[dict]]:
    """The chat-completions body and messages of a Responses body (fields checked; unknown ones refused)."""
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise invalid(f"unknown field {unknown[0]!r} for /v1/responses (docs/server.md lists the fields honoured)",
                      unknown[0])
    _refuse_unhonoured(body)
    chat = {_MAPPED[k]: v for k, v in body.items() if k in _MAPPED and v is not None}
    tools, choice, fmt = _tools(body), _tool_choice(body), _format(body)
    if tools is not None:
        chat["tools"] = tools
    if choice is not None:
        chat["tool_choice"] = choice
    if fmt is not None:
        chat["response_format"] = fmt
    include = body.get("include") or []
    if not isinstance(include, list) or any(i != LOGPROBS_INCLUDE for i in include):
        raise invalid(f'include supports only ["{LOGPROBS_INCLUDE}"] (nothing else is produced here), got '
                      f"{include!r}", "include")
    top = body.get("top_logprobs")
    if include or top is not None:
        chat["logprobs"] = True
        if top is not None:
            chat["top_logprobs"] = top
    return chat, messages_of(body)


def renamed(e: APIError) -> APIError:
    """An error from the chat route's parser, named with the Responses field."""
    param = e.param
    if param is not None:
        head, dot, rest = param.partition(".")
        if head in _PARAM_BACK:
            param = _PARAM_BACK[head] + dot + rest
    msg = e.message
    for chat_name, ours in (("max_completion_tokens", "max_output_tokens"), ("response_format", "text.format"),
                            ("/v1/chat/completions", "/v1/responses"), ("messages", "input")):
        msg = msg.replace(chat_name, ours)
    return APIError(e.status, msg, param=param, code=e.code, type=e.type, headers=e.headers)


@dataclass(frozen=True)
class ResponsesEcho:
    """What a Response object repeats of its request."""
    instructions: str | None
    max_output_tokens: int | None
    text_format: dict
    tools: tuple
    tool_choice: object
    parallel_tool_calls: bool
    temperature: float | None
    top_p: float | None
    metadata: dict
    user: str | None
    max_tool_calls: int | None
    logprobs: bool


def parse_responses(body: dict, rendered: str, chat: dict) -> GenRequest:
    """POST /v1/responses, given the chat body to_chat made and its messages rendered by the model's template."""
    try:
        req = parse_chat(chat, rendered, max_calls=body.get("max_tool_calls"))
    except APIError as e:
        raise renamed(e) from None
    fmt = (body.get("text") or {}).get("format") or {"type": "text"}
    echo = ResponsesEcho(body.get("instructions"), body.get("max_output_tokens"), fmt, tuple(body.get("tools") or ()),
                         body.get("tool_choice") or "auto", req.parallel_tool_calls, body.get("temperature"),
                         body.get("top_p"), body.get("metadata") or {}, body.get("user"), body.get("max_tool_calls"),
                         req.options.logprobs is not None)
    constraint = {"response_format": "text.format"}.get(req.constraint, req.constraint)
    return GenRequest(True, req.prompt, req.options, req.stream, False, req.max_tokens_given, tools=req.tools,
                      parallel_tool_calls=req.parallel_tool_calls, constraint=constraint, responses=echo)


# ---- responses --------------------------------------------------------------------------------------------------

def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int, cached: int = 0) -> dict:
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens}


def logprobs_of(lps: Sequence[TokenLogprob], text_of: TokenText | None) -> list:
    return [] if text_of is None or not lps else chat_logprobs(lps, text_of)["content"]


def message_item(item_id: str, text: str, status: str = "completed", logprobs: list | None = None) -> dict:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant",
            "content": [output_text(text, logprobs)] if status == "completed" else []}


def output_text(text: str, logprobs: list | None = None) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def call_item(item_id: str, call: ToolCall, status: str = "completed") -> dict:
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call.id, "name": call.name,
            "arguments": call.arguments if status == "completed" else ""}


@dataclass(frozen=True)
class ResponseShape:
    """Identity of one Response: id, creation time, model id, and the request's echoed fields."""
    id: str
    created_at: int
    model: str
    echo: ResponsesEcho

    @staticmethod
    def new(model: str, echo: ResponsesEcho) -> "ResponseShape":
        return ResponseShape(new_id("resp"), int(time.time()), model, echo)

    def response(self, status: str, output: list, *, reason: FinishReason | None = None,
                 stats: CallStats | None = None, completion_tokens: int = 0) -> dict:
        e = self.echo
        cut = status == "completed" and reason is FinishReason.LENGTH
        out = {"id": self.id, "object": "response", "created_at": self.created_at,
               "status": "incomplete" if cut else status, "error": None,
               "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
               "instructions": e.instructions, "max_output_tokens": e.max_output_tokens, "model": self.model,
               "output": output, "parallel_tool_calls": e.parallel_tool_calls, "previous_response_id": None,
               "reasoning": {"effort": None, "summary": None}, "store": False, "temperature": e.temperature,
               "text": {"format": e.text_format, "verbosity": "medium"}, "tool_choice": e.tool_choice,
               "tools": list(e.tools), "top_p": e.top_p, "truncation": "disabled", "usage": None, "user": e.user,
               "metadata": e.metadata, "max_tool_calls": e.max_tool_calls}
        if status == "completed":
            out["completed_at"] = int(time.time())
        if stats is not None:
            out["usage"] = usage(stats.prompt_tokens, completion_tokens, stats.reused_prompt_tokens)
            out["specedge"] = extension(stats)
        return out

    def output(self, text: str, calls: Sequence[ToolCall], logprobs: list) -> list:
        """The output items of a finished answer: its message (when there is text or no call), then its calls."""
        calls = calls[:self.echo.max_tool_calls] if self.echo.max_tool_calls else calls
        items = [] if (calls and not text) else [message_item(new_id("msg"), text, logprobs=logprobs)]
        return items + [call_item(new_id("fc"), c) for c in calls]


class EventStream:
    """The streamed events of one Response, each numbered (sequence_number) and named by its type."""

    def __init__(self, shape: ResponseShape) -> None:
        self.shape, self.n = shape, 0
        self.items: list[dict] = []  # output items done so far
        self.message: dict | None = None  # the message item being streamed
        self.text, self.logprobs = "", []

    def ev(self, kind: str, **fields) -> dict:
        out = {"type": kind, "sequence_number": self.n, **fields}
        self.n += 1
        return out

    def start(self) -> list[dict]:
        r = self.shape.response("in_progress", [])
        return [self.ev("response.created", response=r), self.ev("response.in_progress", response=r)]

    def delta(self, text: str, logprobs: list) -> list[dict]:
        out = []
        if self.message is None:
            self.message = message_item(new_id("msg"), "", status="in_progress")
            out += [self.ev("response.output_item.added", output_index=len(self.items), item=self.message),
                    self.ev("response.content_part.added", item_id=self.message["id"], output_index=len(self.items),
                            content_index=0, part=output_text(""))]
        self.text += text
        self.logprobs += logprobs
        return out + [self.ev("response.output_text.delta", item_id=self.message["id"], output_index=len(self.items),
                              content_index=0, delta=text, logprobs=logprobs)]

    def close_message(self) -> list[dict]:
        if self.message is None:
            return []
        i, mid = len(self.items), self.message["id"]
        part = output_text(self.text, self.logprobs)
        item = {**self.message, "status": "completed", "content": [part]}
        self.items.append(item)
        self.message = None
        return [self.ev("response.output_text.done", item_id=mid, output_index=i, content_index=0, text=self.text,
                        logprobs=self.logprobs),
                self.ev("response.content_part.done", item_id=mid, output_index=i, content_index=0, part=part),
                self.ev("response.output_item.done", output_index=i, item=item)]

    def call(self, call: ToolCall) -> list[dict]:
        """A whole tool call (sent when its block closes, as on the chat route)."""
        out = self.close_message()
        i, item = len(self.items), call_item(new_id("fc"), call)
        self.items.append(item)
        return out + [self.ev("response.output_item.added", output_index=i, item={**item, "status": "in_progress",
                                                                                    "arguments": ""}),
                      self.ev("response.function_call_arguments.delta", item_id=item["id"], output_index=i,
                              delta=call.arguments),
                      self.ev("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                              name=call.name, arguments=call.arguments),
                      self.ev("response.output_item.done", output_index=i, item=item)]

    def finish(self, reason: FinishReason, stats: CallStats | None, completion_tokens: int) -> list[dict]:
        out = []
        if self.message is None and not self.items:  # an empty answer is still one (empty) message
            out += self.delta("", [])
        out += self.close_message()
        r = self.shape.response("completed", self.items, reason=reason, stats=stats,
                                completion_tokens=completion_tokens)
        return out + [self.ev("response.incomplete" if r["status"] == "incomplete" else "response.completed",
                              response=r)]

    def error(self, message: str) -> dict:
        return self.ev("error", code="server_error", message=message, param=None)
