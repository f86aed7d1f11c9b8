"""Lossy decoding modes (docs/algorithms.md section 4): opt-in, and labelled "lossy" wherever they report.

A mode is a typed setting, `Speculation(lossy=mode)` (runtime/request.py), that makes the decode loop
(runtime/decode.py) drive the mode's Stepper instead of a speculative one: the same prefill, stopping, statistics and
sessions; one token and one model forward per round, nothing verified.

Its spec, the typed form of a `--lossy` string (a tagged union like the drafter specs; parse_lossy(str(s)) == s):
  LoRADropLossySpec(dir)            'loradrop[:DIR]'                                   (no DIR: pure reuse, cycle 4)
  EntropySwitchSpec(model, threshold, dwell)   'entropy-switch:<small-model>,<threshold>[,<dwell>]'
assembly/loradrop.py builds the mode from its spec (it loads the corrections or the small model).

  LoRADropLossy      decodes with the LoRA-Drop cycle directly (2.5): the output is NOT the model's own.
  EntropySwitch      Entropy Adaptive Decoding: a small and a large model take turns by the active model's rolling
                     mean entropy (window 5): above the threshold the large one, below it the small one, each
                     switch held at least `min_dwell` tokens; the newly active model prefills what it missed.
"""
from __future__ import annotations

import abc
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .backends.base import Backend
from .loradrop import Corrections, Schedule
from .sampling import logits_to_probs, sample
from .steppers import SeqState, Stepper
from .types import SamplingParams, StepStats, Tokens


@dataclass(frozen=True)
class LoRADropLossySpec:
    """Decode with the LoRA-Drop cycle of the corrections in `dir` (None: pure reuse, cycle 4)."""
    dir: str | None = None

    def __str__(self) -> str:
        return "loradrop" if self.dir is None else f"loradrop:{self.dir}"


@dataclass(frozen=True)
class EntropySwitchSpec:
    """Entropy Adaptive Decoding between `model` (the small one, same tokenizer) and the target."""
    model: str
    threshold: float
    dwell: int = 4

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("entropy-switch needs a small model: entropy-switch:<small-model>,<threshold>")
        if self.dwell < 1:
            raise ValueError(f"entropy-switch dwell must be >= 1 token, got {self.dwell}")

    def __str__(self) -> str:
        return f"entropy-switch:{self.model},{self.threshold:g}" + ("" if self.dwell == 4 else f",{self.dwell}")


LossySpec = LoRADropLossySpec | EntropySwitchSpec


def parse_lossy(text: str) -> LossySpec:
    """'loradrop[:DIR]' | 'entropy-switch:<small-model>,<threshold>[,<dwell>]'; ValueError naming the syntax."""
    head, _, arg = text.partition(":")
    if head == "loradrop":
        return LoRADropLossySpec(arg or None)
    if head == "entropy-switch" and arg:
        parts = arg.split(",")
        try:
            return EntropySwitchSpec(parts[0], float(parts[1]), int(parts[2]) if len(parts) > 2 else 4)
        except (IndexError, ValueError):
            raise ValueError(f"--lossy {text!r}: use entropy-switch:<small-model>,<threshold>[,<min-dwell>]") \
                from None
    raise ValueError(f"unknown lossy mode {text!r}; use loradrop[:DIR] or entropy-switch:<small-model>,<threshold>")


def entropy(logits_row: np.ndarray) -> float:
    """Shannon entropy (nats) of softmax(logits): the model's own uncertainty, before any sampling processing."""
    x = np.asarray(logits_row, dtype=np.float64)
    p = np.exp(x - x.max())
    p /= p.sum()
    return float(-(p * np.log(np.maximum(p, 1e-300))).sum())


def _pick(logits: np.ndarray, params: SamplingParams, history: Tokens, rng: np.random.Generator) -> int:
    p = logits_to_probs(logits[-1:], params, history=history)[0]
    return int(np.argmax(p)) if params.greedy else sample(p, rng)


class LossyMode(abc.ABC):
    """A labelled lossy policy of the decode loop: `label` (contains "lossy") and a Stepper per decode call."""

    label: str

    @abc.abstractmethod
    def stepper(self, target: Backend, params: SamplingParams) -> Stepper:
        """The Stepper of one decode call on `target`; raises ValueError at start-up when the mode cannot run."""


class _OneToken(Stepper):
    """One token per round from `next_token(seq tokens) -> int`, timed as the round's verify/forward time."""

    def __init__(self, target: Backend, mode: LossyMode) -> None:
        super().__init__(target)
        self.label = mode.label

    @abc.abstractmethod
    def next_token(self, seq: Tokens, rng: np.random.Generator) -> int: ...

    def step(self, seq: SeqState, room: int, rng: np.random.Generator) -> tuple[list[int], StepStats]:
        ts = time.perf_counter()
        tok = self.next_token(seq.tokens, rng)
        dt = time.perf_counter() - ts
        seq.extend([tok])
        return [tok], StepStats(k=0, n_accepted=0, verify_s=dt, forward_s=dt)


class LoRADropLossy(LossyMode):
    """Decode with the LoRA-Drop cycle (refresh every `cycle` tokens, drop steps between). LOSSY."""

    def __init__(self, corrections: Corrections) -> None:
        self.corr = corrections
        self.label = f"lossy loradrop rank={corrections.rank} cycle={corrections.cycle}"

    def stepper(self, target: Backend, params: SamplingParams) -> Stepper:
        return _LoRADropStepper(target, self, params)


class _LoRADropStepper(_OneToken):
    """The prompt is read by the full model (prefill); round i is step i of the cycle (0: a refresh)."""

    def __init__(self, target: Backend, mode: LoRADropLossy, params: SamplingParams) -> None:
        super().__init__(target, mode)
        self.schedule, self.params, self.i = Schedule(target, mode.corr), params, 0
        self.cache = None

    def start(self, seq: SeqState, start: int) -> int:
        self.cache = seq.cache
        return super().start(seq, start)

    def next_token(self, seq: Tokens, rng: np.random.Generator) -> int:
        logits = self.schedule.step(seq[-1:], self.cache, self.i)
        self.i += 1
        return _pick(logits, self.params, seq, rng)


@dataclass
class _Model:
    backend: Backend
    cache: object = None
    fed: int = 0  # tokens of the sequence its cache holds


@dataclass
class EntropySwitch(LossyMode):
    """Entropy Adaptive Decoding between `small` and the target (the large model). LOSSY unless threshold <= 0.

    Starts on the large model; threshold 0 never leaves it (entropy >= 0), which is plain large-model decoding.
    `switches`, `large_tokens` and `trace` accumulate over calls.
    """

    small: Backend
    threshold: float
    window: int = 5
    min_dwell: int = 4
    switches: int = 0
    large_tokens: int = 0
    trace: list = field(default_factory=list)  # which model made each token: "L" or "S"

    @property
    def label(self) -> str:
        return f"lossy entropy-switch threshold={self.threshold} window={self.window} dwell={self.min_dwell}"

    def stepper(self, target: Backend, params: SamplingParams) -> Stepper:
        if self.small.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"entropy switching needs one vocabulary: the small model has {self.small.config.vocab_size}"
                             f" tokens, the large {target.config.vocab_size}; pick models of one family")
        return _EntropyStepper(target, self, params)


class _EntropyStepper(_OneToken):
    """Nothing is prefilled: each model catches up on what it has not seen when it next makes a token (the large
    model's cache is the decode loop's, the small one's is allocated alike)."""

    def __init__(self, target: Backend, mode: EntropySwitch, params: SamplingParams) -> None:
        super().__init__(target, mode)
        self.mode, self.params = mode, params
        self.context_limit = mode.small.config.context_length

    def start(self, seq: SeqState, start: int) -> int:
        self.large = _Model(self.target, seq.cache, start)
        self.small = _Model(self.mode.small, self.mode.small.new_cache(seq.cache.capacity))
        self.active, self.dwell, self.h = self.large, 0, deque(maxlen=self.mode.window)
        return 0

    def next_token(self, seq: Tokens, rng: np.random.Generator) -> int:
        m, mode = self.active, self.mode
        logits = m.backend.forward(seq[m.fed:], m.cache)  # catch up on what it missed, then the next row
        m.fed = len(seq)
        self.h.append(entropy(logits[-1]))
        self.dwell += 1
        tok = _pick(logits, self.params, seq, rng)
        mode.trace.append("L" if m is self.large else "S")
        mode.large_tokens += m is self.large
        mean = float(np.mean(self.h))
        want = self.large if mean > mode.threshold else (self.small if mean < mode.threshold else m)
        if want is not m and self.dwell >= mode.min_dwell:
            self.active, self.dwell, self.h = want, 0, deque(maxlen=mode.window)
            mode.switches += 1
        return tok
