"""Lossy decoding modes (ALGORITHMS.md section 4): opt-in, and labelled "lossy" wherever they report.

Both are callables with `decode`'s signature (runtime/decode.py), so `stream(..., decoder=mode)` runs them:
  LoRADropLossy      decodes with the LoRA-Drop cycle directly (2.5): the output is NOT the model's own.
  EntropySwitch      Entropy Adaptive Decoding: a small and a large model take turns by the active model's rolling
                     mean entropy (window 5): above the threshold the large one, below it the small one, each
                     switch held at least `min_dwell` tokens; the newly active model prefills what it missed.
The drafter argument is ignored (nothing is verified).
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from .backends.base import Backend
from .decode import TokenEvent
from .loradrop import Corrections, Schedule
from .sampling import logits_to_probs, sample
from .stats import DecodeStats
from .types import FinishReason, SamplingParams, StepStats, Tokens, as_tokens


def entropy(logits_row: np.ndarray) -> float:
    """Shannon entropy (nats) of softmax(logits): the model's own uncertainty, before any sampling processing."""
    x = np.asarray(logits_row, dtype=np.float64)
    p = np.exp(x - x.max())
    p /= p.sum()
    return float(-(p * np.log(np.maximum(p, 1e-300))).sum())


def _pick(logits: np.ndarray, params: SamplingParams, history: Tokens, rng: np.random.Generator) -> int:
    p = logits_to_probs(logits[-1:], params, history=history)[0]
    return int(np.argmax(p)) if params.greedy else sample(p, rng)


def _checked(prompt, max_tokens: int, limit: int) -> tuple[Tokens, int]:
    prompt = as_tokens(prompt)
    if len(prompt) == 0:
        raise ValueError("the prompt is empty: give at least one token")
    if len(prompt) + 1 > limit:
        raise ValueError(f"the prompt has {len(prompt)} tokens but the context holds {limit}: shorten it or raise --ctx")
    return prompt, min(max_tokens, limit - len(prompt))


def _run(next_token, prompt: Tokens, max_tokens: int, eos_ids, stats: DecodeStats) -> Iterator[TokenEvent]:
    """The shared loop: next_token(seq) -> int, one model forward per token; stops on eos / length."""
    seq, eos = list(int(t) for t in prompt), set(int(e) for e in eos_ids)
    t0 = time.perf_counter()
    for produced in range(1, max_tokens + 1):
        ts = time.perf_counter()
        tok = next_token(np.asarray(seq, dtype=np.int32))
        dt = time.perf_counter() - ts
        stats.record(StepStats(k=0, n_accepted=0, verify_s=dt, forward_s=dt))
        seq.append(tok)
        stats.decode_s, stats.n_generated = time.perf_counter() - t0, produced
        reason = FinishReason.EOS if tok in eos else (FinishReason.LENGTH if produced >= max_tokens else None)
        yield TokenEvent(tok, False, reason)
        if reason is not None:
            return


class LoRADropLossy:
    """Decode with the LoRA-Drop cycle (refresh every `cycle` tokens, drop steps between). LOSSY."""

    def __init__(self, corrections: Corrections) -> None:
        self.corr = corrections
        self.label = f"lossy loradrop rank={corrections.rank} cycle={corrections.cycle}"

    def __call__(self, target: Backend, prompt: Tokens, params: SamplingParams, *, max_tokens: int = 128,
                 eos_ids: Sequence[int] = (), rng: np.random.Generator | None = None,
                 stats: DecodeStats | None = None, ctx: int | None = None, **_ignored) -> Iterator[TokenEvent]:
        prompt, max_tokens = _checked(prompt, max_tokens, ctx or target.config.context_length)
        rng = rng if rng is not None else np.random.default_rng(0)
        stats = stats if stats is not None else DecodeStats()
        schedule = Schedule(target, self.corr)
        cache = target.new_cache(len(prompt) + max_tokens + 1)
        t0 = time.perf_counter()
        if len(prompt) > 1:
            target.forward(prompt[:-1], cache)  # the prompt is read by the full model
        stats.prefill_s += time.perf_counter() - t0
        step = iter(range(max_tokens))

        def next_token(seq: Tokens) -> int:
            return _pick(schedule.step(seq[-1:], cache, next(step)), params, seq, rng)

        yield from _run(next_token, prompt, max_tokens, eos_ids, stats)


@dataclass
class _Model:
    backend: Backend
    cache: object = None
    fed: int = 0  # tokens of the sequence its cache holds


@dataclass
class EntropySwitch:
    """Entropy Adaptive Decoding between `small` and `target` (the large model). LOSSY unless threshold <= 0.

    Starts on the large model; threshold 0 never leaves it (entropy >= 0), which is plain large-model decoding.
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

    def __call__(self, target: Backend, prompt: Tokens, params: SamplingParams, *, max_tokens: int = 128,
                 eos_ids: Sequence[int] = (), rng: np.random.Generator | None = None,
                 stats: DecodeStats | None = None, ctx: int | None = None, **_ignored) -> Iterator[TokenEvent]:
        if self.small.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"entropy switching needs one vocabulary: the small model has {self.small.config.vocab_size}"
                             f" tokens, the large {target.config.vocab_size}; pick models of one family")
        limit = min(ctx or target.config.context_length, self.small.config.context_length)
        prompt, max_tokens = _checked(prompt, max_tokens, limit)
        rng = rng if rng is not None else np.random.default_rng(0)
        stats = stats if stats is not None else DecodeStats()
        cap = len(prompt) + max_tokens + 1
        large, small = _Model(target, target.new_cache(cap)), _Model(self.small, self.small.new_cache(cap))
        state = {"active": large, "dwell": 0, "h": deque(maxlen=self.window)}

        def next_token(seq: Tokens) -> int:
            m = state["active"]
            logits = m.backend.forward(seq[m.fed:], m.cache)  # catch up on what it missed, then the next row
            m.fed = len(seq)
            state["h"].append(entropy(logits[-1]))
            state["dwell"] += 1
            tok = _pick(logits, params, seq, rng)
            self.trace.append("L" if m is large else "S")
            self.large_tokens += m is large
            mean = float(np.mean(state["h"]))
            want = large if mean > self.threshold else (small if mean < self.threshold else m)
            if want is not m and state["dwell"] >= self.min_dwell:
                state.update(active=want, dwell=0, h=deque(maxlen=self.window))
                self.switches += 1
            return tok

        yield from _run(next_token, prompt, max_tokens, eos_ids, stats)
