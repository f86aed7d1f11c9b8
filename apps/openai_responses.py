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

The Response objects and the streamed events are shaped in apps/openai_responses_shapes.py.
"""
from __future__ import annotations

from .openai_errors import APIError, invalid
from .openai_protocol import GenRequest, WIRE_FIELDS, parse_chat
from .openai_responses_shapes import ResponsesEcho

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
