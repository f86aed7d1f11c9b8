"""The Drafter seam (llama.cpp common/speculative.h lifecycle): begin / propose / accept.

begin(prompt):                 a new sequence starts with these tokens.
propose(context, k, rng):      requires: context = every committed token (prompt + output);
                               returns: a Draft of at most k tokens continuing it (k may be 0).
accept(n_accepted, next_token): the target kept the first n_accepted draft tokens and then emitted
                               next_token; the drafter updates whatever state it keeps.
bind(target, cache)            optional; called once per sequence before begin: self-speculative drafters run the
                               target's own weights (a LayerPlan) and write draft K/V into the target's cache past
                               its length. They must leave cache.length as they found it (the verify forward then
                               overwrites those rows).
Tree drafters (TreeDrafter) have `propose_tree(context, max_nodes, rng) -> TreeDraft` and `max_nodes` instead of
`propose`; the decode loop runs them with tree rounds (runtime/decode.py tree_step) on backends with tree masks.
observe(tokens, logits)        optional; called after every target forward with the fed tokens [T] and their
                               logits [T, V] (token recycling learns from them).
verify_taps, observe_verify    optional (a drafter with a non-empty `verify_taps` on a LayeredBackend target): the
                               decode step runs its verify forward as hidden(..., taps=verify_taps) and calls
                               observe_verify({n: h [T, D] after n layers}, emitted tokens) before accept; DEL's
                               shadow tokens. Plain decoding and other drafters keep the plain forward.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from ..tree import TreeDraft
from ..types import Draft, Tokens


@runtime_checkable
class Drafter(Protocol):
    name: str
    weight_bytes_per_token: int  # bytes of weights one drafted token reads (0 for n-gram); for MBSU

    def begin(self, prompt: Tokens) -> None: ...

    def propose(self, context: Tokens, k: int, rng: np.random.Generator) -> Draft: ...

    def accept(self, n_accepted: int, next_token: int) -> None: ...


@runtime_checkable
class TreeDrafter(Protocol):
    name: str
    weight_bytes_per_token: int
    max_nodes: int  # the largest tree it proposes (the decode loop reserves that much cache room)

    def begin(self, prompt: Tokens) -> None: ...

    def propose_tree(self, context: Tokens, max_nodes: int, rng: np.random.Generator) -> TreeDraft: ...

    def accept(self, n_accepted: int, next_token: int) -> None: ...
