"""The chat-completions body's own parts for `specedge serve`: its messages (roles, text content parts, past tool
calls and results) and its tools (tools, tool_choice, parallel_tool_calls), checked and typed before the model's
template renders them (apps/openai_protocol.py parse_chat parses the rest of the body).
"""
from __future__ import annotations

from .openai_errors import invalid
from .tools import ForceTool, Tool, ToolCall, ToolChoice, resolve_choice, tools_of

ROLES = ("system", "developer", "user", "assistant", "tool")


def chat_tools(body: dict) -> tuple[list[Tool], ToolChoice, bool]:
    """tools, tool_choice, parallel_tool_calls of a chat request."""
    specs = body.get("tools")
    if specs is not None and not isinstance(specs, list):
        raise invalid(f"tools must be a list of function tools, got {specs!r}", "tools")
    try:
        tools = tools_of(specs or [])
    except ValueError as e:
        raise invalid(str(e), "tools") from None
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        f = choice.get("function")
        if choice.get("type") != "function" or not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise invalid(f'tool_choice must be "auto", "none", "required" or {{"type": "function", "function": '
                          f'{{"name": ...}}}}, got {choice!r}', "tool_choice")
        choice = ForceTool(f["name"])
    elif choice is not None and choice not in ("auto", "none", "required"):
        raise invalid(f'tool_choice must be "auto", "none", "required" or {{"type": "function", ...}}, got '
                      f"{choice!r}", "tool_choice")
    if choice is not None and not tools and choice != "none":
        raise invalid("tool_choice needs tools", "tool_choice")
    try:
        choice = resolve_choice(choice, tools)
    except ValueError as e:
        raise invalid(str(e), "tool_choice") from None
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise invalid(f"parallel_tool_calls must be true or false, got {parallel!r}", "parallel_tool_calls")
    return tools, choice, parallel


def chat_messages(body: dict) -> list[dict]:
    """The request's messages as [{"role", "content": str}] (assistant: `tool_calls` as ToolCall; tool:
    `tool_call_id`); content parts of type text are joined."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages must be a non-empty list of {\"role\", \"content\"} objects", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise invalid(f"messages[{i}] must be an object with role one of {', '.join(ROLES)}", "messages")
        content = m.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise invalid(f"messages[{i}].content: only text parts ({{\"type\": \"text\", \"text\": ...}}) "
                              "are supported", "messages")
            content = "".join(p["text"] for p in content)
        if content is None and m["role"] == "assistant":
            content = ""
        if not isinstance(content, str):
            raise invalid(f"messages[{i}].content must be a string or a list of text parts", "messages")
        msg = {"role": "system" if m["role"] == "developer" else m["role"], "content": content}
        if m["role"] == "assistant" and m.get("tool_calls"):
            if not isinstance(m["tool_calls"], list):
                raise invalid(f"messages[{i}].tool_calls must be a list", "messages")
            try:
                msg["tool_calls"] = [ToolCall.from_openai(c) for c in m["tool_calls"]]
            except ValueError as e:
                raise invalid(f"messages[{i}]: {e}", "messages") from None
        if m["role"] == "tool":
            tid = m.get("tool_call_id")
            if not isinstance(tid, str):
                raise invalid(f"messages[{i}] (role tool) needs a tool_call_id string", "messages")
            msg["tool_call_id"] = tid
        out.append(msg)
    return out
