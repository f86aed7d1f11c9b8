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

from .backends.base import Backend, KVCache, require_tree
from .draft_length import AdaptiveDraftLength
from .drafters.base import Drafter, TreeDrafter
from .sampling import logits_to_probs
from .stats import DecodeStats
from .session import Session
from .tree import TreeDraft
from .types import EMPTY_DRAFT, FinishReason, SamplingParams, StepStats, Tokens, as_tokens
from .verify import VerifierKind, make_verifier, verify_tree
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


def prefill(target: Backend, seq: SeqState, drafter=None, start: int = 0) -> None:
    """Feed the prompt tokens from `start` (those before it are cached already: a Session) up to all but the last
    (the first step feeds it); a drafter with `observe` sees the logits."""
    if seq.n - 1 > start:
        logits = target.forward(seq.tokens[start:-1], seq.cache)
        if hasattr(drafter, "observe"):  # token recycling learns the prompt's successors before the first round
            drafter.observe(seq.tokens[start:-1], logits)


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
    if policy is not None and k > 0 and getattr(drafter, "weight_bytes_per_token", 0):
        # a drafter that pays per token drafts only what the policy would verify of its paid kind of draft
        k = min(k, policy.budget(k, getattr(drafter, "budget_kind", None)))
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
    if hasattr(drafter, "observe"):  # drafters that learn from the target's logits (token recycling)
        drafter.observe(step_tokens, logits)
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


def tree_step(target: Backend, drafter: TreeDrafter, params: SamplingParams, seq: SeqState, max_nodes: int,
              rng: np.random.Generator) -> tuple[list[int], StepStats]:
    """One tree round (ALGORITHMS.md 1.4 tree attention): propose a tree of <= max_nodes nodes, one target forward
    over [last, *nodes] with the tree mask, verify (1.2 / 1.4 / greedy), move the accepted path's K/V into place
    (`cache.compact`), commit.

    requires: seq.cache.length == seq.n - 1, room for max_nodes + 1 positions, a backend with caps.tree_mask and a
              cache with `compact`; the drafter has `propose_tree(context, max_nodes, rng) -> TreeDraft`.
    returns:  the emitted tokens (the accepted path's tokens + one recovered/bonus token) and stats.
    """
    t0 = time.perf_counter()
    context = seq.tokens
    tree: TreeDraft = drafter.propose_tree(context, max_nodes, rng)
    t1 = time.perf_counter()
    base = seq.cache.length
    fed = np.concatenate([context[-1:], tree.tokens]).astype(np.int32)
    tf = time.perf_counter()
    logits = target.forward(fed, seq.cache, tree_mask=tree.mask())  # [n+1, V]
    forward_s = time.perf_counter() - tf
    if hasattr(drafter, "observe"):
        drafter.observe(fed, logits)
    p = tree_probs(tree, logits, params, context)
    verdict = verify_tree(tree, p, rng, greedy=params.greedy)
    # slots base + node: the root (in place already) and the accepted path, ascending because BFS orders them
    seq.cache.compact(base + np.array((0, *verdict.path), dtype=np.int64), base)
    emitted = [int(tree.tokens[j - 1]) for j in verdict.path] + [int(verdict.next_token)]
    seq.extend(emitted)
    drafter.accept(verdict.n_accepted, verdict.next_token)
    t2 = time.perf_counter()
    return emitted, StepStats(k=tree.n, n_accepted=verdict.n_accepted, draft_s=t1 - t0, verify_s=t2 - t1,
                              forward_s=forward_s)


def tree_probs(tree: TreeDraft, logits: np.ndarray, params: SamplingParams, context: Tokens) -> np.ndarray:
    """p [n+1, V]; with a repetition penalty each node's row is penalised by its own root path's history."""
    if params.repetition_penalty == 1.0:
        return logits_to_probs(logits, params)
    rows = [logits_to_probs(logits[j], params, history=np.concatenate(
        [context, tree.tokens[np.array(tree.path_to(j), dtype=np.int64) - 1]])) for j in range(tree.n + 1)]
    return np.concatenate(rows, axis=0)


def is_tree_drafter(drafter) -> bool:
    return drafter is not None and hasattr(drafter, "propose_tree")


def check_tree_support(target: Backend, drafter) -> None:
    """Fail at start-up when a tree drafter meets a backend that cannot run tree masks."""
    if is_tree_drafter(drafter):
        require_tree(target)


@dataclass(frozen=True)
class TokenEvent:
    token: int
    from_draft: bool
    finish_reason: FinishReason | None = None


def decode(target: Backend, prompt: Tokens, params: SamplingParams, *, drafter: Drafter | TreeDrafter | None = None,
           k: int = 4, max_tokens: int = 128, eos_ids: Sequence[int] = (), rng: np.random.Generator | None = None,
           stats: DecodeStats | None = None, ctx: int | None = None, adaptive_k: bool = False,
           verifier_kind: VerifierKind = VerifierKind.CHAIN, session: Session | None = None
           ) -> Iterator[TokenEvent]:
    """Generate up to max_tokens tokens; yields one event per emitted token, the last one with a finish reason.

    adaptive_k: verify only the prefix of each draft that pays for its verification, learned online from this
    target's call times and the drafter's acceptance (runtime/draft_length.py); k is then the maximum. Lossless
    either way: only speed changes. verifier_kind: chain (1.1) or block (1.3) verification of sampled chain drafts.
    A drafter with `propose_tree` runs tree rounds (`tree_step`, its `max_nodes` bounds each tree; k is unused).

    session: keep the target's KV cache across calls (runtime/session.py): only the prompt tokens past the prefix
    it already holds are prefilled, and its capacity is the context limit.

    The loop only handles stopping (eos, length) and bookkeeping; each round is `speculative_step`.
    Stop strings and cancellation are the caller's (it stops iterating).
    """
    prompt = as_tokens(prompt)
    if len(prompt) == 0:
        raise ValueError("the prompt is empty: give at least one token")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    limit = session.capacity if session is not None else (ctx or target.config.context_length)
    if len(prompt) + 1 > limit:
        raise ValueError(f"the prompt has {len(prompt)} tokens but the context holds {limit}: shorten the prompt "
                         "or raise --ctx (up to the model's context length)")
    max_tokens = min(max_tokens, limit - len(prompt))
    rng = rng if rng is not None else np.random.default_rng(0)
    stats = stats if stats is not None else DecodeStats()
    verifier = make_verifier(params, verifier_kind)
    check_tree_support(target, drafter)
    tree = is_tree_drafter(drafter)
    k = int(drafter.max_nodes) if tree else k
    policy = AdaptiveDraftLength(k) if (adaptive_k and drafter is not None and k > 0 and not tree) else None
    eos = set(int(e) for e in eos_ids)
    t0 = time.perf_counter()
    if session is None:
        seq, start = SeqState(prompt, target.new_cache(min(limit, len(prompt) + max_tokens + k + 1))), 0
    else:
        start = session.start(prompt)
        seq = SeqState(prompt, session.cache)
    try:
        prefill(target, seq, drafter, start)
        if drafter is not None:
            if hasattr(drafter, "bind"):  # self-speculative drafters share the target's weights and KV cache
                drafter.bind(target, seq.cache)
            drafter.begin(prompt)
    except BaseException:
        if session is not None:  # an interrupted prefill keeps what the cache consistently holds
            session.finish(seq.tokens)
        raise
    stats.prefill_s += time.perf_counter() - t0
    stats.n_prefilled += len(prompt) - 1 - start
    produced, dec0, gen0 = 0, stats.decode_s, stats.n_generated  # the stats may accumulate over calls
    t_dec = time.perf_counter()
    try:
        while True:
            room = seq.cache.capacity - seq.cache.length - 1
            if tree:
                emitted, step = tree_step(target, drafter, params, seq, min(k, room), rng)
            else:
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
        if session is not None:
            session.finish(seq.tokens)
