"""What every self-speculative drafter shares (docs/algorithms.md 2.3, 2.4): the target's own weights run with a
LayerPlan, over the target's own KV cache, through the LayeredBackend seam only (hidden + logits_from_hidden), so
the same drafter runs on any backend with caps.layer_plan.

KV (the one place this is written down): the target cache holds every committed token but the last (decode.py's
invariant). A draft round feeds [last, d_1, ..., d_{k-1}] one at a time with the plan at slots length, length+1,
...; only the planned layers write K/V there, and they attend to the committed full-model K/V below `length`.
Afterwards the cache is rolled back to where it was; the verify forward overwrites those slots in every layer.
"""
from __future__ import annotations

import numpy as np

from ..backends.base import Backend, Cache, LayeredBackend, LayerPlan
from ..draft_stop import DraftStop, stop_features
from ..sampling import logits_to_probs, sample
from ..types import Draft, SamplingParams, Tokens
from .base import BackendNeed, Drafter, DrafterCaps, require_layered


def draft_chain(target: LayeredBackend, cache: Cache, plan: LayerPlan, context: Tokens, k: int,
                params: SamplingParams, rng: np.random.Generator, stop: DraftStop | None = None
                ) -> tuple[Draft, np.ndarray]:
    """Draft up to k tokens continuing context with the plan's layers (argmax under greedy params, else sampled
    from q = logits_to_probs(draft logits)); `stop` may end the chain early (it keeps the token that stopped it).

    requires: cache.length == len(context) - 1 and room for k more positions.
    returns:  (Draft with q, features [k', 2] for the stop policy); cache.length is unchanged.
    """
    base = cache.length
    k = max(0, min(k, cache.capacity - base))
    tokens = np.zeros(k, dtype=np.int32)
    q = np.zeros((k, target.config.vocab_size), dtype=np.float64)
    feats = np.zeros((k, 2), dtype=np.float64)
    feed = context[-1:]
    n = 0
    try:
        while n < k:
            h, _ = target.hidden(np.asarray(feed, dtype=np.int32), cache, plan=plan)
            logits = target.logits_from_hidden(h[-1:])
            q[n] = logits_to_probs(logits, params, history=np.concatenate([context, tokens[:n]]))[0]
            tokens[n] = int(np.argmax(q[n])) if params.greedy else sample(q[n], rng)
            feats[n] = stop_features(logits[0], int(tokens[n]))
            n += 1
            if stop is not None and stop.stop(feats[:n]):
                break
            feed = tokens[n - 1:n]
    finally:
        cache.rollback(base)
    return Draft(tokens=tokens[:n], q=q[:n]), feats[:n]


class SelfSpecDrafter(Drafter):
    """A chain drafter over the target's weights and cache; subclasses choose the plan per round (`plan_for`) and
    may learn from each verdict (`learn`). Holds no weights: only references to the target and its cache."""

    caps = DrafterCaps(binds_target=True, pays_per_token=True, needs=frozenset({BackendNeed.LAYER_PLAN}))
    name = "selfspec"

    def __init__(self, stop: DraftStop | None = None) -> None:
        self.stop = stop
        self.target: LayeredBackend | None = None
        self.cache: Cache | None = None
        self.weight_bytes_per_token = 0
        self._feats = np.zeros((0, 2))
        self._draft = np.zeros(0, dtype=np.int32)
        self._context = np.zeros(0, dtype=np.int32)

    def bind(self, target: Backend, cache: Cache) -> None:
        self.target = require_layered(target, self.name)
        self.cache = cache
        self.on_bind()

    def on_bind(self) -> None:
        """Hook: validate the plan against the target's layer count."""

    def begin(self, prompt: Tokens) -> None:
        if self.target is None:
            raise ValueError(f"the {self.name} drafter shares the target's KV cache: decode() must bind it first")

    def plan_for(self, context: Tokens, k: int) -> tuple[LayerPlan, int]:
        raise NotImplementedError

    def propose(self, context: Tokens, k: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        """Draft with this round's plan (`plan_for`); q from `params`."""
        plan, k = self.plan_for(context, k)
        self.weight_bytes_per_token = self.target.weight_bytes(plan)
        draft, self._feats = draft_chain(self.target, self.cache, plan, context, k, params, rng, self.stop)
        self._draft, self._context = draft.tokens, context
        return draft

    def accept(self, n_accepted: int, next_token: int) -> None:
        if self.stop is not None and len(self._feats):
            self.stop.observe(self._feats, n_accepted)
        self.learn(n_accepted, next_token)

    def learn(self, n_accepted: int, next_token: int) -> None:
        """Hook: per-round learning (SWIFT's search step)."""
