"""LoRA-Drop as a self-speculative drafter (docs/algorithms.md 2.5): lossless, because the full model verifies.

Each round runs the cycle from a refresh step: the full model on the last committed token (its deltas become the
anchors, its logits q_1), then drop steps (runtime/loradrop.py Schedule), refreshing again every `cycle` tokens.
Draft K/V goes into the target's cache past its length; the cache length is restored afterwards and the verify
forward overwrites those rows (and clears the drop steps' missing-row marks).
"""
from __future__ import annotations

import numpy as np

from ..backends.base import LayeredBackend
from ..loradrop import Corrections, Schedule
from ..sampling import logits_to_probs, sample
from ..types import Draft, SamplingParams, Tokens
from .base import BackendNeed, Drafter, DrafterCaps


class LoRADropDrafter(Drafter):
    """The LoRA-Drop cycle over the target's own weights and cache (bind), verified by the full model."""

    caps = DrafterCaps(binds_target=True, pays_per_token=True, needs=frozenset({BackendNeed.LAYER_REUSE}))

    def __init__(self, corrections: Corrections, name: str = "loradrop") -> None:
        self.corr, self.name = corrections, name
        self.weight_bytes_per_token = 0  # set by bind (depends on the target)
        self._schedule: Schedule | None = None
        self._cache = None

    def bind(self, target: LayeredBackend, cache) -> None:
        """Share the target's weights and KV cache (decode() calls this once per sequence)."""
        self._schedule = Schedule(target, self.corr)
        self._cache = cache
        anchors = {l: np.zeros(target.config.d_model, dtype=np.float32) for l in self.corr.layers}
        drop = target.weight_bytes(self.corr.plan(anchors))
        self.weight_bytes_per_token = (target.weight_bytes() + (self.corr.cycle - 1) * drop) // self.corr.cycle

    def begin(self, prompt: Tokens) -> None:
        if self._schedule is None:
            raise ValueError("the loradrop drafter shares the target's cache: decode() binds it (call bind first)")

    def propose(self, context: Tokens, k: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        """requires: the cache holds context[:-1]; returns <= k tokens (fewer near the cache's end) with q from
        `params`."""
        cache = self._cache
        start = cache.length
        k = max(0, min(k, cache.capacity - start - 1))  # keep room for the verify forward's k + 1 rows
        tokens = np.zeros(k, dtype=np.int32)
        q = np.zeros((k, self._schedule.backend.config.vocab_size), dtype=np.float64)
        feed = np.asarray(context[-1:], dtype=np.int32)
        for i in range(k):
            logits = self._schedule.step(feed, cache, i)
            q[i] = logits_to_probs(logits, params, history=np.concatenate([context, tokens[:i]]))[0]
            tokens[i] = int(np.argmax(q[i])) if params.greedy else sample(q[i], rng)
            feed = tokens[i:i + 1]
        cache.rollback(start)
        return Draft(tokens=tokens, q=q)

    def accept(self, n_accepted: int, next_token: int) -> None:
        """Nothing to keep: every round starts with a refresh on the last committed token."""
