"""The embeddable Python API: `specedge.Engine` loads a model and its drafter once and serves `generate`, `stream`
and `chat` calls from any thread.

    from specedge import Engine
    engine = Engine("smollm2-135m")  # llama.cpp; or Engine("smollm2-135m-onnx-int4", backend="onnx")
    print(engine.chat([{"role": "user", "content": "Hi!"}], max_tokens=64).text)
    for chunk in engine.stream("Once upon a time", max_tokens=32, temperature=0.8, seed=1):
        print(chunk.text, end="", flush=True)

Calls are serialised on one lock (one backend, one KV cache); each call brings its own sampling settings, seed,
stop strings and an optional `threading.Event` that cancels it between tokens. The engine keeps one Session
(runtime/session.py): a call whose prompt shares a prefix with the previous call's tokens (the next chat turn, a
repeated system prompt) prefills only the rest.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ..runtime.backends import BackendKind
from ..runtime.generate import stream as text_stream
from ..runtime.session import Session
from ..runtime.stats import DecodeStats
from ..runtime.types import FinishReason, SamplingParams
from ..runtime.verify import VerifierKind
from ..assembly.load import DrafterSpec, LoadedModel, load_model, make_drafter


@dataclass(frozen=True)
class Chunk:
    """A streamed piece: new text (may be "" while a character or stop string is pending), the token, whether the
    token was an accepted draft token, and on the last chunk the finish reason (eos, length, stop, cancelled)."""
    text: str
    token: int
    from_draft: bool
    finish_reason: str | None = None


@dataclass
class Completion:
    text: str
    tokens: list[int]
    finish_reason: str
    prompt_tokens: int
    stats: dict = field(default_factory=dict)  # DecodeStats.to_dict() + ttft_s, reused_prompt_tokens, drafter


@dataclass(frozen=True)
class CallOptions:
    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                              repetition_penalty=self.repeat_penalty)  # raises ValueError naming a bad value


class Engine:
    """One loaded target (+ drafter); thread-safe calls, one at a time.

    model: a catalogue name or GGUF path (numpy, llamacpp backends), or an exported ONNX artifact directory or
    cache name (onnx). drafter: as `specedge generate --drafter` (none, ngram, model:<...>, recycle[:n], skip:<R>,
    swift, exit:<l>, del, loradrop). ctx: positions the engine's KV cache holds (prompt + answer); default
    min(model context, 4096).
    """

    def __init__(self, model: str = "smollm2-135m", *, backend: str = "llamacpp", drafter: str = "ngram", k: int = 4,
                 adaptive_k: bool = True, verifier: str = "chain", ctx: int | None = None,
                 threads: int | None = None, device: str = "auto", cache_dir: str | Path | None = None,
                 log=None) -> None:
        self.drafter_name = drafter
        spec = DrafterSpec.parse(drafter)
        cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.model: LoadedModel = load_model(model, BackendKind(backend), ctx=ctx, threads=threads,
                                             cache_dir=cache_dir, device=device, log=log)
        self.drafter = make_drafter(spec, self.model, SamplingParams(), ctx=ctx, threads=threads,
                                    cache_dir=cache_dir, device=device)
        self.k, self.adaptive_k, self.verifier = k, adaptive_k, VerifierKind(verifier)
        self.name, self.backend_kind = model, backend
        self._load = dict(ctx=ctx, threads=threads, cache_dir=cache_dir, device=device)  # for set_drafter
        self.session = Session(self.model.backend, ctx)
        self._lock = threading.Lock()

    @property
    def tokenizer(self):
        return self.model.tokenizer

    @property
    def context_length(self) -> int:
        return self.session.capacity

    def render_chat(self, messages: Sequence[dict]) -> str:
        """The model's chat template over messages ([{"role", "content"}]), with the generation prompt."""
        return self.tokenizer.apply_chat_template(messages)

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text)]

    def stream(self, prompt: str | Sequence[int], *, cancel: threading.Event | None = None, stats: dict | None = None,
               **options) -> Iterator[Chunk]:
        """Decode a raw prompt (text, no chat template; or token ids) and yield Chunks. Options: max_tokens,
        temperature, top_p, top_k, min_p, repeat_penalty, seed, stop. Invalid values raise ValueError here, before
        anything runs. `stats`, if given, is filled with the call's statistics when it ends."""
        opts = CallOptions(**{k: (tuple(v) if k == "stop" else v) for k, v in options.items()})
        params = opts.sampling()
        ids = np.asarray(self.encode(prompt) if isinstance(prompt, str) else list(prompt), dtype=np.int32)
        self._check_length(len(ids), opts.max_tokens)
        return self._run(ids, opts, params, cancel, stats if stats is not None else {})

    def generate(self, prompt: str | Sequence[int], **options) -> Completion:
        """Decode a raw prompt to the end (see `stream` for the options, including cancel)."""
        return self._collect(prompt, options)

    def chat(self, messages: Sequence[dict], *, stream: bool = False, **options):
        """Render messages with the chat template and decode: a Completion, or an iterator of Chunks with
        stream=True."""
        text = self.render_chat(messages)
        return self.stream(text, **options) if stream else self._collect(text, options)

    def set_drafter(self, drafter: str) -> None:
        """Switch the drafter between calls (waits for a running call). requires: a spec as for the constructor;
        it is parsed and built with the same start-up checks as at load (tokenizer match, tree masks, layered
        artifact), and on any error (ValueError, FileNotFoundError, ImportError, RuntimeError) the old drafter
        stays. The target and its cached conversation prefix are kept."""
        spec = DrafterSpec.parse(drafter)
        with self._lock:
            new = make_drafter(spec, self.model, SamplingParams(), **self._load)
            self.drafter, self.drafter_name = new, drafter

    def reset(self) -> None:
        """Forget the cached conversation prefix (the next call prefills its whole prompt)."""
        with self._lock:
            self.session.reset()

    def _collect(self, prompt, options) -> Completion:
        stats: dict = {}
        parts, tokens, reason = [], [], "length"
        for c in self.stream(prompt, stats=stats, **options):
            parts.append(c.text)
            tokens.append(c.token)
            reason = c.finish_reason or reason
        if reason == FinishReason.EOS.value:
            tokens = tokens[:-1]
        return Completion("".join(parts), tokens, reason, stats["prompt_tokens"], stats)

    def _check_length(self, n_prompt: int, max_tokens: int) -> None:
        if n_prompt == 0:
            raise ValueError("the prompt is empty: give at least one token")
        if n_prompt + 1 > self.session.capacity:
            raise ValueError(f"the prompt has {n_prompt} tokens but the context holds {self.session.capacity}: "
                             "shorten the prompt (or the conversation) or raise ctx (--ctx)")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")

    def _run(self, ids: np.ndarray, opts: CallOptions, params: SamplingParams, cancel, out: dict
             ) -> Iterator[Chunk]:
        with self._lock:
            dstats, t0, ttft = DecodeStats(), time.perf_counter(), None
            reason = FinishReason.LENGTH
            try:
                for r in text_stream(self.model.backend, self.tokenizer, ids, params, drafter=self.drafter, k=self.k,
                                     max_tokens=opts.max_tokens, stop=opts.stop, stats=dstats,
                                     rng=np.random.default_rng(opts.seed), adaptive_k=self.adaptive_k,
                                     verifier_kind=self.verifier, session=self.session):
                    ttft = ttft if ttft is not None else time.perf_counter() - t0
                    if cancel is not None and cancel.is_set() and r.finish_reason is None:
                        reason = FinishReason.CANCELLED
                        yield Chunk(r.text, r.token, r.from_draft, reason.value)
                        return
                    reason = r.finish_reason or reason
                    yield Chunk(r.text, r.token, r.from_draft, None if r.finish_reason is None else reason.value)
            finally:
                out.update(dstats.to_dict(), prompt_tokens=len(ids), reused_prompt_tokens=self.session.reused,
                           ttft_s=ttft, wall_s=time.perf_counter() - t0, drafter=self.drafter_name,
                           finish_reason=reason.value)
