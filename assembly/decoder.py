"""The one path from typed settings to a token stream.

    ModelSettings  --load-->  LoadedModel  --build_decoder(DecodeSettings)-->  Decoder
    Decoder.stream(prompt_ids, CallSettings)  -> Iterator[Response]      (the CLI, Engine, server, bench)
    Decoder.run(prompt_ids, CallSettings)     -> GenerationResult        (the same stream, collected)

`specedge generate`, `specedge chat` and `specedge serve` (through apps/api.py's Engine), the Python Engine and
`specedge bench` all build their decoder here and consume the same Response stream, so the decode arguments and the
collect-and-strip-EOS step exist once.
"""
from __future__ import annotations

import re
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from ..runtime.backends import BackendKind
from ..runtime.constraint import GRAMMAR_TYPES, Grammar, GrammarCompiler
from ..runtime.drafters.base import Drafter
from ..runtime.generate import collect, stream
from ..runtime.session import Session
from ..runtime.stats import DecodeStats
from ..runtime.tokenizer import Tokenizer
from ..runtime.types import GenerationResult, Response, SamplingParams, Tokens
from ..runtime.verify import VerifierKind
from .environment import cpu_info
from .load import DrafterSpec, LoadedModel, batch_invariance_warning, load_model, make_drafter, parse_drafter
from .sampling_defaults import CHAT_DEFAULTS, SamplingDefaults, model_sampling

Log = Callable[[str], None]
MAX_TOP_LOGPROBS = 20  # alternatives per token, as OpenAI's top_logprobs


@dataclass(frozen=True)
class ModelSettings:
    """What to load: a catalogue name, GGUF path or exported artifact, on which engine, with which resources."""
    model: str
    backend: BackendKind | None = None  # None: the engine the model names (assembly/load.py engine_for)
    ctx: int | None = None  # KV positions (prompt + answer); None: the model's context length
    threads: int | None = None
    device: str = "auto"  # ONNX Runtime execution provider (runtime/backends/onnx_providers.py)
    cache_dir: Path | None = None
    exact_batches: bool = True  # False: plain decoding only, faster kernels (llama.cpp without flash attention)


@dataclass(frozen=True)
class DecodeSettings:
    """How a decoder decodes: the drafter, the draft length and its policy, the verifier, or an opt-in lossy mode."""
    drafter: DrafterSpec = field(default_factory=lambda: parse_drafter("ngram"))
    k: int = 4  # the draft length; its maximum with adaptive_k
    adaptive_k: bool = True
    verifier: VerifierKind = VerifierKind.CHAIN
    lossy: str | None = None  # 'loradrop[:DIR]' | 'entropy-switch:<small>,<threshold>[,<dwell>]': LOSSY, labelled


@dataclass(frozen=True)
class CallSettings:
    """One call's sampling and stopping, flat as the CLI, the chat's /set and the server take them. Invalid values
    raise ValueError naming the field at construction.

    max_tokens None: decode to the end of the turn (EOS or a stop string) or the context limit, whichever comes
    first (finish_reason `length` only for the limit). temperature / top_p / top_k / min_p None: the model's default
    (assembly/sampling_defaults.py: GGUF general.sampling.*, an artifact's recorded generation config, else
    CHAT_DEFAULTS temperature 0.7, top_p 0.9); temperature 0 is greedy, exactly. The seed stays 0: reproducible."""
    max_tokens: int | None = None
    temperature: float | None = None  # 0 = greedy; None = the model's default
    top_p: float | None = None  # 1 = off; None = the model's default
    top_k: int | None = None  # 0 = off; None = the model's default (off unless it states one)
    min_p: float | None = None  # 0 = off; None = the model's default (off unless it states one)
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0  # 0 = off; llama.cpp's: subtracted once from a token in the last 64
    frequency_penalty: float = 0.0  # 0 = off; subtracted per occurrence in the last 64 tokens
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs (a mapping is accepted); -inf bans
    seed: int = 0
    stop: tuple[str, ...] = ()
    grammar: Grammar | None = None  # what the output must match (runtime/constraint.py); None: free text
    logprobs: int | None = None  # None: off; n >= 0: each token's logprob and its n most likely alternatives (<= 20)

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.grammar is not None and not isinstance(self.grammar, GRAMMAR_TYPES):
            raise ValueError(f"grammar must be one of JsonSchema, JsonObject, Regex, Lark, Gbnf "
                             f"(specedge.runtime.constraint), got {type(self.grammar).__name__}")
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int)
                                          or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            raise ValueError(f"logprobs must be None (off) or an integer in [0, {MAX_TOP_LOGPROBS}] (the number of "
                             f"alternatives per token), got {self.logprobs!r}")
        object.__setattr__(self, "stop", tuple(self.stop))
        try:  # a mapping or pairs; ids may come as strings (JSON object keys)
            bias = tuple(sorted((int(t), float(b)) for t, b in dict(self.logit_bias).items()))
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias must map token ids to numeric biases, got {self.logit_bias!r}") from None
        object.__setattr__(self, "logit_bias", bias)
        self.sampling()  # raises ValueError naming a bad value

    def resolved(self, defaults: SamplingDefaults = CHAT_DEFAULTS) -> dict:
        """temperature, top_p, top_k, min_p as this call samples: its own values, the defaults for the unset."""
        given = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p}
        return {k: getattr(defaults, k) if v is None else v for k, v in given.items()}

    def sampling(self, defaults: SamplingDefaults = CHAT_DEFAULTS) -> SamplingParams:
        return SamplingParams(**self.resolved(defaults), repetition_penalty=self.repeat_penalty,
                              presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                              logit_bias=self.logit_bias)



def parse_logit_bias(items: Iterable[str]) -> dict[int, float]:
    """llama.cpp's --logit-bias text, ID+BIAS or ID-BIAS (BIAS a number or inf), into {id: bias}; ValueError."""
    out = {}
    for item in items:
        m = re.fullmatch(r"\s*(\d+)\s*([+-])\s*(inf|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)\s*", item)
        if m is None:
            raise ValueError(f"logit_bias {item!r}: write TOKEN_ID+BIAS or TOKEN_ID-BIAS, e.g. 15043+1 or 15043-inf "
                             f"(bans the token)")
        out[int(m[1])] = float(m[2] + m[3])
    return out

def load(settings: ModelSettings, log: Log | None = None) -> LoadedModel:
    return load_model(settings.model, settings.backend, ctx=settings.ctx, threads=settings.threads,
                      cache_dir=settings.cache_dir, device=settings.device, log=log,
                      exact_batches=settings.exact_batches)


def resolved(settings: ModelSettings, model: LoadedModel) -> ModelSettings:
    """The settings with the engine the loaded model runs on (backend=None resolved by load)."""
    return settings if settings.backend is model.kind else replace(settings, backend=model.kind)


class Decoder:
    """A loaded target with its drafter (or lossy mode) and decode settings; stateless between calls except what a
    caller passes in (a Session for KV reuse, a DecodeStats to accumulate)."""

    def __init__(self, model: LoadedModel, settings: ModelSettings, decode: DecodeSettings) -> None:
        settings = resolved(settings, model)  # model_settings.backend is always the engine that runs
        self.model, self.model_settings, self.settings = model, settings, decode
        self.sampling_defaults = model_sampling(model)  # what a call's unset temperature/top_p/... resolve to
        self.lossy = None
        self.drafter: Drafter | None = None
        self._grammars: GrammarCompiler | None = None  # built on the first constrained call
        if decode.lossy:
            from .loradrop import lossy_decoder
            self.lossy = lossy_decoder(decode.lossy, model, cache_dir=settings.cache_dir, ctx=settings.ctx)
        else:
            self.drafter = make_drafter(decode.drafter, model, ctx=settings.ctx, threads=settings.threads,
                                        cache_dir=settings.cache_dir, device=settings.device)
            note = None if self.drafter is None else batch_invariance_warning(model, cpu_info()[1])
            if note is not None:
                warnings.warn(note, RuntimeWarning, stacklevel=2)

    @property
    def tokenizer(self):
        return self.model.tokenizer

    @property
    def label(self) -> str:
        """What decodes: `lossy <mode>` or the drafter spec as given."""
        return self.lossy.label if self.lossy is not None else str(self.settings.drafter)

    def draft_bytes_per_token(self) -> int:
        """Weight bytes one drafted token reads (0 for free drafters and plain decoding); for MBSU."""
        return 0 if self.drafter is None else int(self.drafter.weight_bytes_per_token)

    def sampling_used(self, call: CallSettings) -> dict:
        """What the call samples with: temperature, top_p, top_k, min_p, repeat_penalty, seed, and `defaults`
        (where the unset ones came from)."""
        extra = {k: getattr(call, k) for k in ("presence_penalty", "frequency_penalty") if getattr(call, k)}
        if call.logit_bias:
            extra["logit_bias"] = {t: b for t, b in call.logit_bias}
        return {**call.resolved(self.sampling_defaults), "repeat_penalty": call.repeat_penalty, **extra,
                "seed": call.seed, "defaults": self.sampling_defaults.source}

    def with_decode(self, decode: DecodeSettings) -> "Decoder":
        """A decoder over the same loaded target with other decode settings (a new drafter is built and checked)."""
        out = Decoder(self.model, self.model_settings, decode)
        out._grammars = self._grammars
        return out

    def grammar_compiler(self) -> GrammarCompiler:
        """Compiles a call's grammar against this model's vocabulary (built once; ValueError for a tokenizer it
        cannot read)."""
        if self._grammars is None:
            tok = self.model.tokenizer
            if not isinstance(tok, Tokenizer):
                raise ValueError("a grammar (response_format, regex, tools) needs the model's tokenizer as specedge "
                                 "builds it; this model runs on llama.cpp's own tokenizer (an architecture or "
                                 "vocabulary specedge does not read), so its output cannot be constrained")
            self._grammars = GrammarCompiler(tok.spec.hf_json, self.model.backend.config.vocab_size, tok.eos_ids)
        return self._grammars

    def check(self, call: CallSettings) -> None:
        """Raise ValueError now, before anything runs, for what only the model can judge: a logit_bias token id
        outside its vocabulary, a grammar llguidance refuses."""
        V = self.model.backend.config.vocab_size
        bad = [t for t, _ in call.logit_bias if t >= V]
        if bad:
            raise ValueError(f"logit_bias names token id {bad[0]}, outside this model's vocabulary of {V} "
                             f"(ids 0..{V - 1}; `specedge tokenize` or POST /tokenize gives a text's ids)")
        if call.grammar is not None:
            self.constraint(call)

    def constraint(self, call: CallSettings):
        """The call's compiled Constraint, or None (free text)."""
        return None if call.grammar is None else self.grammar_compiler().compile(call.grammar)

    def stream(self, prompt_ids: Tokens | Sequence[int], call: CallSettings, *, stats: DecodeStats | None = None,
               session: Session | None = None) -> Iterator[Response]:
        """Decode prompt_ids (already templated and tokenized); the last Response carries the finish reason.
        call.max_tokens None decodes to EOS / a stop string or to the room left in the context (runtime/decode.py
        bounds the drafts by that room)."""
        extra = {} if self.lossy is None else {"lossy": self.lossy}
        if session is not None:
            extra["session"] = session
        if call.grammar is not None:
            extra["constraint"] = self.constraint(call)
        if call.logprobs is not None:
            extra["logprobs"] = call.logprobs
        s = self.settings
        return stream(self.model.backend, self.model.tokenizer, np.asarray(prompt_ids, dtype=np.int32),
                      call.sampling(self.sampling_defaults), drafter=self.drafter, k=s.k, max_tokens=call.max_tokens,
                      stop=call.stop, rng=np.random.default_rng(call.seed), stats=stats, ctx=self.model_settings.ctx,
                      adaptive_k=s.adaptive_k, verifier_kind=s.verifier, **extra)

    def run(self, prompt_ids: Tokens | Sequence[int], call: CallSettings, *, stats: DecodeStats | None = None,
            session: Session | None = None, on_text: Callable[[str], None] | None = None) -> GenerationResult:
        """`stream` collected into text, tokens (EOS stripped), finish reason and the call's statistics (DecodeStats
        fields plus wall_s, ttft_s, reused_prompt_tokens with a session, drafter)."""
        stats = stats if stats is not None else DecodeStats()
        t0, first = time.perf_counter(), []

        def timed(responses):
            for r in responses:
                if not first:
                    first.append(time.perf_counter() - t0)
                yield r

        result = collect(timed(self.stream(prompt_ids, call, stats=stats, session=session)), on_text=on_text)
        facts = {"wall_s": time.perf_counter() - t0, "ttft_s": first[0] if first else None, "drafter": self.label,
                 "sampling": self.sampling_used(call)}
        if session is not None:
            facts["reused_prompt_tokens"] = session.reused
        return replace(result, prompt_tokens=len(prompt_ids), stats={**stats.to_dict(), **facts})


def build_decoder(model: LoadedModel, settings: ModelSettings, decode: DecodeSettings) -> Decoder:
    """The decoder for a loaded target; raises ValueError/FileNotFoundError/ImportError/RuntimeError naming what is
    wrong (a drafter the backend cannot run, a draft model with another tokenizer, a missing corrections dir)."""
    return Decoder(model, settings, decode)


def open_decoder(settings: ModelSettings, decode: DecodeSettings, log: Log | None = None) -> Decoder:
    """Load the target and build its decoder."""
    return build_decoder(load(settings, log), settings, decode)
