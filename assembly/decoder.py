"""The one path from typed settings to a token stream.

    ModelSettings  --assembly/open.py-->  LoadedModel + DecodeSettings  -->  Decoder
    Decoder.stream(prompt_ids, CallSettings)  -> CallStream of Responses; its CallStats when it ends
    Decoder.run(prompt_ids, CallSettings)     -> GenerationResult        (the same stream, collected)

`specedge generate`, `specedge chat` and `specedge serve` (through apps/api.py's Engine), the Python Engine and
`specedge bench` all open their decoder through assembly/open.py and consume the same Response stream, so the
decode arguments (a runtime Request and Speculation), the call statistics and the collector exist once.
"""
from __future__ import annotations

import re
import threading
import time
import warnings
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence

import numpy as np

from ..runtime.backends import BackendKind, Kernels, parse_gpu_layers
from ..runtime.constraint import GRAMMAR_TYPES, Grammar, GrammarCompiler
from ..runtime.drafters.base import Drafter
from ..runtime.drafters.spec import DrafterKind
from ..runtime.generate import collect, stream
from ..runtime.lossy import LossySpec
from ..runtime.repetition import REPETITION_STOP
from ..runtime.request import MAX_TOP_LOGPROBS, Request, Speculation
from ..runtime.session import Session
from ..runtime.stats import CallStats, DecodeStats
from ..runtime.tokenizer import Tokenizer
from ..runtime.types import FinishReason, GenerationResult, Response, SamplingParams, Tokens
from ..runtime.verify import VerifierKind
from .load import DrafterSpec, LoadedModel, batch_invariance_warning, make_drafter, parse_drafter
from .sampling_defaults import CHAT_DEFAULTS, SamplingDefaults, model_sampling

if TYPE_CHECKING:
    from .plan import Plan

Log = Callable[[str], None]
DEFAULT_MAX_TOKENS = 1024  # an answer's bound unless the call says otherwise (CLI, chat, Engine; the server: None)


@dataclass(frozen=True)
class ModelSettings:
    """What to load: a catalogue name, GGUF path or exported artifact, on which engine, with which resources."""
    model: str
    backend: BackendKind | None = None  # None: the engine the model names (assembly/load.py engine_for)
    ctx: int | None = None  # KV positions (prompt + answer); None: the model's context length
    threads: int | None = None
    device: str = "auto"  # ONNX Runtime execution provider (runtime/backends/onnx_providers.py)
    cache_dir: Path | None = None
    kernels: Kernels = Kernels.EXACT  # FAST_PLAIN_ONLY: plain decoding only, the engine's faster kernels
    gpu_layers: int | None = None  # llama.cpp engines' layers on a GPU (-1: all); None: all where the build offloads

    def __post_init__(self) -> None:
        if self.gpu_layers is not None:
            parse_gpu_layers(self.gpu_layers)  # ValueError naming the accepted forms
        if not isinstance(self.kernels, Kernels):
            raise ValueError(f"kernels must be one of {', '.join(f'Kernels.{k.name}' for k in Kernels)} "
                             f"(runtime/backends/registry.py), got {self.kernels!r}")


@dataclass(frozen=True)
class DecodeSettings:
    """How a decoder decodes: the drafter, the draft length and its policy, the verifier, or an opt-in lossy mode.

    drafter and k None: not given, so the plan's choice where one is made (assembly/open.py), else ngram and 4."""
    drafter: DrafterSpec | None = None
    k: int | None = None  # the draft length; its maximum with adaptive_k
    adaptive_k: bool = True
    verifier: VerifierKind = VerifierKind.CHAIN
    lossy: LossySpec | None = None  # runtime/lossy.py: LoRADropLossySpec | EntropySwitchSpec; LOSSY, labelled

    def __post_init__(self) -> None:
        if self.k is not None and self.k < 0:
            raise ValueError(f"k (the draft length) must be >= 0, got {self.k}")
        drafts = self.drafter is None or self.drafter.kind is not DrafterKind.NONE
        named = "ngram (the default)" if self.drafter is None else self.drafter.kind.value
        if self.k == 0 and drafts and self.lossy is None:
            raise ValueError(f"k 0 (--k 0) with drafter {named} drafts nothing: use --drafter none for plain "
                             "decoding, or a k of 1 or more")
        if self.lossy is not None and self.drafter is not None and self.drafter.kind is not DrafterKind.NONE:
            raise ValueError(f"lossy mode {self.lossy} (--lossy) replaces the drafter, and drafter {named} (--drafter) was given too: give "
                             "one of them")

    @property
    def given(self) -> bool:
        """Whether anything says what decodes (a drafter, k or a lossy mode): then no plan replaces it."""
        return any(x is not None for x in (self.drafter, self.k, self.lossy))

    def resolved(self) -> "DecodeSettings":
        """The settings with what was not given at its default: ngram (none under a lossy mode), k = 4."""
        default = "none" if self.lossy is not None else "ngram"  # a lossy mode decodes without a drafter
        return replace(self, drafter=self.drafter if self.drafter is not None else parse_drafter(default),
                       k=4 if self.k is None else self.k)


def option(help: str, wire: str | None = None, **click) -> dict:
    """A per-call option's declaration, as CallSettings field metadata: its CLI help (and click arguments beyond the
    type and default its annotation gives), and `wire` "number" / "integer" / "boolean": an OpenAI request body field
    parsed as such (apps/openai_protocol.py; the fields with rules of their own there, OWN_RULES, have none)."""
    return {"help": help, "wire": wire, "click": click}


@dataclass(frozen=True)
class CallSettings:
    """One call's sampling and stopping, flat as the CLI, the chat's /set, the Engine and the server take them: the
    one declaration of the per-call options. A field with `option(...)` metadata is a CLI flag of generate and chat
    (apps/options.py), a /set key (apps/chat_state.py) and an Engine keyword; with `wire`, an OpenAI body field too.
    Invalid values raise ValueError naming the field at construction.

    max_tokens: at most DEFAULT_MAX_TOKENS by default (a bound a user can expect of any answer); None: to the end of
    the turn (EOS or a stop string) or the context limit, whichever comes first (the server's default, as OpenAI's;
    finish_reason `length` only for the limit). repetition_stop (on by default): an answer that repeats itself ends
    there with finish_reason `repetition` (runtime/repetition.py: about 200 tokens of back-to-back copies of one
    span); the text is a prefix of the answer without it, so greedy stays exactly greedy up to that point. temperature / top_p / top_k / min_p None: the model's default
    (assembly/sampling_defaults.py: GGUF general.sampling.*, an artifact's recorded generation config, else
    CHAT_DEFAULTS temperature 0.7, top_p 0.9); temperature 0 is greedy, exactly. The seed stays 0: reproducible."""
    max_tokens: int | None = field(default=DEFAULT_MAX_TOKENS, metadata=option(
        "Most tokens to generate (the server's default: to the end of the turn or the context limit).", min=1))
    repetition_stop: bool = field(default=True, metadata=option(
        "End an answer that repeats itself (one span of up to 64 tokens copied back to back over about 200 tokens) "
        "with finish reason 'repetition'; the text is a prefix of the answer without the stop.", "boolean"))
    temperature: float | None = field(default=None, metadata=option(
        "0 = greedy. Default: the model's (GGUF general.sampling.temp, an exported artifact's generation config), "
        "else 0.7.", "number"))
    top_p: float | None = field(default=None, metadata=option("1 = off. Default: the model's, else 0.9.", "number"))
    top_k: int | None = field(default=None, metadata=option("0 = off. Default: the model's, else off.", "integer"))
    min_p: float | None = field(default=None, metadata=option("0 = off. Default: the model's, else off.", "number"))
    typical_p: float = field(default=1.0, metadata=option(
        "Locally typical sampling (llama.cpp's --typical, HF's typical_p): keep the tokens whose surprise is closest "
        "to the entropy, up to this mass; 1 = off.", "number"))
    repeat_penalty: float | None = field(default=None, metadata=option(
        "1 = off (llama.cpp's, over the last 64 tokens). Default: 1.1 when sampling (chat answers of small models "
        "otherwise loop), off when greedy (--temperature 0 stays exactly greedy).", "number"))
    dry_multiplier: float | None = field(default=None, metadata=option(
        "DRY repeat penalty (llama.cpp's --dry-multiplier): a token extending a repeat of n >= dry_allowed_length "
        "earlier tokens loses MULT * dry_base^(n - allowed) from its logit; 0 = off. Default: the model's, else off; "
        "off when greedy.", "number"))
    dry_base: float = field(default=1.75, metadata=option("DRY's growth per repeated token (llama.cpp's).", "number"))
    dry_allowed_length: int = field(default=2, metadata=option(
        "Repeats of up to this many tokens go unpenalised by DRY (llama.cpp's).", "integer"))
    presence_penalty: float = field(default=0.0, metadata=option(
        "Subtracted from the logit of each token seen in the last 64 (llama.cpp's; 0 = off)."))
    frequency_penalty: float = field(default=0.0, metadata=option(
        "Subtracted per occurrence in the last 64 tokens (llama.cpp's; 0 = off)."))
    logit_bias: tuple[tuple[int, float], ...] = field(default=(), metadata=option(
        "Add BIAS to token ID's logit, as llama.cpp's --logit-bias: 15043+1, 15043-0.5, 15043-inf (bans it). "
        "Repeatable. Lossless under speculation: the target verifies with the bias.", multiple=True,
        metavar="ID(+|-)BIAS"))  # (token id, bias) pairs (a mapping is accepted); -inf bans
    seed: int = field(default=0, metadata=option("The call's random seed (sampled output is reproducible per seed)."))
    stop: tuple[str, ...] = ()
    grammar: Grammar | None = None  # what the output must match (runtime/constraint.py); None: free text
    logprobs: int | None = None  # None: off; n >= 0: each token's logprob and its n most likely alternatives (<= 20)

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 (None: to the end of the turn or the context limit), got "
                             f"{self.max_tokens}")
        if not isinstance(self.repetition_stop, bool):
            raise ValueError(f"repetition_stop must be True or False, got {self.repetition_stop!r}")
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
        self.sampling()  # raises ValueError naming a bad value (SamplingParams' fields are named as these)

    def with_options(self, **options) -> "CallSettings":
        """These settings with `options` (CallSettings fields) over them; TypeError naming an unknown one and the
        fields there are, ValueError naming a bad value."""
        unknown = sorted(set(options) - {f.name for f in fields(CallSettings)})
        if unknown:
            raise TypeError(f"unknown call option {unknown[0]!r}; the call options are "
                            f"{', '.join(f.name for f in fields(CallSettings))} (CallSettings)")
        return replace(self, **options)

    def sampling(self, defaults: SamplingDefaults = CHAT_DEFAULTS) -> SamplingParams:
        """The SamplingParams of this call: every field both declare, by name (`defaults` for an unset temperature /
        top_p / top_k / min_p; for an unset repeat_penalty / dry_multiplier, theirs when sampling, off when greedy)."""
        values = {name: getattr(self, name) for name in _SHARED}
        values = {k: getattr(defaults, k) if v is None else v for k, v in values.items()}
        penalty, dry = self.repeat_penalty, self.dry_multiplier
        greedy = values["temperature"] == 0
        if penalty is None:  # the default penalises sampled answers only: greedy stays exactly greedy
            penalty = 1.0 if greedy else defaults.repeat_penalty
        if dry is None:
            dry = 0.0 if greedy else defaults.dry_multiplier
        return SamplingParams(**values, repeat_penalty=penalty, dry_multiplier=dry)


# the per-call options: the fields declared with option(...), each a CLI flag of generate and chat, a /set key and an
# Engine keyword (stop, grammar and logprobs are options of the Engine and the wire, with each command's own flags)
CALL_OPTIONS = tuple(f.name for f in fields(CallSettings) if "help" in f.metadata)
_PENALTIES = ("repeat_penalty", "dry_multiplier")  # None: the defaults' when sampling, off when greedy
_SHARED = tuple(f.name for f in fields(CallSettings)
                if f.name in {g.name for g in fields(SamplingParams)} and f.name not in _PENALTIES)


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


class CallStream:
    """The Responses of one call, iterated once; `stats` (CallStats) is set when the call ends: finished, stopped,
    cancelled, failed or closed early. `responses(out)` is the generator that fills `out.stats`."""

    def __init__(self, responses: Callable[["CallStream"], Iterator[Response]]) -> None:
        self.stats: CallStats | None = None
        self._it = responses(self)

    def __iter__(self) -> "CallStream":
        return self

    def __next__(self) -> Response:
        return next(self._it)

    def close(self) -> None:
        self._it.close()


class Decoder:
    """A loaded target with its drafter (or lossy mode) and decode settings; stateless between calls except what a
    caller passes in (a Session for KV reuse). `plan`: the plan that chose these settings (None: given)."""

    def __init__(self, model: LoadedModel, settings: ModelSettings, decode: DecodeSettings,
                 plan: "Plan | None" = None) -> None:
        settings = settings if settings.backend is model.kind else replace(settings, backend=model.kind)
        decode = decode.resolved()
        self.model, self.model_settings, self.settings, self.plan = model, settings, decode, plan
        self.sampling_defaults = model_sampling(model)  # what a call's unset temperature/top_p/... resolve to
        self._grammars: GrammarCompiler | None = None  # built on the first constrained call
        self._breakers: frozenset[int] | None = None  # DRY's breaker ids (dry_breakers), on the first DRY call
        if decode.lossy is not None:
            from .loradrop import lossy_mode
            lossy = lossy_mode(decode.lossy, model, cache_dir=settings.cache_dir, ctx=settings.ctx)
            self.spec = Speculation(k=decode.k, adaptive_k=decode.adaptive_k, verifier=decode.verifier, lossy=lossy)
        else:
            drafter = make_drafter(decode.drafter, model, ctx=settings.ctx, threads=settings.threads,
                                   cache_dir=settings.cache_dir, device=settings.device)
            note = None if drafter is None else batch_invariance_warning(model)
            if note is not None:
                warnings.warn(note, RuntimeWarning, stacklevel=2)
            self.spec = Speculation(drafter, decode.k, decode.adaptive_k, decode.verifier)

    @property
    def tokenizer(self):
        return self.model.tokenizer

    @property
    def drafter(self) -> Drafter | None:
        return self.spec.drafter

    @property
    def lossy(self):
        return self.spec.lossy

    @property
    def label(self) -> str:
        """What decodes: the lossy mode's label, or the drafter spec ("none" for plain decoding)."""
        return self.lossy.label if self.lossy is not None else str(self.settings.drafter)

    def draft_bytes_per_token(self) -> int:
        """Weight bytes one drafted token reads (0 for free drafters and plain decoding); for MBSU."""
        return 0 if self.drafter is None else int(self.drafter.weight_bytes_per_token)

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
            self.grammar_compiler().compile(call.grammar)

    def request(self, call: CallSettings) -> Request:
        """The runtime Request of a call: its sampling with this model's defaults for the unset values, its grammar
        compiled for this call, the context this decoder was opened with."""
        constraint = None if call.grammar is None else self.grammar_compiler().compile(call.grammar)
        params = call.sampling(self.sampling_defaults)
        if params.dry_multiplier > 0:
            params = replace(params, dry_breakers=self.dry_breakers())
        return Request(params, call.max_tokens, call.stop, call.seed, None, constraint, call.logprobs,
                       self.model_settings.ctx, REPETITION_STOP if call.repetition_stop else None)

    def dry_breakers(self) -> frozenset[int]:
        """Token ids no DRY repeat spans (and DRY never penalises): those whose text holds a newline, ':', '"' or
        '*' (llama.cpp's default sequence breakers), and the end-of-generation ids; computed once per model."""
        if self._breakers is None:
            tok = self.model.tokenizer
            marks = (b"\n", b":", b'"', b"*")
            ids = {i for i in range(tok.vocab_size) if any(m in tok.token_bytes(i) for m in marks)}
            self._breakers = frozenset(ids | set(tok.eos_ids))
        return self._breakers

    def stream(self, prompt_ids: Tokens | Sequence[int], call: CallSettings, *, session: Session | None = None,
               cancel: threading.Event | None = None) -> CallStream:
        """Decode prompt_ids (already templated and tokenized); the last Response carries the finish reason, and
        the stream's `stats` its CallStats. call.max_tokens None decodes to EOS / a stop string or to the room left
        in the context (or until the answer repeats itself, with call.repetition_stop). `cancel`, when set, ends the call at its next token (finish reason `cancelled`)."""
        ids = np.asarray(prompt_ids, dtype=np.int32)
        return CallStream(lambda out: self._responses(ids, call, session, cancel, out))

    def _responses(self, ids: np.ndarray, call: CallSettings, session: Session | None,
                   cancel: threading.Event | None, out: CallStream) -> Iterator[Response]:
        """The one place a call's statistics are built (out.stats), however the call ends."""
        req, dstats = self.request(call), DecodeStats()
        t0, ttft, reason = time.perf_counter(), None, FinishReason.LENGTH
        try:
            for r in stream(self.model.backend, self.model.tokenizer, ids, self.spec, req, session=session,
                            stats=dstats):
                ttft = ttft if ttft is not None else time.perf_counter() - t0
                if cancel is not None and cancel.is_set() and r.finish_reason is None:
                    reason = FinishReason.CANCELLED
                    yield replace(r, finish_reason=reason)
                    return
                reason = r.finish_reason or reason
                yield r
        finally:
            out.stats = CallStats(dstats, len(ids), reason, self.label, req.params, call.seed,
                                  self.sampling_defaults.source, 0 if session is None else session.reused, ttft,
                                  time.perf_counter() - t0)

    def run(self, prompt_ids: Tokens | Sequence[int], call: CallSettings, *, session: Session | None = None,
            on_text: Callable[[str], None] | None = None) -> GenerationResult:
        """`stream` collected (runtime/generate.py collect): text, tokens (EOS stripped), logprobs aligned with
        them, finish reason, the call's CallStats; on_text sees each piece of text as it arrives."""
        calls = self.stream(prompt_ids, call, session=session)
        result = collect(calls, on_text)
        return replace(result, prompt_tokens=calls.stats.prompt_tokens, stats=calls.stats)
