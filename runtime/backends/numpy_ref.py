"""Pure-NumPy reference transformer (llama / qwen2 families): the ground truth the other backends are checked against.

float32 by default; float64 for exactness tests. Runs any subset of layers and exits early at any
layer (LayerPlan), and takes a tree mask, because the self-speculative drafters build on that.
"""
from __future__ import annotations

import numpy as np

from ...models.config import ModelConfig, RopeScaling, Weights
from ..kv import KVCache
from ..types import Logits, Mask, Tokens
from .base import BackendCaps, LayerPlan, check_room, tree_depths


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """[head_dim/2] inverse frequencies, with linear or llama3 scaling applied."""
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    rs: RopeScaling = cfg.rope_scaling
    if rs.kind == "linear":
        inv = inv / rs.factor
    elif rs.kind == "llama3":
        # Meta's llama3 rule: long wavelengths scaled by factor, short kept, smooth blend between.
        low_wl = rs.original_context / rs.low_freq_factor
        high_wl = rs.original_context / rs.high_freq_factor
        wl = 2 * np.pi / inv
        smooth = (rs.original_context / wl - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
        blended = (1 - smooth) * inv / rs.factor + smooth * inv
        inv = np.where(wl > low_wl, inv / rs.factor, np.where(wl < high_wl, inv, blended))
    elif rs.kind != "none":
        raise ValueError(f"RoPE scaling {rs.kind!r} is not supported by the NumPy backend (supported: none, linear, "
                         "llama3); use a model without it or the llama.cpp backend")
    return inv


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """HF rotate_half RoPE. x: [heads, T, hd]; cos, sin: [T, hd/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    var = np.mean(np.square(x), axis=-1, keepdims=True)
    return x / np.sqrt(var + eps) * w


def attention_mask(length: int, t: int, tree_mask: Mask | None) -> np.ndarray:
    """[t, length + t] boolean: every new token sees the whole committed cache, then causal (or the tree)."""
    new = np.tril(np.ones((t, t), dtype=bool)) if tree_mask is None else np.asarray(tree_mask, dtype=bool)
    if new.shape != (t, t):
        raise ValueError(f"tree mask has shape {new.shape}, expected {(t, t)}")
    return np.concatenate([np.ones((t, length), dtype=bool), new], axis=1)


class NumpyBackend:
    """caps: tree masks, layer plans, any rollback."""

    name = "numpy"
    caps = BackendCaps(tree_mask=True, layer_plan=True, layer_reuse=True, partial_rollback=True,
                       max_batch_tokens=4096)

    def __init__(self, weights: Weights, dtype=np.float32) -> None:
        self.config = weights.config
        self.dtype = np.dtype(dtype)
        cast = (lambda a: a) if self.dtype == np.float32 else (lambda a: a.astype(self.dtype))
        self._w = {name: cast(t) for name, t in weights.tensors.items()}
        self._lm_head = self._w["embed"] if self.config.tied_embeddings else self._w["lm_head"]
        self._inv_freq = rope_inv_freq(self.config)
        self._layer_bytes = [sum(int(t.nbytes) for n, t in self._w.items() if n.startswith(f"layers.{i}."))
                             for i in range(self.config.n_layers)]

    def new_cache(self, max_len: int) -> KVCache:
        c = self.config
        return KVCache(c.n_layers, c.n_kv_heads, c.head_dim, max_len, dtype=self.dtype)

    def weight_bytes(self, plan: LayerPlan | None = None) -> int:
        plan = plan or LayerPlan()
        layers, reused = plan.resolve(self.config.n_layers), {r.layer for r in plan.reuse}
        row_bytes = self._lm_head.nbytes // self._lm_head.shape[0]  # the embedding read is one row per token
        low_rank = sum(int(r.a.nbytes + r.b.nbytes) for r in plan.reuse)
        return (sum(self._layer_bytes[i] for i in layers if i not in reused) + low_rank + int(self._lm_head.nbytes)
                + row_bytes)

    def forward(self, tokens: Tokens, cache: KVCache, *, tree_mask: Mask | None = None,
                plan: LayerPlan | None = None) -> Logits:
        """Logits [T, V] for tokens appended at cache.length (RoPE positions cache.length + arange(T), or + depth
        for a tree)."""
        h, _ = self.hidden(tokens, cache, plan=plan, tree_mask=tree_mask)
        return self.logits_from_hidden(h)

    def logits_from_hidden(self, h: np.ndarray, rows: np.ndarray | None = None) -> Logits:
        """Final norm + LM head: [T, D] -> float32 logits [T, V] (or [T, len(rows)] over those vocabulary rows)."""
        x = rms_norm(h, self._w["norm"], self.config.rms_eps)
        head = self._lm_head if rows is None else self._lm_head[np.asarray(rows, dtype=np.int64)]
        return np.asarray(x @ head.T, dtype=np.float32)

    def hidden(self, tokens: Tokens, cache: KVCache, *, plan: LayerPlan | None = None,
               tree_mask: Mask | None = None, taps: tuple[int, ...] = ()) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        """(h after the plan's last layer, {n: h after the first n layers}) for tokens appended at cache.length;
        the planned layers write their K/V and cache.length grows by T (LayeredBackend)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        t = int(tokens.shape[0])
        if t == 0:
            raise ValueError("forward needs at least one token")
        check_room(cache, t)
        c = self.config
        plan = plan or LayerPlan()
        layers = plan.resolve(c.n_layers)
        depth = np.arange(t) if tree_mask is None else tree_depths(tree_mask)
        angles = (cache.length + depth).astype(np.float64)[:, None] * self._inv_freq[None, :]
        cos, sin = np.cos(angles).astype(self.dtype), np.sin(angles).astype(self.dtype)
        mask = attention_mask(cache.length, t, tree_mask)
        h = self._w["embed"][tokens]
        tapped = {0: h} if 0 in taps else {}
        reuse = {r.layer: r for r in plan.reuse}
        for i in layers:
            if i in reuse:  # LoRA-Drop drop step: a low-rank delta, no attention, no KV write
                cache.skip(i, t)
                h = h + reuse[i].delta(h)
            else:
                h = self._block(i, h, cos, sin, mask, cache)
            if i + 1 in taps:
                tapped[i + 1] = h
        cache.advance(t)
        return h, tapped

    def _block(self, i: int, h: np.ndarray, cos, sin, mask, cache: KVCache) -> np.ndarray:
        c, w, p = self.config, self._w, f"layers.{i}."
        t = h.shape[0]
        x = rms_norm(h, w[p + "attn_norm"], c.rms_eps)
        q, k, v = x @ w[p + "q"].T, x @ w[p + "k"].T, x @ w[p + "v"].T
        if c.qkv_bias:
            q, k, v = q + w[p + "q_bias"], k + w[p + "k_bias"], v + w[p + "v_bias"]
        q = apply_rope(q.reshape(t, c.n_heads, c.head_dim).transpose(1, 0, 2), cos, sin)  # [H, T, hd]
        k = apply_rope(k.reshape(t, c.n_kv_heads, c.head_dim).transpose(1, 0, 2), cos, sin)  # [KV, T, hd]
        v = v.reshape(t, c.n_kv_heads, c.head_dim).transpose(1, 0, 2)
        cache.write(i, k, v)
        keys, values = cache.view(i, t)  # [KV, S, hd]
        q = q.reshape(c.n_kv_heads, c.group * t, c.head_dim)  # query heads grouped under their KV head
        scores = (q @ keys.transpose(0, 2, 1)) * self.dtype.type(1.0 / np.sqrt(c.head_dim))  # [KV, G*T, S]
        scores = scores.reshape(c.n_kv_heads, c.group, t, -1)
        hole = cache.absent[i, :scores.shape[-1]]
        scores = np.where(mask & ~hole if hole.any() else mask, scores, -np.inf)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = (scores / scores.sum(axis=-1, keepdims=True)).reshape(c.n_kv_heads, c.group * t, -1)
        attn = (probs @ values).reshape(c.n_heads, t, c.head_dim).transpose(1, 0, 2).reshape(t, -1)
        h = h + attn @ w[p + "o"].T
        x = rms_norm(h, w[p + "ffn_norm"], c.rms_eps)
        gate = x @ w[p + "gate"].T
        return h + ((gate / (1.0 + np.exp(-gate))) * (x @ w[p + "up"].T)) @ w[p + "down"].T
