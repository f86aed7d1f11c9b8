"""OpenAI response JSON for `specedge serve`: completions, chunks, choices with tool calls, and logprobs objects.

Pure functions over results (no I/O). Logprobs (runtime TokenLogprob, one per token) take OpenAI's exact shapes:
chat {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}; completions
(legacy) {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}. A token's string is its
bytes decoded as UTF-8 (a piece of a multi-byte character shows U+FFFD; `bytes` carries the exact bytes).
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Sequence

from ..runtime.stats import CallStats
from ..runtime.types import FinishReason, TokenLogprob
from .tools import ToolCall


def openai_finish(reason: FinishReason, tool_calls: bool = False) -> str:
    """OpenAI's finish_reason: "tool_calls" when the answer is tool calls; eos and stop strings are "stop", length
    is "length"; a cancelled call (its client went away, or the server is shutting down) reports "stop" since no
    more text follows."""
    if tool_calls and reason is not FinishReason.LENGTH:
        return "tool_calls"
    return "length" if reason is FinishReason.LENGTH else "stop"


def extension(stats: CallStats) -> dict:
    """The `specedge` field: the call's speculative-decoding statistics (docs/server.md)."""
    keys = ("drafter", "n_generated", "n_drafted", "n_accepted", "acceptance_rate", "n_target_forwards",
            "tokens_per_s", "ttft_s", "prompt_tokens", "reused_prompt_tokens", "n_prefilled", "prefill_s",
            "prompt_tokens_per_s", "decode_s", "wall_s", "finish_reason", "sampling")
    d = stats.to_dict()
    return {**{k: d[k] for k in keys}, "tau": d["mean_accepted_length"]}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class TokenText:
    """Token id -> (string, bytes) for logprobs, cached, from a TextTokenizer's token_bytes."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.cache = tokenizer, {}

    def __call__(self, token: int) -> tuple[str, list[int]]:
        hit = self.cache.get(token)
        if hit is None:
            fn = getattr(self.tokenizer, "token_bytes", None)
            raw = fn(token) if fn is not None else self.tokenizer.decode([token]).encode("utf-8")
            hit = self.cache[token] = (raw.decode("utf-8", errors="replace"), list(raw))
        return hit


def chat_logprobs(lps: Sequence[TokenLogprob], text: TokenText) -> dict:
    """OpenAI's chat choice `logprobs`: {"content": [...], "refusal": None}."""
    def entry(token: int, logprob: float) -> dict:
        s, b = text(token)
        return {"token": s, "logprob": float(logprob), "bytes": b}
    return {"content": [{**entry(lp.token, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
                        for lp in lps], "refusal": None}


def completion_logprobs(lps: Sequence[TokenLogprob], text: TokenText, offset: int) -> tuple[dict, int]:
    """OpenAI's legacy completion `logprobs` for tokens whose text starts at character `offset`; returns it and
    the offset after them."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for lp in lps:
        s, _ = text(lp.token)
        out["tokens"].append(s)
        out["token_logprobs"].append(float(lp.logprob))
        out["top_logprobs"].append({text(t)[0]: float(v) for t, v in lp.top})
        out["text_offset"].append(offset)
        offset += len(s)
    return out, offset


@dataclass(frozen=True)
class Shape:
    """Identity of one response: id, creation time, model id, and chat or text completion."""
    id: str
    created: int
    model: str
    chat: bool

    @staticmethod
    def new(model: str, chat: bool) -> "Shape":
        prefix = "chatcmpl-" if chat else "cmpl-"
        return Shape(prefix + uuid.uuid4().hex[:24], int(time.time()), model, chat)

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": None}

    def choice(self, index: int, text: str, reason: FinishReason, *, tool_calls: Sequence[ToolCall] = (),
               logprobs: dict | None = None) -> dict:
        """A non-streamed choice: chat {"message": {"role", "content", "tool_calls"?}} (content None when the answer
        is only calls), completions {"text"}."""
        finish = openai_finish(reason, bool(tool_calls))
        if not self.chat:
            return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        message = {"role": "assistant", "content": text if (text or not tool_calls) else None, "refusal": None}
        if tool_calls:
            message["tool_calls"] = [c.openai() for c in tool_calls]
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}

    def completion(self, choices: list[dict], prompt_tokens: int, completion_tokens: int, stats: CallStats) -> dict:
        obj = "chat.completion" if self.chat else "text_completion"
        return {**self._head(obj), "choices": choices, "usage": usage(prompt_tokens, completion_tokens),
                "specedge": extension(stats)}

    def chunk(self, text: str | None, *, first: bool = False, reason: FinishReason | None = None, stats: CallStats | None = None,
              with_usage: bool = False, logprobs: dict | None = None, tool_call: tuple[int, ToolCall] | None = None,
              called: bool = False) -> dict:
        """One streamed chunk: text (chat: delta.content; None: an empty delta), or a whole tool call as
        delta.tool_calls[{index, id, type, function}]; `reason` on the last (called: "tool_calls")."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        finish = openai_finish(reason, called) if reason is not None else None
        if not self.chat:
            choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        else:
            d = {} if text is None else {"content": text}
            if tool_call is not None:
                i, call = tool_call
                d = {"tool_calls": [{"index": i, **call.openai()}]}
            if first:
                d = {"role": "assistant", **d}
            choice = {"index": 0, "delta": d, "logprobs": logprobs, "finish_reason": finish}
        out = {**self._head(obj), "choices": [choice]}
        if with_usage:
            out["usage"] = None
        if stats is not None:
            out["specedge"] = extension(stats)
        return out

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage(prompt_tokens, completion_tokens)}


def models_list(cards: list[dict]) -> dict:
    return {"object": "list", "data": cards}


def model_card(model_id: str, created: int, specedge: dict | None = None) -> dict:
    """OpenAI's model object; `specedge` (non-standard) carries the server's view of it (loaded, bytes)."""
    card = {"id": model_id, "object": "model", "created": created, "owned_by": "specedge"}
    return card if specedge is None else {**card, "specedge": specedge}
