"""The embeddable Python API: `specedge.Engine` holds one decoder (a loaded model and its drafter) and serves
`generate`, `stream` and `chat` calls from any thread.

    from specedge import Engine
    engine = Engine.open("smollm2-135m")  # the plan for this machine; Engine.open("smollm2-135m", plan=False):
    # the engine the model names (llama.cpp for a GGUF; "smollm2-135m-onnx-int4": ONNX Runtime) + ngram k<=4 where
    # that is lossless at these threads, else plain
    print(engine.chat([{"role": "user", "content": "Hi!"}], max_tokens=64).text)
    for chunk in engine.stream("Once upon a time", max_tokens=32, temperature=0.8, seed=1):
        print(chunk.text, end="", flush=True)

`Engine(decoder)` wraps a decoder opened by assembly/open.py (what the CLI and the server do); `Engine.open(model,
**settings)` opens one, the settings named as ModelSettings and DecodeSettings fields. Per-call options are the
CallSettings fields, as keywords or as one `call=CallSettings(...)` (the server passes its parsed request's).

Structured output, tools and logprobs are options of every call (docs/api.md):

    from specedge import Engine, JsonSchema, Tool
    engine.generate(prompt, grammar=JsonSchema({"type": "object", ...}), logprobs=2)  # .logprobs: TokenLogprob
    engine.chat(messages, tools=[Tool("get_weather", "...", {...})], tool_choice="required").tool_calls

Calls are serialised on one lock (one backend, one KV cache); each call brings its own sampling settings, seed,
stop strings and an optional `threading.Event` that cancels it between tokens. The engine keeps one Session
(runtime/session.py): a call whose prompt shares a prefix with the previous call's tokens (the next chat turn, a
repeated system prompt) prefills only the rest.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from pathlib import Path
from dataclasses import dataclass, field, replace
from typing import Iterator, Sequence

import numpy as np

from ..assembly.decoder import CallSettings, CallStream, DecodeSettings, Decoder
from ..assembly.load import LoadedModel, parse_drafter
from ..assembly.notice import Measuring
from ..assembly.open import open_decoder, settings_from
from ..runtime.backends.llamacpp_embed import LlamaCppEmbedder
from ..runtime.cores import CoreShare, ThreadedBackend, same_logits_across_threads
from ..runtime.decode import check_prompt
from ..runtime.generate import collect
from ..runtime.session import Session
from ..runtime.types import FinishReason, GenerationResult, Response
from .tool_grammar import forced_grammar
from .tool_parse import parse_tool_calls
from .tools import Tool, ToolCall, ToolChoice, render_messages, resolve_choice, tools_of


LOGGER = logging.getLogger("specedge.engine")


def engine_log(message: str) -> None:
    """Engine.open's default log: a measurement's announcement (assembly/notice.py Measuring) at WARNING, so it is
    never silent, the other lines at INFO."""
    LOGGER.log(logging.WARNING if isinstance(message, Measuring) else logging.INFO, message)


@dataclass(frozen=True)
class ChatResult(GenerationResult):
    """A chat answer: the GenerationResult (text is the raw output, call markup included) plus `content` (the text
    outside tool calls) and `tool_calls` (the calls parsed from it; empty without tools)."""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


class Engine:
    """One decoder (a loaded target + drafter); thread-safe calls, one at a time.

    `stream` yields runtime Responses (text, token, from_draft, tokens_per_s, finish_reason, logprob); `generate`
    and `chat` return a GenerationResult (text, tokens, finish_reason, prompt_tokens, stats: CallStats, logprobs).

    Call options: the CallSettings fields (assembly/decoder.py declares each with its default and help; docs/api.md's
    table), as keywords or one `call=CallSettings(...)`; an unknown keyword is a TypeError listing them. None for
    temperature, top_p, top_k, min_p: the model's own defaults (`sampling_defaults`); temperature=0 is greedy.
    """

    def __init__(self, decoder: Decoder, name: str | None = None, cores: CoreShare | None = None,
                 same_logits: bool | None = None) -> None:
        """cores: the process's CoreShare (runtime/cores.py), given where calls of several engines may compute at
        once (the server): each step of a call then runs with its share of the decoder's thread count, where the
        backend's logits are the same at every thread count: `same_logits` when known (the server caches it),
        else probed here, before the session takes the cache."""
        if not isinstance(decoder, Decoder):
            raise TypeError(f"Engine(decoder) takes a Decoder (assembly/open.py open_decoder); to open a model by "
                            f"name use Engine.open({decoder!r}, ...)")
        self.decoder, self.name = decoder, name or decoder.model_settings.model
        self.plan = decoder.plan  # the plan that chose the decoder's settings (None: they were given)
        backend = decoder.model.backend
        self.threads = int(backend.threads) if isinstance(backend, ThreadedBackend) else None  # alone: the plan's
        self.cores = cores
        self.shares_threads = bool(cores is not None and self.threads and self.threads > 1 and (
            same_logits if same_logits is not None else same_logits_across_threads(backend, self.threads)))
        self.session = Session(decoder.model.backend, decoder.model_settings.ctx)
        self._lock = threading.Lock()
        self._embed_lock, self._embedder = threading.Lock(), None  # embed(): llama.cpp's embedding context
        self._last: tuple[str, list[int]] | None = None  # the last text call's prompt + answer, as text and ids

    @classmethod
    def open(cls, model: str = "smollm2-135m", *, plan: bool = True, auto: bool = False, log=None,
             **settings) -> "Engine":
        """Open `model` (a catalogue name or GGUF path, or an exported ONNX artifact directory or cache name).

        settings: ModelSettings and DecodeSettings fields (backend, ctx, threads, device, gpu_layers, cache_dir;
        drafter, k, adaptive_k, verifier, lossy), text or typed. With none of backend, device, gpu_layers, drafter,
        k and lossy given and plan=True, the engine runs the plan for this model and machine (assembly/plan.py:
        engine, weight format, drafter and k measured fastest; measured on first use, then cached; `self.plan` holds
        it; at a thread count with no plan, the plan of the nearest other one); otherwise they are honoured exactly
        (defaults: the engine the model names, with ngram k 4 where that is lossless at these threads, else plain
        decoding). auto=True: the device profile picks the drafter and k. ctx: positions the KV cache holds (prompt
        + answer); default min(model context, 4096).

        log: where the lines the CLI prints go (what was chosen, and before any measurement its reason, estimate and
        how to skip it); default: the `specedge.engine` logger, measurements at WARNING (shown even with logging
        unconfigured), the rest at INFO."""
        model_s, decode_s = settings_from(model, **settings)
        return cls(open_decoder(model_s, decode_s, plan=plan, auto=auto, log=log or engine_log), model)

    @property
    def model(self) -> LoadedModel:
        return self.decoder.model

    @property
    def drafter(self):
        """The running drafter (None for plain decoding)."""
        return self.decoder.drafter

    @property
    def drafter_name(self) -> str:
        """What decodes: the drafter spec ("none": plain decoding) or the lossy mode's label."""
        return self.decoder.label

    @property
    def backend_kind(self) -> str:
        return self.decoder.model.kind.value

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

    def stream(self, prompt: str | Sequence[int], call: CallSettings | None = None, *,
               cancel: threading.Event | None = None, _continuing: bool = False, **options) -> CallStream:
        """Decode a raw prompt (text, no chat template; or token ids) and yield Responses; the stream's `stats`
        (CallStats) is set when it ends. The call: `call`, with `options` (CallSettings fields, see the class)
        over it. Invalid values raise ValueError here, before anything runs; `cancel`, when set, ends the call at
        its next token (finish reason `cancelled`)."""
        call = (call or CallSettings()).with_options(**options)
        self.decoder.check(call)  # a bad logit_bias id or a grammar llguidance refuses: ValueError before anything runs
        text = prompt if isinstance(prompt, str) else None
        ids = np.asarray((self._prompt_ids(prompt) if _continuing else self.encode(prompt)) if text is not None
                         else list(prompt), dtype=np.int32)
        check_prompt(len(ids), self.session.capacity)
        return CallStream(lambda out: self._locked(ids, call, cancel, out, text))

    def _prompt_ids(self, prompt: str) -> list[int]:
        """The ids of a chat prompt (Engine.chat). One that continues the last call's prompt + answer (the next
        turn) keeps that call's ids and encodes only the rest: a sampled answer does not always re-tokenize to the
        ids the model generated, and re-encoding it would lose the cached prefix from there (KV reuse) and show the
        model a tokenization it never produced. Raw prompts (`stream`, `generate`, the server) are always encoded
        whole, so the same request gives the same ids whatever came before."""
        last = self._last
        if last is not None and len(prompt) > len(last[0]) and prompt.startswith(last[0]):
            return last[1] + [int(t) for t in self.tokenizer.encode(prompt[len(last[0]):], add_bos=False)]
        return self.encode(prompt)

    def generate(self, prompt: str | Sequence[int], call: CallSettings | None = None, *,
                 cancel: threading.Event | None = None, _continuing: bool = False, **options) -> GenerationResult:
        """Decode a raw prompt to the end (see `stream`)."""
        calls = self.stream(prompt, call, cancel=cancel, _continuing=_continuing, **options)
        result = collect(calls)
        return replace(result, prompt_tokens=calls.stats.prompt_tokens, stats=calls.stats)

    def chat(self, messages: Sequence[dict], call: CallSettings | None = None, *, stream: bool = False,
             tools: Sequence[Tool] = (), tool_choice: ToolChoice = "auto", parallel_tool_calls: bool = True,
             cancel: threading.Event | None = None, **options):
        """Render messages with the chat template and decode: a ChatResult (content and tool_calls parsed), or a
        CallStream of Responses with stream=True (raw text, call markup included: apps.tool_parse.ToolStream parses it).
        tools: Tool objects (or OpenAI dicts); tool_choice "auto" (the model decides), "none" (tools not offered,
        nothing parsed), "required" (the output is forced to be calls of the given tools) or a tool's name /
        ForceTool (forced to call it); parallel_tool_calls=False forces exactly one call. A forced choice sets the
        grammar: passing a grammar too is a ValueError."""
        call = (call or CallSettings()).with_options(**options)
        tools = tools_of(tools)
        choice = resolve_choice(tool_choice, tools)
        if choice not in ("auto", "none"):
            if call.grammar is not None:
                raise ValueError("grammar cannot be combined with a forced tool_choice (the call's grammar is the "
                                 "tool's parameter schema): drop one of them")
            call = replace(call, grammar=forced_grammar(tools, choice, parallel=parallel_tool_calls))
        text = render_messages(self.tokenizer, messages, tools, choice)
        if stream:
            return self.stream(text, call, cancel=cancel, _continuing=True)
        result = self.generate(text, call, cancel=cancel, _continuing=True)
        content, calls = parse_tool_calls(result.text, tools if choice != "none" else [])
        if calls and not parallel_tool_calls:
            calls = calls[:1]
        fields_ = {f: getattr(result, f) for f in GenerationResult.__dataclass_fields__}
        return ChatResult(**fields_, content=content, tool_calls=calls)

    def set_drafter(self, drafter: str) -> None:
        """Switch the drafter between calls (waits for a running call). requires: a spec as for `open`; it is
        parsed and built with the same start-up checks as at load (tokenizer match, tree masks, layered artifact),
        and on any error (ValueError, FileNotFoundError, ImportError, RuntimeError) the old drafter stays. The
        target and its cached conversation prefix are kept."""
        spec = parse_drafter(drafter)
        with self._lock:
            s = self.decoder.settings
            self.decoder = self.decoder.with_decode(DecodeSettings(spec, s.k, s.adaptive_k, s.verifier))

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of `texts` from this model: float32 [len(texts), n_embd], each row L2-normalised (cosine
        similarity is a dot product). A GGUF model's embedding mode through llama.cpp: the final hidden states
        mean-pooled over each text's tokens (a second context on the same file, opened on first use; it never
        touches the generating context's cache). ValueError for a text longer than that context; an ONNX artifact
        has no embedding mode (use a GGUF, or specedge.open_embedder("all-minilm-l6-v2"))."""
        if isinstance(texts, str):
            texts = [texts]
        with self._embed_lock, self._computing():
            if self._embedder is None:
                path = Path(self.model.path)
                if path.suffix != ".gguf":
                    raise ValueError(f"{self.name} ({self.backend_kind}) has no embedding mode here: embeddings "
                                     "come from a GGUF model through llama.cpp, or from an embedding model "
                                     '(specedge.open_embedder("all-minilm-l6-v2"))')
                self._embedder = LlamaCppEmbedder(path, n_ctx=min(self.context_length, 2048),
                                                  n_threads=self.decoder.model_settings.threads)
            return self._embedder.embed(list(texts))

    def reset(self) -> None:
        """Forget the cached conversation prefix (the next call prefills its whole prompt)."""
        with self._lock:
            self.session.reset()
            self._last = None

    def _computing(self):
        """Count this engine's call as computing on the shared cores (a no-op without a CoreShare)."""
        return self.cores.computing() if self.cores is not None else contextlib.nullcontext()

    def _fit_threads(self) -> None:
        """Before each step: this call's share of the planned threads, given the calls computing now."""
        if self.shares_threads:
            self.decoder.model.backend.set_threads(self.cores.threads(self.threads))

    def _locked(self, ids: np.ndarray, call: CallSettings, cancel, out: CallStream,
                text: str | None = None) -> Iterator[Response]:
        with self._lock, self._computing():
            self._last = None
            inner = self.decoder.stream(ids, call, session=self.session, cancel=cancel)
            texts, tokens = [], []
            try:
                self._fit_threads()
                for r in inner:
                    texts.append(r.text or "")
                    if r.token is not None:
                        tokens.append(int(r.token))
                    yield r
                    self._fit_threads()
            finally:
                inner.close()
                out.stats = inner.stats
            if text is not None and out.stats is not None and out.stats.finish_reason is FinishReason.EOS:
                eos = set(self.tokenizer.eos_ids)
                while tokens and tokens[-1] in eos:  # the end of turn is the template's to write
                    tokens.pop()
                self._last = (text + "".join(texts), [int(i) for i in ids] + tokens)
