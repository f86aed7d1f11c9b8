"""The embeddable Python API: `specedge.Engine` loads a model and its drafter once and serves `generate`, `stream`
and `chat` calls from any thread.

    from specedge import Engine
    engine = Engine("smollm2-135m")  # the plan for this machine; Engine("smollm2-135m", plan=False): llama.cpp
    # (the engine the model names: llama.cpp for a GGUF; Engine("smollm2-135m-onnx-int4", plan=False): ONNX Runtime)
    print(engine.chat([{"role": "user", "content": "Hi!"}], max_tokens=64).text)
    for chunk in engine.stream("Once upon a time", max_tokens=32, temperature=0.8, seed=1):
        print(chunk.text, end="", flush=True)

Structured output, tools and logprobs are keyword arguments of every call (docs/api.md):

    from specedge import Engine, JsonSchema, Tool
    engine.generate(prompt, grammar=JsonSchema({"type": "object", ...}), logprobs=2)  # .logprobs: TokenLogprob
    engine.chat(messages, tools=[Tool("get_weather", "...", {...})], tool_choice="required").tool_calls

Calls are serialised on one lock (one backend, one KV cache); each call brings its own sampling settings, seed,
stop strings and an optional `threading.Event` that cancels it between tokens. The engine keeps one Session
(runtime/session.py): a call whose prompt shares a prefix with the previous call's tokens (the next chat turn, a
repeated system prompt) prefills only the rest.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ..assembly.decoder import CallSettings, DecodeSettings, Decoder, ModelSettings, load
from ..assembly.load import LoadedModel, parse_drafter
from ..runtime.backends import BackendKind
from ..runtime.generate import collect
from ..runtime.session import Session
from ..runtime.stats import DecodeStats
from ..runtime.types import FinishReason, GenerationResult, Response
from ..runtime.verify import VerifierKind
from .tools import Tool, ToolCall, ToolChoice, forced_grammar, parse_tool_calls, render_messages, resolve_choice, \
    tools_of


@dataclass(frozen=True)
class ChatResult(GenerationResult):
    """A chat answer: the GenerationResult (text is the raw output, call markup included) plus `content` (the text
    outside tool calls) and `tool_calls` (the calls parsed from it; empty without tools)."""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


class Engine:
    """One loaded target (+ drafter); thread-safe calls, one at a time.

    model: a catalogue name or GGUF path, or an exported ONNX artifact directory or cache name. With none of
    backend, drafter, k and device given and plan=True (the default), the engine runs the plan for this model and
    machine (assembly/plan.py: engine, weight format, drafter and k measured fastest; measured on first use, then
    cached; `self.plan` holds it); otherwise backend (default: the engine the model names), drafter (as `specedge
    generate --drafter`; default ngram) and k (default 4) are honoured exactly. ctx: positions the engine's KV
    cache holds (prompt + answer); default min(model context, 4096).
    `stream` yields runtime Responses (text, token, from_draft, tokens_per_s, finish_reason); `generate` and
    `chat` return a GenerationResult (text, tokens, finish_reason, prompt_tokens, stats).

    Call defaults: max_tokens None = to the end of the turn (EOS, a stop string) or the context limit; temperature,
    top_p, top_k, min_p None = the model's own defaults (`sampling_defaults`: GGUF general.sampling.*, an artifact's
    recorded generation config, else temperature 0.7, top_p 0.9); temperature=0 is greedy; seed 0.
    """

    def __init__(self, model: str = "smollm2-135m", *, backend: str | None = None, drafter: str | None = None,
                 k: int | None = None, adaptive_k: bool = True, verifier: str = "chain", ctx: int | None = None,
                 threads: int | None = None, device: str = "auto", cache_dir: str | Path | None = None,
                 log=None, plan: bool = True) -> None:
        decode = DecodeSettings(parse_drafter(drafter or "ngram"), 4 if k is None else k, adaptive_k,
                                VerifierKind(verifier))
        settings = ModelSettings(model, BackendKind(backend) if backend else None, ctx=ctx, threads=threads,
                                 device=device, cache_dir=Path(cache_dir) if cache_dir is not None else None)
        self.plan = None
        from ..assembly.plan_run import planned, wants_plan
        if wants_plan(backend=backend, drafter=drafter, k=k, device=device, no_plan=not plan):
            self.plan, settings, decode = planned(settings, decode, progress=False, log=log or (lambda m: None))
        decoder = Decoder(load(settings, log), settings, decode)
        self._init(decoder, model, str(decoder.settings.drafter))

    @classmethod
    def from_decoder(cls, decoder: Decoder, name: str) -> "Engine":
        """An Engine over an already built decoder (the CLI builds one from its options)."""
        engine = cls.__new__(cls)
        engine.plan = None
        engine._init(decoder, name, str(decoder.settings.drafter))
        return engine

    def _init(self, decoder: Decoder, name: str, drafter_name: str) -> None:
        self.decoder, self.name, self.drafter_name = decoder, name, drafter_name
        self.backend_kind = decoder.model.kind.value
        self.session = Session(decoder.model.backend, decoder.model_settings.ctx)
        self._lock = threading.Lock()

    @property
    def model(self) -> LoadedModel:
        return self.decoder.model

    @property
    def drafter(self):
        """The running drafter (None for plain decoding)."""
        return self.decoder.drafter

    @property
    def sampling_defaults(self):
        """The model's SamplingDefaults (assembly/sampling_defaults.py): what unset sampling options resolve to."""
        return self.decoder.sampling_defaults

    @property
    def k(self) -> int:
        return self.decoder.settings.k

    @property
    def adaptive_k(self) -> bool:
        return self.decoder.settings.adaptive_k

    @property
    def tokenizer(self):
        return self.model.tokenizer

    @property
    def context_length(self) -> int:
        return self.session.capacity

    @property
    def busy(self) -> bool:
        """A call (or set_drafter / reset) holds the engine now."""
        return self._lock.locked()

    def render_chat(self, messages: Sequence[dict], tools: Sequence[Tool] = (), tool_choice: ToolChoice = "auto") \
            -> str:
        """The model's chat template over messages ([{"role", "content"}], assistant messages may carry
        `tool_calls`, role "tool" messages a `tool_call_id`), with the generation prompt and the tools offered
        (apps/tools.py: through the template when it renders tools, else a system message)."""
        return render_messages(self.tokenizer, messages, tools_of(tools), resolve_choice(tool_choice, tools_of(tools)))

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text)]

    def stream(self, prompt: str | Sequence[int], *, cancel: threading.Event | None = None, stats: dict | None = None,
               **options) -> Iterator[Response]:
        """Decode a raw prompt (text, no chat template; or token ids) and yield Responses. Options: max_tokens
        (default: to the end of the turn or the context limit), temperature, top_p, top_k, min_p (default: the
        model's, see `sampling_defaults`; temperature 0 = greedy), repeat_penalty, presence_penalty, frequency_penalty
        (llama.cpp's, over the last 64 tokens), logit_bias ({token id: bias}, -inf bans), seed (0), stop, grammar (a
        JsonSchema, JsonObject, Regex, Lark or Gbnf the output must match), logprobs (None; n: each Response's
        `logprob` with the n most likely alternatives, 0..20). Invalid values
        raise ValueError here, before anything runs. `stats`, if given, is filled with the call's statistics when it
        ends, `sampling` (the values used) included."""
        call = CallSettings(**options)
        self.decoder.check(call)  # a bad logit_bias id or a grammar llguidance refuses: ValueError before anything runs
        ids = np.asarray(self.encode(prompt) if isinstance(prompt, str) else list(prompt), dtype=np.int32)
        self._check_length(len(ids))
        return self._run(ids, call, cancel, stats if stats is not None else {})

    def generate(self, prompt: str | Sequence[int], **options) -> GenerationResult:
        """Decode a raw prompt to the end (see `stream` for the options, including cancel)."""
        return self._collect(prompt, options)

    def chat(self, messages: Sequence[dict], *, stream: bool = False, tools: Sequence[Tool] = (),
             tool_choice: ToolChoice = "auto", parallel_tool_calls: bool = True, **options):
        """Render messages with the chat template and decode: a ChatResult (content and tool_calls parsed), or an
        iterator of Responses with stream=True (raw text, call markup included: apps.tools.ToolStream parses it).
        tools: Tool objects (or OpenAI dicts); tool_choice "auto" (the model decides), "none" (tools not offered,
        nothing parsed), "required" (the output is forced to be calls of the given tools) or a tool's name /
        ForceTool (forced to call it); parallel_tool_calls=False forces exactly one call. A forced choice sets the
        grammar: passing grammar= too is a ValueError."""
        tools = tools_of(tools)
        choice = resolve_choice(tool_choice, tools)
        if choice not in ("auto", "none"):
            if options.get("grammar") is not None:
                raise ValueError("grammar cannot be combined with a forced tool_choice (the call's grammar is the "
                                 "tool's parameter schema): drop one of them")
            options["grammar"] = forced_grammar(tools, choice, parallel=parallel_tool_calls)
        text = render_messages(self.tokenizer, messages, tools, choice)
        if stream:
            return self.stream(text, **options)
        result = self._collect(text, options)
        content, calls = parse_tool_calls(result.text, tools if choice != "none" else [])
        if calls and not parallel_tool_calls:
            calls = calls[:1]
        fields = {f: getattr(result, f) for f in GenerationResult.__dataclass_fields__}
        return ChatResult(**fields, content=content, tool_calls=calls)

    def set_drafter(self, drafter: str) -> None:
        """Switch the drafter between calls (waits for a running call). requires: a spec as for the constructor;
        it is parsed and built with the same start-up checks as at load (tokenizer match, tree masks, layered
        artifact), and on any error (ValueError, FileNotFoundError, ImportError, RuntimeError) the old drafter
        stays. The target and its cached conversation prefix are kept."""
        spec = parse_drafter(drafter)
        with self._lock:
            s = self.decoder.settings
            self.decoder = self.decoder.with_decode(DecodeSettings(spec, s.k, s.adaptive_k, s.verifier))
            self.drafter_name = drafter

    def reset(self) -> None:
        """Forget the cached conversation prefix (the next call prefills its whole prompt)."""
        with self._lock:
            self.session.reset()

    def _collect(self, prompt, options) -> GenerationResult:
        stats: dict = {}
        logprobs: list = []

        def kept(responses):
            for r in responses:
                if r.logprob is not None and r.finish_reason is not FinishReason.EOS:  # EOS is not in `tokens`
                    logprobs.append(r.logprob)
                yield r

        result = collect(kept(self.stream(prompt, stats=stats, **options)))
        return replace(GenerationResult(result.text, result.tokens, result.finish_reason, stats["prompt_tokens"],
                                        stats), logprobs=logprobs if options.get("logprobs") is not None else None)

    def _check_length(self, n_prompt: int) -> None:
        if n_prompt == 0:
            raise ValueError("the prompt is empty: give at least one token")
        if n_prompt + 1 > self.session.capacity:
            raise ValueError(f"the prompt has {n_prompt} tokens but the context holds {self.session.capacity}: "
                             "shorten the prompt (or the conversation) or raise ctx (--ctx)")

    def _run(self, ids: np.ndarray, call: CallSettings, cancel, out: dict) -> Iterator[Response]:
        with self._lock:
            dstats, t0, ttft = DecodeStats(), time.perf_counter(), None
            reason = FinishReason.LENGTH
            try:
                for r in self.decoder.stream(ids, call, stats=dstats, session=self.session):
                    ttft = ttft if ttft is not None else time.perf_counter() - t0
                    if cancel is not None and cancel.is_set() and r.finish_reason is None:
                        reason = FinishReason.CANCELLED
                        yield Response(r.text, r.token, r.from_draft, r.tokens_per_s, reason)
                        return
                    reason = r.finish_reason or reason
                    yield r
            finally:
                out.update(dstats.to_dict(), prompt_tokens=len(ids), reused_prompt_tokens=self.session.reused,
                           ttft_s=ttft, wall_s=time.perf_counter() - t0, drafter=self.drafter_name,
                           finish_reason=reason.value, sampling=self.decoder.sampling_used(call))
