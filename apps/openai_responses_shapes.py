"""OpenAI's Responses API (POST /v1/responses) for `specedge serve`, the answer side: Response objects and the
streamed event sequence the openai client parses (apps/openai_responses.py translates the request).

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
from .openai_shapes import TokenText, chat_logprobs, extension
from .tools import ToolCall


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
