"""The Backend seam: one loaded model on one device.

Contract of `forward` (gpt-fast style, position is the KV cursor):
  requires: `cache.length + len(tokens) <= cache.capacity`; tokens are appended at positions
            `cache.length + arange(T)` (or `cache.length + depth` for a tree);
  effect:   the cache holds their K/V and `cache.length` grows by T;
  returns:  float32 logits [T, V], one row per input token.
Rollback is `cache.rollback(n)`: the next forward overwrites positions >= n.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ...models.config import ModelConfig
from ..types import Logits, Mask, Tokens


@dataclass(frozen=True)
class BackendCaps:
    tree_mask: bool = False  # forward accepts a tree mask over the new tokens
    layer_plan: bool = False  # forward accepts a LayerPlan (layer skip / early exit)
    partial_rollback: bool = True  # rollback to any length <= current
    max_batch_tokens: int = 512  # most tokens one forward may take
    max_context: int | None = None  # most positions a cache may hold (None: config.context_length)


@dataclass(frozen=True)
class LayerPlan:
    """Which layers a forward runs: the self-speculative drafters are the same weights run with a plan.

    layers: indices of the layers to run, ascending (None = all).
    exit_layer: stop after this many layers and apply the final norm + LM head (None = run to the end).
    """

    layers: tuple[int, ...] | None = None
    exit_layer: int | None = None

    def resolve(self, n_layers: int) -> tuple[int, ...]:
        layers = tuple(range(n_layers)) if self.layers is None else self.layers
        if any(not 0 <= i < n_layers for i in layers) or list(layers) != sorted(set(layers)):
            raise ValueError(f"layer plan {layers} must be ascending unique indices in [0, {n_layers})")
        if self.exit_layer is not None:
            if not 1 <= self.exit_layer <= n_layers:
                raise ValueError(f"exit_layer {self.exit_layer} must be in [1, {n_layers}]")
            layers = tuple(i for i in layers if i < self.exit_layer)
        return layers


@runtime_checkable
class KVCache(Protocol):
    @property
    def length(self) -> int: ...  # committed positions held

    @property
    def capacity(self) -> int: ...

    def rollback(self, length: int) -> None: ...  # forget positions >= length


@runtime_checkable
class Backend(Protocol):
    name: str
    config: ModelConfig
    caps: BackendCaps

    def new_cache(self, max_len: int) -> KVCache: ...

    def forward(self, tokens: Tokens, cache: KVCache, *, tree_mask: Mask | None = None,
                plan: LayerPlan | None = None) -> Logits: ...

    def weight_bytes(self, plan: LayerPlan | None = None) -> int: ...  # bytes of weights one forward reads


def check_chain_forward(backend: str, tokens: Tokens, cache: KVCache, tree_mask, plan) -> int:
    """The preconditions of a backend that runs chains of the full model only; returns T = len(tokens)."""
    if tree_mask is not None or plan is not None:
        raise ValueError(f"the {backend} backend runs chains of the full model (no tree masks or layer plans)")
    t = len(tokens)
    if t == 0:
        raise ValueError("forward needs at least one token")
    check_room(cache, t)
    return t


def check_room(cache: KVCache, n: int) -> None:
    if cache.length + n > cache.capacity:
        raise ValueError(
            f"context full: {cache.length} cached + {n} new tokens exceeds the cache capacity {cache.capacity}; "
            "shorten the prompt or lower --max-tokens, or raise --ctx")
