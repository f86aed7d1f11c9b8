"""The OpenAI wire format for `specedge serve`: request bodies -> typed requests, results -> response JSON.

Pure functions over dicts (no I/O), so the server module only routes, queues and streams. Requests follow
OpenAI's /v1/completions and /v1/chat/completions; what we cannot honour (n > 1, logprobs, penalties other than
repeat_penalty, tools) is refused with a 400 naming the field, never silently ignored. Values are checked for
their JSON type here and for their range by specedge.Engine (apps/api.py), whose ValueError messages the client
sees unchanged.

Extension fields (llama.cpp's server uses the same names): request `top_k`, `min_p`, `repeat_penalty`; response
`specedge` with the speculative-decoding statistics of the call (see docs/server.md for its schema).

Omitted fields take specedge's defaults, the same as the CLI and the Engine: no max_tokens / max_completion_tokens
decodes to the end of the turn (EOS, a stop string) or the context limit, for both routes (finish_reason "length"
only at the limit); no temperature / top_p / top_k / min_p samples with the model's own defaults
(assembly/sampling_defaults.py; temperature 0.7, top_p 0.9 when the model states none), not OpenAI's temperature 1;
temperature 0 is greedy; seed 0.
"""
from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass

from ..assembly.decoder import CallSettings

ROLES = ("system", "developer", "user", "assistant", "tool")


class APIError(Exception):
    """An error the client gets as {"error": {"message", "type", "param", "code"}} with an HTTP status."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def engine_error(e: ValueError) -> APIError:
    """A 400 from an Engine ValueError (a value out of range, a prompt longer than the context); param is the
    first request field the message names."""
    msg = str(e)
    fields = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "repeat_penalty", "repetition_penalty",
              "prompt", "messages")
    hits = [(msg.find(f), f) for f in fields if f in msg]
    param = min(hits)[1] if hits else None
    param = "repeat_penalty" if param == "repetition_penalty" else param
    code = "context_length_exceeded" if "context holds" in msg else None
    return APIError(400, msg, param=param, code=code)


@dataclass(frozen=True)
class GenRequest:
    """One parsed generation request: a raw prompt (text after the chat template, or token ids) and its options."""
    chat: bool
    prompt: str | tuple[int, ...]
    options: CallSettings
    stream: bool
    include_usage: bool
    max_tokens_given: bool  # the client set max_tokens / max_completion_tokens (else: to the end, options None)


# field -> the values we accept for it (OpenAI features we do not implement)
_UNSUPPORTED = {
    "best_of": (None, 1), "echo": (None, False), "suffix": (None, ""), "logprobs": (None, False, 0),
    "top_logprobs": (None, 0), "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}), "tools": (None, []), "functions": (None, []), "tool_choice": (None, "none"),
    "audio": (None,), "modalities": (None, ["text"]), "prediction": (None,),
}
_HINTS = {"presence_penalty": "; use repeat_penalty (an extension field) instead",
          "frequency_penalty": "; use repeat_penalty (an extension field) instead"}


def _number(body: dict, name: str, default: float | None) -> float | None:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise invalid(f"{name} must be a finite number, got {v!r}", name)
    return float(v)


def _integer(body: dict, name: str, default: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise invalid(f"{name} must be an integer, got {v!r}", name)
    return v


def _stop(body: dict) -> tuple[str, ...]:
    v = body.get("stop")
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,) if v else ()
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return tuple(s for s in v if s)
    raise invalid(f"stop must be a string or a list of strings, got {v!r}", "stop")


def _common(body: dict) -> tuple[CallSettings, bool, bool, bool]:
    for name, ok in _UNSUPPORTED.items():
        if name in body and body[name] not in ok:
            raise invalid(f"{name} is not supported by specedge serve (allowed: {ok[1:] or 'leave it out'})"
                          + _HINTS.get(name, ""), name)
    n = _integer(body, "n", 1)
    if n != 1:
        raise invalid(f"n must be 1 (one choice per request), got {n}: send n separate requests instead", "n")
    # max_completion_tokens (the chat API's current name) wins over max_tokens (the older one) when both are set
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, name)  # None: to the end of the turn or the context limit
    if max_tokens is not None and max_tokens < 1:
        raise invalid(f"{name} must be >= 1, got {max_tokens}", name)
    seed = _integer(body, "seed", 0)
    try:  # a value out of range is a 400 naming the field (CallSettings validates at construction)
        opts = CallSettings(max_tokens=max_tokens, temperature=_number(body, "temperature", None),
                            top_p=_number(body, "top_p", None), top_k=_integer(body, "top_k"),
                            min_p=_number(body, "min_p", None), repeat_penalty=_number(body, "repeat_penalty", 1.0),
                            seed=seed, stop=_stop(body))
    except ValueError as e:
        raise engine_error(e) from None
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise invalid(f"stream must be true or false, got {stream!r}", "stream")
    so = body.get("stream_options") or {}
    if not isinstance(so, dict):
        raise invalid(f"stream_options must be an object, got {so!r}", "stream_options")
    return opts, bool(stream), bool(so.get("include_usage", False)), max_tokens is not None


def parse_completion(body: dict, *, vocab_size: int) -> GenRequest:
    """POST /v1/completions: `prompt` is a string, a list of token ids, or a one-element list of either."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise invalid(f"prompt holds {len(prompt)} prompts: batches are not supported, send one request per prompt",
                      "prompt")
    if isinstance(prompt, list):
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in prompt):
            raise invalid(f"prompt as a list must hold token ids in [0, {vocab_size}), got {prompt[:8]!r}...",
                          "prompt")
        prompt = tuple(prompt)
    elif not isinstance(prompt, str):
        raise invalid(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}", "prompt")
    opts, stream, usage, given = _common(body)
    return GenRequest(False, prompt, opts, stream, usage, given)


def chat_messages(body: dict) -> list[dict]:
    """The request's messages as [{"role", "content": str}]; content parts of type text are joined."""
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
        out.append({"role": "system" if m["role"] == "developer" else m["role"], "content": content})
    return out


def parse_chat(body: dict, rendered: str) -> GenRequest:
    """POST /v1/chat/completions, given the messages already rendered by the model's chat template."""
    opts, stream, usage, given = _common(body)
    return GenRequest(True, rendered, opts, stream, usage, given)


# ---- responses --------------------------------------------------------------------------------------------------

def openai_finish(reason: str) -> str:
    """OpenAI's finish_reason: eos and stop strings are "stop", length is "length"; a cancelled call (its client
    went away, or the server is shutting down) reports "stop" since no more text follows."""
    return "length" if reason == "length" else "stop"


def extension(stats: dict) -> dict:
    """The `specedge` field: the call's speculative-decoding statistics (docs/server.md)."""
    keys = ("drafter", "n_generated", "n_drafted", "n_accepted", "acceptance_rate", "n_target_forwards",
            "tokens_per_s", "ttft_s", "prompt_tokens", "reused_prompt_tokens", "n_prefilled", "prefill_s",
            "decode_s", "wall_s", "finish_reason", "sampling")
    out = {k: stats.get(k) for k in keys}
    out["tau"] = stats.get("mean_accepted_length")
    return out


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


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

    def _choice(self, text: str | None, finish: str | None, *, delta: bool, first: bool = False) -> dict:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        if not delta:
            return {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": None, "finish_reason": finish}
        d = {} if text is None else {"content": text}
        if first:
            d = {"role": "assistant", **d}
        return {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}

    def completion(self, text: str, reason: str, prompt_tokens: int, completion_tokens: int, stats: dict) -> dict:
        obj = "chat.completion" if self.chat else "text_completion"
        return {**self._head(obj), "choices": [self._choice(text, openai_finish(reason), delta=False)],
                "usage": usage(prompt_tokens, completion_tokens), "specedge": extension(stats)}

    def chunk(self, text: str | None, *, first: bool = False, reason: str | None = None, stats: dict | None = None,
              with_usage: bool = False) -> dict:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        finish = openai_finish(reason) if reason is not None else None
        out = {**self._head(obj), "choices": [self._choice(text, finish, delta=True, first=first)]}
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
