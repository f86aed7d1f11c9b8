"""The speculative step and the decode loop. Plain decoding is the same loop with no drafter.

Invariant (the only KV cursor): the target cache holds every committed token except the last one,
which is fed as the first input of the next step: forward([last, *draft]) verifies k draft tokens
and yields k+1 rows of p.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from .backends.base import Backend, KVCache
from .draft_length import AdaptiveDraftLength
from .drafters.base import Drafter
from .sampling import logits_to_probs
from .stats import DecodeStats
from .types import EMPTY_DRAFT, FinishReason, SamplingParams, StepStats, Tokens, as_tokens
from .verify import make_verifier
from .verify.base import Verifier


class SeqState:
    """Committed tokens of one sequence in a preallocated buffer, plus its target KV cache."""

    def __init__(self, prompt: Tokens, cache: KVCache) -> None:
        self.buf = np.zeros(cache.capacity + 1, dtype=np.int32)
        self.n = len(prompt)
        self.buf[:self.n] = prompt
        self.cache = cache

    @property
    def tokens(self) -> Tokens:
        return self.buf[:self.n]

    def extend(self, toks: Sequence[int]) -> None:
        self.buf[self.n:self.n + len(toks)] = toks
        self.n += len(toks)


def prefill(target: Backend, seq: SeqState) -> None:
    """Feed all prompt tokens but the last (the first step feeds it)."""
    if seq.n > 1:
        target.forward(seq.tokens[:-1], seq.cache)


def speculative_step(target: Backend, drafter: Drafter | None, verifier: Verifier, params: SamplingParams,
                     seq: SeqState, k: int, rng: np.random.Generator, policy: AdaptiveDraftLength | None = None
                     ) -> tuple[list[int], StepStats]:
    """One round: draft <= k tokens, keep the prefix worth verifying (policy; all without one), one target forward
    over [last, *draft], verify, commit.

    requires: seq.cache.length == seq.n - 1 and room for k+1 more positions.
    returns:  the emitted tokens (accepted draft tokens + one recovered/bonus token; >= 1) and stats.
    """
    t0 = time.perf_counter()
    context = seq.tokens
    draft = drafter.propose(context, k, rng) if (drafter is not None and k > 0) else EMPTY_DRAFT
    if policy is not None and draft.k:
        draft = draft.prefix(policy.choose(draft.kind, draft.k))
    t1 = time.perf_counter()
    base = seq.cache.length
    step_tokens = np.concatenate([context[-1:], draft.tokens]).astype(np.int32)
    taps = getattr(drafter, "verify_taps", ())  # a drafter that learns from the verify pass (DEL's shadow tokens)
    tf = time.perf_counter()
    if taps:
        h, tapped = target.hidden(step_tokens, seq.cache, taps=taps)
        logits = target.logits_from_hidden(h)
    else:
        logits = target.forward(step_tokens, seq.cache)
    forward_s = time.perf_counter() - tf
    p = logits_to_probs(logits, params, history=np.concatenate([context, draft.tokens]))
    verdict = verifier.verify(draft, p, rng)
    if policy is not None:
        policy.observe(draft.kind, draft.k, verdict.n_accepted, len(step_tokens), forward_s)
    seq.cache.rollback(base + 1 + verdict.n_accepted)  # [last, accepted...] are now committed in the cache
    emitted = [int(x) for x in draft.tokens[:verdict.n_accepted]] + [int(verdict.next_token)]
    seq.extend(emitted)
    if drafter is not None:
        if taps:
            drafter.observe_verify(tapped, np.asarray(emitted, dtype=np.int32))
        drafter.accept(verdict.n_accepted, verdict.next_token)
    t2 = time.perf_counter()
    return emitted, StepStats(k=draft.k, n_accepted=verdict.n_accepted, draft_s=t1 - t0, verify_s=t2 - t1,
                              forward_s=forward_s)


@dataclass(frozen=True)
class TokenEvent:
    token: int
    from_draft: bool
    finish_reason: FinishReason | None = None


def decode(target: Backend, prompt: Tokens, params: SamplingParams, *, drafter: Drafter | None = None,
           k: int = 4, max_tokens: int = 128, eos_ids: Sequence[int] = (), rng: np.random.Generator | None = None,
           stats: DecodeStats | None = None, ctx: int | None = None, adaptive_k: bool = False
           ) -> Iterator[TokenEvent]:
    """Generate up to max_tokens tokens; yields one event per emitted token, the last one with a finish reason.

    adaptive_k: verify only the prefix of each draft that pays for its verification, learned online from this
    target's call times and the drafter's acceptance (runtime/draft_length.py); k is then the maximum. Lossless
    either way: only speed changes.

    The loop only handles stopping (eos, length) and bookkeeping; each round is `speculative_step`.
    Stop strings and cancellation are the caller's (it stops iterating).
    """
    prompt = as_tokens(prompt)
    if len(prompt) == 0:
        raise ValueError("the prompt is empty: give at least one token")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    limit = ctx or target.config.context_length
    if len(prompt) + 1 > limit:
        raise ValueError(f"the prompt has {len(prompt)} tokens but the context holds {limit}: shorten the prompt "
                         "or raise --ctx (up to the model's context length)")
    max_tokens = min(max_tokens, limit - len(prompt))
    rng = rng if rng is not None else np.random.default_rng(0)
    stats = stats if stats is not None else DecodeStats()
    verifier = make_verifier(params)
    policy = AdaptiveDraftLength(k) if (adaptive_k and drafter is not None and k > 0) else None
    eos = set(int(e) for e in eos_ids)
    seq = SeqState(prompt, target.new_cache(min(limit, len(prompt) + max_tokens + k + 1)))
    t0 = time.perf_counter()
    prefill(target, seq)
    if drafter is not None:
        if hasattr(drafter, "bind"):  # self-speculative drafters share the target's weights and KV cache
            drafter.bind(target, seq.cache)
        drafter.begin(prompt)
    stats.prefill_s += time.perf_counter() - t0
    produced, dec0, gen0 = 0, stats.decode_s, stats.n_generated  # the stats may accumulate over calls
    t_dec = time.perf_counter()
    try:
        while True:
            room = seq.cache.capacity - seq.cache.length - 1
            emitted, step = speculative_step(target, drafter, verifier, params, seq, min(k, room), rng, policy)
            stats.record(step)
            for j, tok in enumerate(emitted):
                produced += 1
                reason = FinishReason.EOS if tok in eos else (
                    FinishReason.LENGTH if produced >= max_tokens else None)
                stats.decode_s, stats.n_generated = dec0 + time.perf_counter() - t_dec, gen0 + produced
                yield TokenEvent(tok, j < step.n_accepted, reason)
                if reason is not None:
                    return
    finally:
        stats.decode_s, stats.n_generated = dec0 + time.perf_counter() - t_dec, gen0 + produced
