"""The OpenAI wire format for `specedge serve`: request bodies -> typed requests, results -> response JSON.

Pure functions over dicts (no I/O), so the server module only routes, queues and streams. This module parses the
options every route shares and builds the GenRequest; its parts live beside it: openai_errors.py (APIError),
openai_chat.py (a chat body's messages and tools), openai_grammar.py (response_format and the grammar extensions),
openai_shapes.py (response JSON), openai_responses.py (/v1/responses). Requests follow
OpenAI's /v1/completions and /v1/chat/completions; every documented field is honoured or, where we cannot (best_of,
suffix, audio, ...), refused with a 400 naming the field, never silently ignored;
an unknown field is refused the same way (COMMON_FIELDS, CHAT_FIELDS, COMPLETION_FIELDS; docs/server.md's table). Values are checked for
their JSON type here and for their range by specedge.Engine (apps/api.py), whose ValueError messages the client
sees unchanged.

Extension fields (llama.cpp's server uses the same names): request `top_k`, `min_p`, `typical_p`, `repeat_penalty`,
`dry_multiplier`, `dry_base`, `dry_allowed_length` (DRY; llama.cpp's `dry_penalty_last_n` and
`dry_sequence_breakers` are refused: ours looks at the whole context and breaks at the model's newline, ':', '"', '*'
and end-of-turn tokens), `grammar` (GBNF) and `json_schema` (a schema object), and our `regex` and
`repetition_stop`; response `specedge` with the speculative-decoding statistics of the call (see docs/server.md for
its schema). The CallSettings fields with a `wire` type are these extensions' (WIRE_FIELDS); the rest are OWN_RULES.

Omitted fields take specedge's defaults, as the CLI and the Engine do, but for the length: no max_tokens /
max_completion_tokens decodes to the end of the turn (EOS, a stop string) or the context limit, as OpenAI's, for
both routes (finish_reason "length" only at the limit; the CLI and the Engine cap answers at 1024 tokens), an
answer that repeats itself stopping there (`repetition_stop`, on unless the request says false); no temperature / top_p / top_k / min_p samples with the model's own defaults
(assembly/sampling_defaults.py; temperature 0.7, top_p 0.9 when the model states none, repeat_penalty 1.1 for
sampled calls), not OpenAI's temperature 1;
temperature 0 is greedy; seed 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

from ..assembly.decoder import MAX_TOP_LOGPROBS, CallSettings
from .openai_chat import chat_tools
from .openai_errors import APIError, invalid
from .openai_grammar import constraint_field, grammar_of
from .tool_grammar import forced_grammar
from .tools import Tool

if TYPE_CHECKING:
    from .openai_responses_shapes import ResponsesEcho

_GRAMMAR_ERRORS = ("the JSON schema", "the GBNF grammar", "the Lark grammar", "the JsonSchema grammar",
                   "the JsonObject grammar", "the Regex grammar", "the Gbnf grammar")


def engine_error(e: ValueError, req: "GenRequest | None" = None) -> APIError:
    """A 400 from an Engine ValueError (a value out of range, a prompt longer than the context, a grammar llguidance
    refuses); param is the request field it is about: the constraint's field for a grammar error (`tools` for a
    forced call, whose message then keeps llguidance's reason, not the internal grammar it was embedded in), else
    the first field the message names (`messages` for a chat prompt)."""
    msg = str(e)
    if req is not None and req.constraint and msg.startswith(_GRAMMAR_ERRORS):
        reason = msg.split("\n", 1)[0]
        if req.constraint == "tools":
            reason = reason.split("failed to compile JSON schema: ", 1)[-1].split(": ", 1)[-1] \
                if "JSON schema" in reason else reason
            reason = f"a forced tool's parameters are not a JSON Schema llguidance can enforce: {reason}"
        return APIError(400, reason, param=req.constraint)
    sampling = (f.name for f in fields(CallSettings) if f.name not in ("seed", "stop", "grammar", "logprobs"))
    hits = [(msg.find(f), f) for f in (*sampling, "prompt", "messages") if f in msg]
    param = min(hits)[1] if hits else None
    if param == "prompt" and req is not None and req.chat:
        param = "messages"
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
    n: int = 1  # choices: decoded n times with seeds seed, seed+1, ... (not streamed)
    tools: tuple[Tool, ...] = ()  # chat: offered (and parsed) tools; empty with tool_choice "none"
    parallel_tool_calls: bool = True
    echo: bool = False  # completions: the prompt's text precedes the completion
    constraint: str | None = None  # the field that set the grammar (response_format, ..., tools): errors name it
    responses: "ResponsesEcho | None" = None  # /v1/responses: what its Response object repeats (else chat/text)

    @property
    def route(self) -> str:
        return "/v1/responses" if self.responses is not None else \
            "/v1/chat/completions" if self.chat else "/v1/completions"

    def call(self, i: int = 0) -> CallSettings:
        """The CallSettings of choice i: the request's, with seed + i."""
        return replace(self.options, seed=self.options.seed + i) if i else self.options


# Every documented request field, and how it is honoured (docs/server.md's table). A field not listed in its route's
# set is refused with a 400 naming it; a listed field with a value we cannot honour is refused the same way.
# the CallSettings fields declared with a `wire` type (assembly/decoder.py option): temperature, top_p and the
# extensions (llama.cpp's server's names, and repetition_stop), parsed alike in _common
MAX_TOKENS = 2**31 - 1  # a token count llama.cpp's int32 positions can hold; larger is a client error
OPENAI_RANGES = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0)}
WIRE_FIELDS = {f.name: f.metadata["wire"] for f in fields(CallSettings) if f.metadata.get("wire")}
# the other CallSettings fields: OpenAI's, each with a rule of its own in _common (every field is one or the other)
OWN_RULES = ("max_tokens", "presence_penalty", "frequency_penalty", "logit_bias", "seed", "stop", "grammar", "logprobs")
COMMON_FIELDS = {"model", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n", "presence_penalty", "seed",
                 "stop", "stream", "stream_options", "user",
                 # extensions (llama.cpp's server names): grammars
                 "response_format", "grammar", "json_schema", "regex", *WIRE_FIELDS}
CHAT_FIELDS = COMMON_FIELDS | {"messages", "audio", "function_call", "functions", "max_completion_tokens", "metadata",
                               "modalities", "parallel_tool_calls", "prediction", "prompt_cache_key",
                               "reasoning_effort", "safety_identifier", "service_tier", "store", "tool_choice",
                               "tools", "top_logprobs", "verbosity", "web_search_options"}
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt", "best_of", "echo", "suffix",
                                     "max_completion_tokens"}  # the chat name, accepted on both routes
MAX_N = 16
MAX_COMPLETION_LOGPROBS = 5  # the legacy API's limit

# field -> (values accepted, why others are refused). None is always accepted (OpenAI's "not given").
_FIXED = {
    "best_of": ((1,), "best_of > 1 is not supported: use n"),
    "suffix": (("",), "suffix (insertion) is not supported"),
    "functions": (([],), "functions (deprecated) is not supported: use tools"),
    "function_call": (("none",), "function_call (deprecated) is not supported: use tool_choice"),
    "audio": ((), "audio output is not supported"),
    "modalities": ((["text"],), 'only modalities ["text"] is supported'),
    "prediction": ((), "prediction (predicted outputs) is not supported"),
    "reasoning_effort": ((), "reasoning_effort is not supported (the model has no reasoning mode)"),
    "service_tier": (("auto", "default"), 'service_tier must be "auto" or "default" (one tier here)'),
    "store": ((False,), "store is not supported (nothing is stored): leave it out or false"),
    "verbosity": (("medium",), 'verbosity is not supported (only the default "medium")'),
    "web_search_options": ((), "web search is not supported"),
}
_STRINGS = ("user", "prompt_cache_key", "safety_identifier")  # honoured as no-ops: accepted when strings


def _check_fields(body: dict, known: set[str], route: str) -> None:
    unknown = sorted(set(body) - known)
    if unknown:
        raise invalid(f"unknown field {unknown[0]!r} for {route} (docs/server.md lists the fields honoured)",
                      unknown[0])
    for name, (ok, why) in _FIXED.items():
        v = body.get(name)
        if v is not None and not any(v == o and type(v) is type(o) for o in ok):  # False is not 0
            raise invalid(f"{why}; got {name}={v!r}", name)
    for name in _STRINGS:
        if body.get(name) is not None and not isinstance(body[name], str):
            raise invalid(f"{name} must be a string, got {body[name]!r}", name)
    md = body.get("metadata")
    if md is not None and not (isinstance(md, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                            for k, v in md.items())):
        raise invalid(f"metadata must be an object of string values, got {md!r}", "metadata")


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


def _boolean(body: dict, name: str, default: bool | None = None) -> bool | None:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise invalid(f"{name} must be true or false, got {v!r}", name)
    return v


_WIRE_TYPES = {"number": _number, "integer": _integer, "boolean": _boolean}


def _stop(body: dict) -> tuple[str, ...]:
    v = body.get("stop")
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,) if v else ()
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return tuple(s for s in v if s)
    raise invalid(f"stop must be a string or a list of strings, got {v!r}", "stop")


def _penalty(body: dict, name: str) -> float:
    """presence_penalty / frequency_penalty: OpenAI's range [-2, 2], applied as llama.cpp applies them (over the
    last 64 tokens, runtime/sampling.py)."""
    v = _number(body, name, 0.0)
    if not -2.0 <= v <= 2.0:
        raise invalid(f"{name} must be in [-2, 2], got {v}", name)
    return v


def _logit_bias(body: dict) -> dict[int, float]:
    """logit_bias: an object of token ids (as strings) to biases in [-100, 100], added to the target's logits
    before sampling (ids the vocabulary lacks are refused by the Engine)."""
    v = body.get("logit_bias")
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise invalid(f'logit_bias must be an object of token ids to biases, e.g. {{"15043": -100}}, got {v!r}',
                      "logit_bias")
    out = {}
    for key, bias in v.items():
        if not (isinstance(key, str) and key.isdigit()) or isinstance(bias, bool) \
                or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise invalid(f"logit_bias maps token ids (strings of digits) to numbers in [-100, 100], got "
                          f"{key!r}: {bias!r}", "logit_bias")
        out[int(key)] = float(bias)
    return out


def _logprobs(body: dict, chat: bool) -> int | None:
    """CallSettings.logprobs: chat `logprobs` true + `top_logprobs` 0..20; completions `logprobs` 0..5."""
    v = body.get("logprobs")
    if chat:
        if v is not None and not isinstance(v, bool):
            raise invalid(f"logprobs must be true or false, got {v!r}", "logprobs")
        top = _integer(body, "top_logprobs")
        if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
            raise invalid(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {top}", "top_logprobs")
        if top is not None and not v:
            raise invalid("top_logprobs needs logprobs: true", "top_logprobs")
        return (top or 0) if v else None
    n = _integer(body, "logprobs")
    if n is not None and not 0 <= n <= MAX_COMPLETION_LOGPROBS:
        raise invalid(f"logprobs must be in [0, {MAX_COMPLETION_LOGPROBS}], got {n}", "logprobs")
    return n


def _common(body: dict, chat: bool) -> tuple[CallSettings, bool, bool, bool, int]:
    _check_fields(body, CHAT_FIELDS if chat else COMPLETION_FIELDS,
                  "/v1/chat/completions" if chat else "/v1/completions")
    # max_completion_tokens (the chat API's current name) wins over max_tokens (the older one) when both are set
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, name)  # None: to the end of the turn or the context limit
    if max_tokens is not None and not 1 <= max_tokens <= MAX_TOKENS:
        raise invalid(f"{name} must be in [1, {MAX_TOKENS}], got {max_tokens} (leave it out to answer to the end "
                      "of the turn)", name)
    seed = _integer(body, "seed", 0)
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise invalid(f"stream must be true or false, got {stream!r}", "stream")
    n = _integer(body, "n", 1)
    if not 1 <= n <= MAX_N:
        raise invalid(f"n must be in [1, {MAX_N}], got {n}", "n")
    if n > 1 and stream:
        raise invalid(f"n > 1 is not supported with stream: true (got n={n}): stream one choice per request, or "
                      "drop stream", "n")
    so = body.get("stream_options") or {}
    if not isinstance(so, dict):
        raise invalid(f"stream_options must be an object, got {so!r}", "stream_options")
    extra = sorted(set(so) - {"include_usage", "include_obfuscation"})
    if extra or so.get("include_obfuscation"):
        raise invalid(f"stream_options supports include_usage (include_obfuscation: false only), got {so!r}",
                      "stream_options")
    wire = {name: _WIRE_TYPES[kind](body, name, None) for name, kind in WIRE_FIELDS.items()}
    for name, (low, high) in OPENAI_RANGES.items():  # OpenAI's own ranges (the CLI and Engine allow more)
        if wire.get(name) is not None and not low <= wire[name] <= high:
            raise invalid(f"{name} must be in [{low}, {high}], got {wire[name]}", name)
    try:  # a value out of range is a 400 naming the field (CallSettings validates at construction)
        opts = CallSettings(max_tokens=max_tokens, **{k: v for k, v in wire.items() if v is not None},
                            presence_penalty=_penalty(body, "presence_penalty"),
                            frequency_penalty=_penalty(body, "frequency_penalty"), logit_bias=_logit_bias(body),
                            seed=seed, stop=_stop(body), grammar=grammar_of(body), logprobs=_logprobs(body, chat))
    except ValueError as e:
        raise engine_error(e) from None
    return opts, bool(stream), bool(so.get("include_usage", False)), max_tokens is not None, n


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
    opts, stream, usage_, given, n = _common(body, chat=False)
    echo = body.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise invalid(f"echo must be true or false, got {echo!r}", "echo")
    if echo and opts.logprobs is not None:
        raise invalid("echo with logprobs is not supported (the prompt's logprobs are not computed): drop one",
                      "echo")
    return GenRequest(False, prompt, opts, stream, usage_, given, n=n, echo=bool(echo),
                      constraint=constraint_field(body))


def parse_chat(body: dict, rendered: str, *, max_calls: int | None = None) -> GenRequest:
    """POST /v1/chat/completions, given the messages already rendered by the model's chat template (with the tools
    chat_tools returns). A forced tool_choice sets the grammar of its call(s) (at most max_calls; default: one per
    tool, apps/tool_grammar.py forced_grammar); with response_format too: 400."""
    opts, stream, usage_, given, n = _common(body, chat=True)
    tools, choice, parallel = chat_tools(body)
    if choice not in ("auto", "none"):
        if opts.grammar is not None:
            raise invalid("response_format (or another output constraint) cannot be combined with a forced "
                          "tool_choice: the call's arguments follow the tool's parameters", "tool_choice")
        opts = replace(opts, grammar=forced_grammar(tools, choice, parallel=parallel, max_calls=max_calls))
    offered = tuple(tools) if choice != "none" else ()
    constraint = constraint_field(body) if choice in ("auto", "none") else "tools"
    return GenRequest(True, rendered, opts, stream, usage_, given, n=n, tools=offered, parallel_tool_calls=parallel,
                      constraint=constraint)


# ---- responses (apps/openai_shapes.py; re-exported for the server) ------------------------------------------------

from .openai_shapes import Shape, extension, model_card, models_list, openai_finish, usage  # noqa: E402,F401
