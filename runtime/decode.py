"""The decode loop: one loop for every way of decoding. Plain decoding is a chain stepper with no drafter; the
speculative chain and tree rounds and the labelled lossy modes are Steppers (runtime/steppers.py, runtime/lossy.py).

The loop handles the prompt and length checks, the cache (or a Session's), prefill timing, stopping (eos, length,
repetition), statistics and streaming; each round is `stepper.step`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from .backends.base import Backend
from .draft_length import AdaptiveDraftLength
from .request import PLAIN, Request, Speculation
from .stats import DecodeStats
from .session import Session
from .steppers import ChainStepper, SeqState, Stepper, TreeStepper
from .types import FinishReason, TokenLogprob, Tokens, as_tokens
from .verify import VerifierKind, make_verifier


@dataclass(frozen=True)
class TokenEvent:
    token: int
    from_draft: bool
    finish_reason: FinishReason | None = None
    logprob: TokenLogprob | None = None  # when the call asked for logprobs


def decode(target: Backend, prompt: Tokens, spec: Speculation = PLAIN, req: Request = Request(), *,
           session: Session | None = None, stats: DecodeStats | None = None) -> Iterator[TokenEvent]:
    """Generate up to req.max_tokens tokens as `spec` says; yields one event per emitted token, the last one with a
    finish reason. max_tokens None: up to the room left in the context (its limit minus the prompt), so the decode
    ends at EOS or there (finish LENGTH). req.repetition: the call ends (finish REPETITION) at the first committed
    token after which the answer repeats itself (runtime/repetition.py), checked token by token, so a step that
    commits several tokens stops at the same token plain decoding would. Each round drafts at most the cache room left past the committed tokens,
    so a draft never overruns the cache, at the limit included.

    spec (runtime/request.py): the drafter and k; adaptive_k verifies only the prefix of each draft that pays for
    its verification, learned online from this target's call times and the drafter's acceptance
    (runtime/draft_length.py; k is then the maximum; lossless either way); the verifier: chain (1.1) or block (1.3)
    for sampled chain drafts. A tree drafter (caps.tree) runs tree rounds (TreeStepper; its `max_nodes` bounds each
    tree; k is unused). A lossy mode (runtime/lossy.py) decodes instead of speculation.
    req: sampling, length, seed, eos ids; its constraint (runtime/constraint.py): the target's p is masked before
    verification and a draft ends at its first forbidden token, so the output equals constrained plain decoding's
    (greedy) or follows its distribution (sampled); logprobs n >= 0 puts each token's TokenLogprob (n alternatives)
    on its event.

    session: keep the target's KV cache across calls (runtime/session.py): only the prompt tokens past the prefix
    it already holds are prefilled, and its capacity is the context limit.

    Stop strings and cancellation are the caller's (it stops iterating).
    """
    prompt = as_tokens(prompt)
    stepper = make_stepper(target, spec, req)
    limit, max_tokens = _bounds(target, len(prompt), stepper, req, session)
    rng = np.random.default_rng(req.seed)
    stats = stats if stats is not None else DecodeStats()
    eos = set(req.eos_ids or ())
    watch = None if req.repetition is None else req.repetition.watch()
    t0 = time.perf_counter()
    seq = _prefill(target, prompt, stepper, session, min(limit, len(prompt) + max_tokens + stepper.reserve), stats)
    stats.prefill_s += time.perf_counter() - t0
    produced, dec0, gen0 = 0, stats.decode_s, stats.n_generated  # the stats may accumulate over calls
    t_dec = time.perf_counter()
    try:
        while True:
            emitted, step = stepper.step(seq, seq.cache.capacity - seq.cache.length - 1, rng)
            stats.record(step)
            lps = stepper.step_logprobs if req.logprobs is not None else None
            for j, tok in enumerate(emitted):  # a step may commit several: the first that ends the call ends it
                produced += 1
                if produced == 1:
                    stats.first_token_s += time.perf_counter() - t0
                reason = FinishReason.EOS if tok in eos else (
                    FinishReason.REPETITION if watch is not None and watch.push(tok) else
                    FinishReason.LENGTH if produced >= max_tokens else None)
                stats.decode_s, stats.n_generated = dec0 + time.perf_counter() - t_dec, gen0 + produced
                yield TokenEvent(tok, j < step.n_accepted, reason, None if lps is None else lps[j])
                if reason is not None:
                    return
    finally:
        stats.decode_s, stats.n_generated = dec0 + time.perf_counter() - t_dec, gen0 + produced
        stepper.finish(seq.tokens[:len(prompt) + produced].copy())  # no token a step committed past the end
        if session is not None:
            session.finish(seq.tokens)


def _bounds(target: Backend, n_prompt: int, stepper: Stepper, req: Request, session: Session | None
            ) -> tuple[int, int]:
    """(the context limit, the most tokens this call may emit): the session's capacity, else the request's context
    or the model's, within the stepper's own limit; ValueError for a prompt that leaves no room."""
    limit = session.capacity if session is not None else (req.max_context or target.config.context_length)
    limit = limit if stepper.context_limit is None else min(limit, stepper.context_limit)
    check_prompt(n_prompt, limit)
    room = limit - n_prompt
    return limit, room if req.max_tokens is None else min(req.max_tokens, room)


def _prefill(target: Backend, prompt: Tokens, stepper: Stepper, session: Session | None, capacity: int,
             stats: DecodeStats) -> SeqState:
    """The call's sequence, its prompt prefilled by the stepper: in a new cache of `capacity` positions, or in the
    session's cache past the prefix it holds (an interrupted prefill leaves the session what its cache holds)."""
    if session is None:
        seq, start = SeqState(prompt, target.new_cache(capacity)), 0
    else:
        start = session.start(prompt)
        seq = SeqState(prompt, session.cache)
    try:
        n_prefilled = stepper.start(seq, start)
    except BaseException:
        if session is not None:
            session.finish(seq.tokens)
        raise
    stats.n_prefilled += n_prefilled
    stats.n_calls += 1
    return seq


def check_prompt(n_prompt: int, limit: int) -> None:
    """ValueError for an empty prompt, or one that leaves no room for an answer in a context of `limit` positions."""
    if n_prompt == 0:
        raise ValueError("the prompt is empty: give at least one token")
    if n_prompt + 1 > limit:
        raise ValueError(f"the prompt has {n_prompt} tokens but the context holds {limit}: shorten the prompt (or "
                         "the conversation) or raise ctx (--ctx, up to the model's context length)")


def make_stepper(target: Backend, spec: Speculation, req: Request) -> Stepper:
    """The Stepper for one decode call; fails here (start-up) when the target lacks what the drafter needs, or
    when a constraint or logprobs meet a mode that cannot honour them."""
    params, drafter = req.params, spec.drafter
    if spec.lossy is not None:
        if req.constraint is not None or req.logprobs is not None:
            raise ValueError(f"{spec.lossy.label}: a lossy mode's output is not the model's own, so it takes no "
                             "grammar and reports no logprobs; decode without the lossy mode")
        return spec.lossy.stepper(target, params)
    if req.constraint is not None and spec.verifier is VerifierKind.BLOCK and not params.greedy:
        raise ValueError("block verification does not take a grammar constraint (its proof needs the whole draft "
                         "drawn from q, and a constrained draft ends at its first forbidden token): use the chain "
                         "verifier (--verifier chain)")
    if drafter is None:
        return ChainStepper(target, None, req, make_verifier(params, spec.verifier), spec.k)
    drafter.check(target)
    if drafter.caps.tree:
        return TreeStepper(target, drafter, req)
    policy = AdaptiveDraftLength(spec.k) if (spec.adaptive_k and spec.k > 0) else None
    return ChainStepper(target, drafter, req, make_verifier(params, spec.verifier), spec.k, policy)
