"""A separate draft model (docs/algorithms.md 2.1): any Backend, same tokenizer as the target.

VocabTrim (2.2): with `vocab_ids` the backend's logits are [T, N] over those ids; they are scattered to [T, V] with
-inf elsewhere (runtime/vocab_trim.expand_logits), so the draft emits ids[j] and q is zero off the list (lossless).

The "draft cache lags by one" invariant lives in exactly one place, `_sync`: before drafting, the
draft cache is rolled back to the longest prefix it shares with the committed context (never the
whole context: the last token is always fed, its logits give q_1), and the rest is fed in one call.
That covers full acceptance (x_k was never fed), rejection (rejected tokens are dropped) and the
first round after `begin`. `begin` prefills prompt[:-1] during the decode loop's prefill phase, over whatever prefix
the cache still holds from the previous sequence (a chat's earlier turns are not fed again).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..backends.base import Backend, feed
from ..draft_stop import DraftStop, stop_features
from ..sampling import logits_to_probs, sample
from ..tree import TreeDraft
from ..types import Draft, Logits, SamplingParams, Tokens
from ..vocab_trim import expand_logits
from .base import Drafter, DrafterCaps


class ModelDrafter(Drafter):
    """A chain drafter over a separate draft model's backend (its own KV cache); drafts from the call's params."""

    caps = DrafterCaps(pays_per_token=True)

    def __init__(self, backend: Backend, *, max_len: int | None = None, name: str | None = None,
                 stop: DraftStop | None = None, vocab_ids: np.ndarray | None = None) -> None:
        self.backend = backend
        self.vocab_ids = None if vocab_ids is None else np.asarray(vocab_ids, dtype=np.int64)
        self.stop = stop  # optional draft-length policy (runtime/draft_stop.py): drafting ends early
        self._feats = np.zeros((0, 2))
        self.name = name or f"model:{backend.config.name or backend.name}"
        self.weight_bytes_per_token = backend.weight_bytes()
        self._max_len = max_len or backend.caps.max_context or backend.config.context_length
        self._cache = None
        self._cached = np.zeros(0, dtype=np.int32)  # the tokens whose KV the draft cache holds

    def begin(self, prompt: Tokens) -> None:
        """Prefill the draft cache with prompt[:-1] (in the decode loop's prefill phase, not in the first draft),
        keeping what it already holds of a previous sequence with the same prefix (the next chat turn)."""
        if self._cache is None:
            self._cache = self.backend.new_cache(self._max_len)
            self._cached = np.zeros(0, dtype=np.int32)
        prompt = np.asarray(prompt, dtype=np.int32)
        if len(prompt) > 1 and len(prompt) <= self._cache.capacity:
            common = self._rollback_to_common(prompt[:-1])
            if common < len(prompt) - 1:
                feed(self.backend, prompt[common:-1], self._cache)
                self._cached = prompt[:-1].copy()

    def _rollback_to_common(self, context: np.ndarray) -> int:
        """Roll the draft cache back to the longest prefix of `context` it holds; returns that length. `_cached` is
        cut first, so an interrupted forward after this never leaves it claiming rows the cache lacks."""
        n = min(len(self._cached), len(context))
        diff = np.flatnonzero(self._cached[:n] != context[:n])
        common = int(diff[0]) if len(diff) else n
        self._cache.rollback(common)
        self._cached = self._cached[:common]
        return common

    def _sync(self, context: Tokens) -> np.ndarray:
        """Make the draft cache hold context[:-1] plus feed the rest; returns the logits row after context[-1]."""
        common = self._rollback_to_common(np.asarray(context, dtype=np.int32)[:-1])
        logits = self.backend.forward(context[common:], self._cache)
        self._cached = np.array(context, dtype=np.int32)
        return self._full(logits[-1:])

    @property
    def capacity(self) -> int:
        """Positions the draft cache holds (0 before the first `begin`)."""
        return 0 if self._cache is None else self._cache.capacity

    def root_logits(self, context: Tokens) -> Logits:
        """[1, V] draft logits after the whole context (the cache then holds it): where a tree drafter starts."""
        if self._cache is None:
            self.begin(context)
        return self._sync(context)

    def tree_logits(self, context: Tokens, tree: TreeDraft) -> Logits:
        """[n + 1, V] draft logits of [root = context[-1], *tree.tokens] under the tree mask, fed again from the root
        (earlier trees' rows are not kept); afterwards the cache holds the context, as after `root_logits`."""
        context = np.asarray(context, dtype=np.int32)
        self._cache.rollback(len(context) - 1)
        self._cached = context[:-1]
        fed = np.concatenate([context[-1:], tree.tokens]).astype(np.int32)
        logits = self._full(self.backend.forward(fed, self._cache, tree_mask=tree.mask()))
        self._cache.rollback(len(context))  # keep the root's row
        self._cached = context
        return logits

    def _full(self, logits: Logits) -> Logits:
        """Draft logits over the full vocabulary: a trimmed head's [T, N] scattered, -inf off the list."""
        return logits if self.vocab_ids is None else expand_logits(logits, self.vocab_ids,
                                                                   self.backend.config.vocab_size)

    def propose(self, context: Tokens, k: int, params: SamplingParams, rng: np.random.Generator,
                extend: Callable[[np.ndarray, int], np.ndarray] | None = None) -> Draft:
        """Draft up to k tokens, q rows from `params`. `extend(drafted, room)` (without a stop policy) is asked after
        each drafted token for up to `room` tokens that continue it without the model (prompt lookup,
        runtime/drafters/lookup.py); if it returns any, the draft ends with them, each with a point-mass q row (a
        deterministic proposal, which speculative sampling verifies exactly as the 1.2 rule does)."""
        if self._cache is None:
            self.begin(context)
        k = max(0, min(k, self._cache.capacity - len(context)))
        if k == 0:
            return Draft(tokens=np.zeros(0, dtype=np.int32), q=None)
        tokens = np.zeros(k, dtype=np.int32)
        q = np.zeros((k, self.backend.config.vocab_size), dtype=np.float64)
        feats = np.zeros((k, 2), dtype=np.float64)
        fed = k - 1  # drafted tokens fed to the draft cache (all but the last, unless a continuation takes over)
        logits = self._sync(context)
        for i in range(k):
            q[i] = logits_to_probs(logits, params, history=np.concatenate([context, tokens[:i]]))[0]
            tokens[i] = int(np.argmax(q[i])) if params.greedy else sample(q[i], rng)
            if self.stop is not None:  # a softmax over the vocabulary per token: only when a policy reads it
                feats[i] = stop_features(logits[0], int(tokens[i]))
                if self.stop.stop(feats[:i + 1]):
                    k, fed = i + 1, i
                    break
            elif extend is not None and i + 1 < k and len(more := extend(tokens[:i + 1], k - i - 1)):
                n = len(more)
                tokens[i + 1:i + 1 + n] = more
                q[np.arange(i + 1, i + 1 + n), more] = 1.0  # rows past i are still zero
                k, fed = i + 1 + n, i
                break
            if i + 1 < k:
                logits = self._full(self.backend.forward(tokens[i:i + 1], self._cache))
        self._cached = np.concatenate([self._cached, tokens[:fed]])
        self._feats = feats[:k]
        return Draft(tokens=tokens[:k], q=q[:k])

    def accept(self, n_accepted: int, next_token: int) -> None:
        """The stop policy learns from the verdict; `_sync` reconciles the cache at the next propose."""
        if self.stop is not None and len(self._feats):
            self.stop.observe(self._feats, n_accepted)
