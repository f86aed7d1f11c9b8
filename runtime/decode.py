"""The decode loop: one loop for every way of decoding. Plain decoding is a chain stepper with no drafter; the
speculative chain and tree rounds and the labelled lossy modes are Steppers (runtime/steppers.py, runtime/lossy.py).

The loop handles the prompt and length checks, the cache (or a Session's), prefill timing, stopping (eos, length),
statistics and streaming; each round is `stepper.step`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from .backends.base import Backend
from .constraint import Constraint
from .draft_length import AdaptiveDraftLength
from .drafters.base import Drafter
from .lossy import LossyMode
from .stats import DecodeStats
from .session import Session
from .steppers import ChainStepper, SeqState, Stepper, TreeStepper
from .types import FinishReason, SamplingParams, TokenLogprob, Tokens, as_tokens
from .verify import VerifierKind, make_verifier


@dataclass(frozen=True)
class TokenEvent:
    token: int
    from_draft: bool
    finish_reason: FinishReason | None = None
    logprob: TokenLogprob | None = None  # when the call asked for logprobs


def decode(target: Backend, prompt: Tokens, params: SamplingParams, *, drafter: Drafter | None = None,
           k: int = 4, max_tokens: int | None = 128, eos_ids: Sequence[int] = (),
           rng: np.random.Generator | None = None, stats: DecodeStats | None = None, ctx: int | None = None,
           adaptive_k: bool = False,
           verifier_kind: VerifierKind = VerifierKind.CHAIN, session: Session | None = None,
           lossy: LossyMode | None = None, constraint: Constraint | None = None,
           logprobs: int | None = None) -> Iterator[TokenEvent]:
    """Generate up to max_tokens tokens; yields one event per emitted token, the last one with a finish reason.
    max_tokens None: up to the room left in the context (its limit minus the prompt), so the decode ends at EOS or
    there (finish LENGTH). Each round drafts at most the cache room left past the committed tokens, so a draft
    never overruns the cache, at the limit included.

    adaptive_k: verify only the prefix of each draft that pays for its verification, learned online from this
    target's call times and the drafter's acceptance (runtime/draft_length.py); k is then the maximum. Lossless
    either way: only speed changes. verifier_kind: chain (1.1) or block (1.3) verification of sampled chain drafts.
    A tree drafter (caps.tree) runs tree rounds (TreeStepper; its `max_nodes` bounds each tree; k is unused).

    session: keep the target's KV cache across calls (runtime/session.py): only the prompt tokens past the prefix
    it already holds are prefilled, and its capacity is the context limit.
    lossy: a labelled lossy mode (runtime/lossy.py) decodes instead of speculation (no drafter then).
    constraint: what the output must match (runtime/constraint.py): the target's p is masked before verification
    and a draft ends at its first forbidden token, so the output equals constrained plain decoding's (greedy) or
    follows its distribution (sampled). logprobs: n >= 0 puts each token's TokenLogprob (n alternatives) on its
    event; None: off.

    Stop strings and cancellation are the caller's (it stops iterating).
    """
    prompt = as_tokens(prompt)
    if len(prompt) == 0:
        raise ValueError("the prompt is empty: give at least one token")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    stepper = make_stepper(target, params, drafter, k=k, adaptive_k=adaptive_k, verifier_kind=verifier_kind,
                           lossy=lossy, constraint=constraint, logprobs=logprobs)
    limit = session.capacity if session is not None else (ctx or target.config.context_length)
    limit = limit if stepper.context_limit is None else min(limit, stepper.context_limit)
    if len(prompt) + 1 > limit:
        raise ValueError(f"the prompt has {len(prompt)} tokens but the context holds {limit}: shorten the prompt "
                         "or raise --ctx (up to the model's context length)")
    room = limit - len(prompt)
    max_tokens = room if max_tokens is None else min(max_tokens, room)
    rng = rng if rng is not None else np.random.default_rng(0)
    stats = stats if stats is not None else DecodeStats()
    eos = set(int(e) for e in eos_ids)
    t0 = time.perf_counter()
    if session is None:
        seq, start = SeqState(prompt, target.new_cache(min(limit, len(prompt) + max_tokens + stepper.reserve))), 0
    else:
        start = session.start(prompt)
        seq = SeqState(prompt, session.cache)
    try:
        n_prefilled = stepper.start(seq, start)
    except BaseException:
        if session is not None:  # an interrupted prefill keeps what the cache consistently holds
            session.finish(seq.tokens)
        raise
    stats.prefill_s += time.perf_counter() - t0
    stats.n_prefilled += n_prefilled
    produced, dec0, gen0 = 0, stats.decode_s, stats.n_generated  # the stats may accumulate over calls
    t_dec = time.perf_counter()
    try:
        while True:
            emitted, step = stepper.step(seq, seq.cache.capacity - seq.cache.length - 1, rng)
            stats.record(step)
            lps = stepper.step_logprobs if logprobs is not None else None
            for j, tok in enumerate(emitted):
                produced += 1
                reason = FinishReason.EOS if tok in eos else (
                    FinishReason.LENGTH if produced >= max_tokens else None)
                stats.decode_s, stats.n_generated = dec0 + time.perf_counter() - t_dec, gen0 + produced
                yield TokenEvent(tok, j < step.n_accepted, reason, None if lps is None else lps[j])
                if reason is not None:
                    return
    finally:
        stats.decode_s, stats.n_generated = dec0 + time.perf_counter() - t_dec, gen0 + produced
        if session is not None:
            session.finish(seq.tokens)


def make_stepper(target: Backend, params: SamplingParams, drafter: Drafter | None = None, *, k: int = 4,
                 adaptive_k: bool = False, verifier_kind: VerifierKind = VerifierKind.CHAIN,
                 lossy: LossyMode | None = None, constraint: Constraint | None = None,
                 logprobs: int | None = None) -> Stepper:
    """The Stepper for one decode call; fails here (start-up) when the target lacks what the drafter needs, or
    when a constraint or logprobs meet a mode that cannot honour them."""
    extra = {"constraint": constraint, "logprobs": logprobs}
    if lossy is not None:
        if drafter is not None:
            raise ValueError(f"{lossy.label}: a lossy mode decodes without a drafter; drop the drafter")
        if constraint is not None or logprobs is not None:
            raise ValueError(f"{lossy.label}: a lossy mode's output is not the model's own, so it takes no grammar "
                             "and reports no logprobs; decode without the lossy mode")
        return lossy.stepper(target, params)
    if constraint is not None and verifier_kind is VerifierKind.BLOCK and not params.greedy:
        raise ValueError("block verification does not take a grammar constraint (its proof needs the whole draft "
                         "drawn from q, and a constrained draft ends at its first forbidden token): use the chain "
                         "verifier (--verifier chain)")
    if drafter is None:
        return ChainStepper(target, None, params, make_verifier(params, verifier_kind), k, **extra)
    drafter.check(target)
    if drafter.caps.tree:
        return TreeStepper(target, drafter, params, **extra)
    policy = AdaptiveDraftLength(k) if (adaptive_k and k > 0) else None
    return ChainStepper(target, drafter, params, make_verifier(params, verifier_kind), k, policy, **extra)
