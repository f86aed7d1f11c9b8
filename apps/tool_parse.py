"""Parsing tool calls out of a model's output (the Hermes/Qwen format apps/tools.py describes): whole
(`parse_tool_calls`) or streamed piece by piece (`ToolStream`, which apps/stream_assembler.py drives for the
server's streamed routes).

    "Sure. <tool_call>\n{json}\n</tool_call>"  --parse_tool_calls-->  ("Sure.", [ToolCall])
    pieces "Sure. <to", "ol_call>..."         --ToolStream.push-->   Parsed("Sure. ", end=6), Parsed(ToolCall, end=..)
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Sequence

from .tools import CLOSE, OPEN, Tool, ToolCall, new_call_id

_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.S)


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


@dataclass(frozen=True)
class Parsed:
    """One thing ToolStream found: content text (a str) or a call (a ToolCall), and `end`: the characters of the
    output it accounts for, counted from the start (the text of a call's block, and held-back text it completes,
    are behind `end`)."""
    value: str | ToolCall
    end: int


class ToolStream:
    """parse_tool_calls over a stream of text pieces: `push` returns what the new text completes (Parsed content
    and calls, in order); text that may begin a <tool_call> is held back (as stop strings are), a call is emitted
    when its block closes, and an output that begins with "{" is held to the end (it may be a bare JSON call).
    `consumed`: characters of input the events so far account for."""

    def __init__(self, tools: Sequence[Tool]) -> None:
        self.names = {t.name for t in tools}
        self.buf, self.consumed, self.started = "", 0, False

    def push(self, text: str) -> list[Parsed]:
        self.buf += text
        if not self.names:
            return self._emit_content(len(self.buf))
        events: list[Parsed] = []
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
            self.consumed += end
            events.append(Parsed(call if call is not None else self.buf[:end], self.consumed))
            self.buf = self.buf[end:]

    def finish(self) -> list[Parsed]:
        """The events left at the end: a bare JSON call, held-back text; an unclosed block (a call cut by
        max_tokens) is dropped, as parse_tool_calls drops it."""
        if not self.started and self.buf.strip():
            content, calls = parse_tool_calls(self.buf, [Tool(n) for n in self.names])
            if calls:
                self.consumed += len(self.buf)
                self.buf = ""
                return [Parsed(v, self.consumed) for v in ([content] if content else []) + calls]
        keep = len(_without_unclosed(self.buf)) if self.names else len(self.buf)
        events = self._emit_content(keep)
        self.consumed += len(self.buf)
        self.buf = ""
        return events

    def _emit_content(self, n: int) -> list[Parsed]:
        if n <= 0:
            return []
        out, self.buf = self.buf[:n], self.buf[n:]
        self.consumed += n
        return [Parsed(out, self.consumed)]
