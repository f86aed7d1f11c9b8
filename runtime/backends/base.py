"""The Backend seam: one loaded model on one device.

Contract of `forward` (gpt-fast style, position is the KV cursor):
  requires: `cache.length + len(tokens) <= cache.capacity`; tokens are appended at cache slots
            `cache.length + arange(T)`; their RoPE positions are the same for a chain, and
            `cache.length + depth` for a tree (tree_mask [T, T]: mask[i, j] = j is i or an ancestor of i, nodes in
            BFS order, node 0 the root; depth[i] = mask[i].sum() - 1, see `tree_depths`);
  effect:   the cache holds their K/V and `cache.length` grows by T;
  returns:  float32 logits [T, V], one row per input token.
Rollback is `cache.rollback(n)`: the next forward overwrites positions >= n. After a tree forward,
`cache.compact(src, dst_start)` moves the accepted path's rows (absolute slots `src`, ascending) to
dst_start, dst_start + 1, ... and sets the length after them.

Backends with `caps.layer_plan` also implement `LayeredBackend`: hidden states after any layer (taps) and the
final norm + LM head on hidden states, optionally restricted to a subset of vocabulary rows (VocabTrim). The
self-speculative drafters (layer skip, early exit, DEL, LoRA-Drop) are built on those two calls and share the
target's KV cache (the Drafter's optional `bind`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from ...models.config import ModelConfig
from ..types import Logits, Mask, Tokens


@dataclass(frozen=True)
class Variance:
    """Why a backend's verify batches may round differently from its one-token calls here, and the fix: what it
    declares in caps.variance (None there: batch-invariant), so nothing above probes an engine for it. Said as
    '<file> <why>, so greedy speculative output may differ from plain greedy; <fix>' (warning)."""

    why: str  # after the model's file name: "runs on the GPU (llama.cpp, --gpu-layers): GPU kernels are chosen by ..."
    fix: str  # what makes it exact: "--gpu-layers 0 runs it on the CPU"

    def warning(self, model: str) -> str:
        return f"{model} {self.why}, so greedy speculative output may differ from plain greedy; {self.fix}"


def gpu_variance(engine: str) -> Variance:
    """A llama.cpp engine with layers on a GPU: its kernels are chosen by batch width."""
    return Variance(f"runs on the GPU ({engine}, --gpu-layers): GPU kernels are chosen by batch width",
                    "--gpu-layers 0 runs it on the CPU")


def fast_kernels_variance(engine: str, kernels: str) -> Variance:
    """An engine opened with its faster plain-decoding kernels (registry Kernels.FAST_PLAIN_ONLY)."""
    return Variance(f"was opened for plain decoding ({engine} {kernels}): its verify batches round differently from "
                    "one-token calls", "run with --drafter (or --no-plan) to open it for speculation")


def gate_variance(engine: str, threads: int) -> Variance:
    """A gated engine whose per-file gate probe found batches differing from one-token calls at these threads."""
    return Variance(f"on {engine} is not batch-invariant here (its gate found verify batches rounding differently "
                    f"from one-token calls at {threads} thread{'s' if threads > 1 else ''})",
                    "--backend llamacpp --threads 1 is exact")


@dataclass(frozen=True)
class BackendCaps:
    tree_mask: bool = False  # forward accepts a tree mask over the new tokens
    layer_plan: bool = False  # forward accepts a LayerPlan (layer skip / early exit)
    layer_reuse: bool = False  # ... including LoRA-Drop drop steps (LayerPlan.reuse)
    partial_rollback: bool = True  # rollback to any length <= current
    max_batch_tokens: int = 512  # most tokens one forward may take
    max_context: int | None = None  # most positions a cache may hold (None: config.context_length)
    tree_inputs: bool | None = None  # forward takes a tree mask at all, for draft forwards (None: same as tree_mask);
    #                                  an int8-activation ONNX graph takes one but may not verify trees losslessly
    tree_hint: str | None = None  # why tree_mask is False and what to do (shown by require_tree)
    reuse_hint: str | None = None  # why layer_reuse is False and what to do (shown by require_reuse)
    variance: Variance | None = None  #   None: batch-invariant (a verify batch's logits equal one-token calls' at
    #                                     every cache length, so greedy speculation is token-identical to plain);
    #                                     else why not here and the fix (llama.cpp: exact only with 1 thread)
    own_tokenizer: bool = False  # the engine tokenizes itself: a TokenizingBackend (llama.cpp), the fallback for
    #                              files whose tokenizer or architecture our code does not build
    layer_hint: str | None = None  # why layer plans cannot run and what to do (shown by require_layered)

    @property
    def batch_invariant(self) -> bool:
        return self.variance is None

    @property
    def draft_trees(self) -> bool:
        """Whether draft forwards may pass a tree mask (a dynamic draft tree's waves)."""
        return self.tree_mask if self.tree_inputs is None else self.tree_inputs


@dataclass(frozen=True, eq=False)
class LowRankReuse:
    """A drop-step replacement for one layer (LoRA-Drop, docs/algorithms.md 2.5).

    The layer's "output" is the residual delta it adds (block(h) - h). On a drop step the layer adds
    `anchor + scale * (h @ a.T) @ b.T` instead: no attention, no MLP, no KV write (the layer's cache rows at
    these slots are marked missing, so later queries of that layer do not attend to them).
    anchor: [D] the layer's delta at the cycle's most recent refresh step; a: [r, D]; b: [D, r] (r = 0: pure reuse).
    """

    layer: int
    anchor: np.ndarray  # [D]
    a: np.ndarray  # [r, D]
    b: np.ndarray  # [D, r]
    scale: float = 1.0

    def delta(self, h: np.ndarray) -> np.ndarray:
        """[T, D] -> [T, D]: what the layer adds to the residual stream on a drop step."""
        if self.a.shape[0] == 0:
            return np.broadcast_to(self.anchor, h.shape).astype(h.dtype)
        return (self.anchor + self.scale * ((h @ self.a.T) @ self.b.T)).astype(h.dtype)


@dataclass(frozen=True)
class LayerPlan:
    """Which layers a forward runs: the self-speculative drafters are the same weights run with a plan.

    layers: indices of the layers to run, ascending (None = all).
    exit_layer: stop after this many layers and apply the final norm + LM head (None = run to the end).
    reuse: layers replaced by a low-rank drop step (LoRA-Drop); each must be one of the planned layers.
    """

    layers: tuple[int, ...] | None = None
    exit_layer: int | None = None
    reuse: tuple[LowRankReuse, ...] = ()

    def resolve(self, n_layers: int) -> tuple[int, ...]:
        layers = tuple(range(n_layers)) if self.layers is None else self.layers
        if any(not 0 <= i < n_layers for i in layers) or list(layers) != sorted(set(layers)):
            raise ValueError(f"layer plan {layers} must be ascending unique indices in [0, {n_layers})")
        if self.exit_layer is not None:
            if not 1 <= self.exit_layer <= n_layers:
                raise ValueError(f"exit_layer {self.exit_layer} must be in [1, {n_layers}]")
            layers = tuple(i for i in layers if i < self.exit_layer)
        bad = [r.layer for r in self.reuse if r.layer not in layers]
        if bad:
            raise ValueError(f"reused layers {bad} are not in the plan's layers {layers}: a drop step replaces a "
                             "layer that the plan runs")
        return layers


@runtime_checkable
class Cache(Protocol):
    """What a backend's KV cache offers the decode loop (runtime/kv.py KVCache is the NumPy one; the ONNX and
    llama.cpp backends have their own): the position is the only cursor, rollback sets it."""

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

    def new_cache(self, max_len: int) -> Cache: ...

    def forward(self, tokens: Tokens, cache: Cache, *, tree_mask: Mask | None = None,
                plan: LayerPlan | None = None) -> Logits: ...

    def weight_bytes(self, plan: LayerPlan | None = None) -> int: ...  # bytes of weights one forward reads


@runtime_checkable
class LayeredBackend(Backend, Protocol):
    """A backend that runs layer plans and exposes hidden states (caps.layer_plan)."""

    def hidden(self, tokens: Tokens, cache: Cache, *, plan: LayerPlan | None = None,
               tree_mask: Mask | None = None, taps: tuple[int, ...] = ()) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        """Run the plan's layers over tokens appended at cache.length (cache.length grows by T, like forward).
        Returns (h [T, D] after the last planned layer, before the final norm; {n: h [T, D] after the first n
        layers of the full model, for n in taps}); a tap the plan does not reach is absent."""
        ...

    def logits_from_hidden(self, h: np.ndarray, rows: np.ndarray | None = None) -> Logits:
        """Final norm + LM head: [T, D] -> float32 logits [T, V], or [T, len(rows)] over those vocabulary rows."""
        ...


@runtime_checkable
class FeedingBackend(Backend, Protocol):
    """A backend that can append tokens without returning their logits (llama.cpp engines): each logits row costs
    it a vocabulary-sized matmul, and ik_llama.cpp clears its whole output buffer, sized by the largest call
    it has served, on every later call (a 512-row prompt call left SmolLM2 1 ms of memset per token)."""

    def feed(self, tokens: Tokens, cache: Cache) -> None:
        """Like forward (the cache holds the tokens' K/V and grows by T), returning nothing."""
        ...


def feed(backend: Backend, tokens: Tokens, cache: Cache) -> None:
    """Append tokens whose logits nobody reads (a prompt's prefill, a probe's prefix): the backend's `feed` where
    it has one, else a forward whose logits are dropped."""
    if isinstance(backend, FeedingBackend):
        backend.feed(tokens, cache)
    else:
        backend.forward(tokens, cache)


@runtime_checkable
class TokenizingBackend(Backend, Protocol):
    """A backend that tokenizes with its own engine (caps.own_tokenizer): llama.cpp."""

    def tokenizer(self, chat_template: str | None, merges: Sequence[str]):
        """A runtime.tokenizer.TextTokenizer over the engine's vocabulary; chat_template and merges from the file
        (None: ChatML; merges go into the fingerprint)."""
        ...


def tree_depths(tree_mask: Mask) -> np.ndarray:
    """depth[i] = number of strict ancestors of node i (row sums of the ancestor-or-self mask, minus one)."""
    return np.asarray(tree_mask, dtype=bool).sum(axis=1).astype(np.int64) - 1


def require_tree(backend: Backend) -> None:
    """Start-up check for tree drafters and tree verification (STYLE principle 10): the target must take tree masks.
    A backend may explain its own refusal in caps.tree_hint (onnxrt: re-export old artifacts)."""
    if not backend.caps.tree_mask:
        hint = backend.caps.tree_hint or "use a chain drafter, or a backend with tree masks (numpy)"
        raise ValueError(f"the {backend.name} backend cannot verify token trees: {hint}")


def check_chain_forward(backend: str, tokens: Tokens, cache: Cache, tree_mask, plan) -> int:
    """The preconditions of a backend that runs chains of the full model only; returns T = len(tokens)."""
    if tree_mask is not None or plan is not None:
        raise ValueError(f"the {backend} backend runs chains of the full model (no tree masks or layer plans)")
    t = len(tokens)
    if t == 0:
        raise ValueError("forward needs at least one token")
    check_room(cache, t)
    return t


def check_capacity(config: ModelConfig, max_len: int) -> None:
    """A new cache may not hold more positions than the model's context (the RoPE tables of exported graphs end
    there)."""
    if max_len > config.context_length:
        raise ValueError(f"a cache of {max_len} positions exceeds the model's context {config.context_length}"
                         " (the RoPE tables end there); lower --ctx")


def check_room(cache: Cache, n: int) -> None:
    if cache.length + n > cache.capacity:
        raise ValueError(
            f"context full: {cache.length} cached + {n} new tokens exceeds the cache capacity {cache.capacity}; "
            "shorten the prompt or lower --max-tokens, or raise --ctx")


def probe_batch_invariance(backend: Backend, widths: Sequence[int], prefixes: Sequence[int], seed: int = 0) -> bool:
    """The batch-invariance probe the per-file gate runs (assembly/engine_gate.py): after each prefix of random
    tokens, does a w-token call give, bit for bit, the logits of w one-token calls at the same positions, for every w
    in `widths`? A prefix that does not fit the backend's context (caps.max_context) is skipped."""
    rng = np.random.default_rng(seed)
    V, room = backend.config.vocab_size, backend.caps.max_context
    for plen in prefixes:
        if room is not None and plen + max(widths) > room:
            continue
        prefix = rng.integers(1, V - 1, plen).astype(np.int32)
        cache = backend.new_cache(plen + max(widths))
        if plen:
            feed(backend, prefix, cache)
        for w in widths:
            toks = rng.integers(1, V - 1, w).astype(np.int32)
            together = backend.forward(toks, cache)
            cache.rollback(plen)
            apart = np.concatenate([backend.forward(toks[i:i + 1], cache) for i in range(w)])
            cache.rollback(plen)
            if not np.array_equal(together, apart):
                return False
    return True
