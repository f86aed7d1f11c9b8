"""Pure-NumPy reference transformer: the ground truth the other backends are checked against.

It builds the block the model's config declares (models/block.py: norms and their placement, q/k norms, RoPE per
layer from models/rope.py, sliding windows, activation, biases, fused tensors, embedding scale).
float32 by default; float64 for exactness tests. Runs any subset of layers and exits early at any
layer (LayerPlan), and takes a tree mask, because the self-speculative drafters build on that.
"""
from __future__ import annotations

import numpy as np

from ...models import rope as rope_tables
from ...models.block import Activation
from ...models.config import Weights
from ..kv import KVCache
from ..types import Logits, Mask, Tokens
from .base import BackendCaps, LayerPlan, check_room, tree_depths


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """HF rotate_half RoPE over the first 2 * cos.shape[-1] dims (the rest pass through). x: [heads, T, hd];
    cos, sin: [T, rot/2]."""
    half = cos.shape[-1]
    if 2 * half != x.shape[-1]:  # partial rotary
        return np.concatenate([apply_rope(x[..., :2 * half], cos, sin), x[..., 2 * half:]], axis=-1)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w; `w` is the multiplier (BlockSpec.norm_scale of the stored weight)."""
    var = np.mean(np.square(x), axis=-1, keepdims=True)
    return x / np.sqrt(var + eps) * w


def linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [T, in] @ w[out, in].T, computed as (w @ x.T).T: BLAS then packs the weights as its left operand, which
    at a few rows takes half the time of x @ w.T's packing (SmolLM2's MLP matrices at 5 rows: 0.34 -> 0.17 ms; its
    tied head at 300 rows: 267 -> 94 ms; 2 threads). Measured on this project's AMD EPYC with NumPy's OpenBLAS: the
    same float32 bits as x @ w.T at 1-300 rows, so the reference's outputs did not change with it."""
    return (w @ x.T).T


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    # the constant in x's dtype: a float64 NumPy scalar would promote float32 activations to float64 (NEP 50), and
    # every later matmul would then convert its float32 weights (gemma3-270m: 3 s a token for the tied head)
    c = x.dtype.type(np.sqrt(2.0 / np.pi))
    return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x ** 3)))


def attention_mask(length: int, t: int, tree_mask: Mask | None) -> np.ndarray:
    """[t, length + t] boolean: every new token sees the whole committed cache, then causal (or the tree)."""
    new = np.tril(np.ones((t, t), dtype=bool)) if tree_mask is None else np.asarray(tree_mask, dtype=bool)
    if new.shape != (t, t):
        raise ValueError(f"tree mask has shape {new.shape}, expected {(t, t)}")
    return np.concatenate([np.ones((t, length), dtype=bool), new], axis=1)


def window_mask(mask: np.ndarray, length: int, positions: np.ndarray, window: int) -> np.ndarray:
    """`mask` [t, length + t] restricted to keys less than `window` positions behind the query: committed slot s
    holds position s, new token j position positions[j] (a tree's depth-based positions included)."""
    keys = np.concatenate([np.arange(length), positions])
    return mask & (positions[:, None] - keys[None, :] < window)


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
        spec = self.config.block
        for name in self._w:
            if name.endswith("norm"):  # every norm weight becomes the multiplier its norm applies
                self._w[name] = spec.norm_scale(self._w[name])
        self._rope = [rope_tables.layer_rope(self.config, i) for i in range(self.config.n_layers)]
        self._inv_freq = {r: rope_tables.inv_freq(r) for r in rope_tables.distinct_ropes(self.config)}
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
        return np.asarray(linear(x, head), dtype=np.float32)

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
        positions = cache.length + depth
        tables = {}
        for r, inv in self._inv_freq.items():
            angles = positions.astype(np.float64)[:, None] * inv[None, :]
            m = r.scaling.attn_factor  # cos and sin scaled as models/rope.cos_sin scales them (1.0: exact)
            tables[r] = ((np.cos(angles) * m).astype(self.dtype), (np.sin(angles) * m).astype(self.dtype))
        mask = attention_mask(cache.length, t, tree_mask)
        masks = {None: mask, **{w: window_mask(mask, cache.length, positions, w) for w in c.block.windows()}}
        h = self._w["embed"][tokens]
        if c.block.embed_scale != 1.0:
            h = h * self.dtype.type(c.block.embed_scale)
        tapped = {0: h} if 0 in taps else {}
        reuse = {r.layer: r for r in plan.reuse}
        for i in layers:
            if i in reuse:  # LoRA-Drop drop step: a low-rank delta, no attention, no KV write
                cache.skip(i, t)
                h = h + reuse[i].delta(h)
            else:
                h = self._block(i, h, tables, masks, cache)
            if i + 1 in taps:
                tapped[i + 1] = h
        cache.advance(t)
        return h, tapped

    def _block(self, i: int, h: np.ndarray, tables: dict, masks: dict, cache: KVCache) -> np.ndarray:
        """One block as the config declares it (models/block.py); writes layer i's K/V."""
        c, spec, w, p = self.config, self.config.block, self._w, f"layers.{i}."
        t = h.shape[0]
        x = rms_norm(h, w[p + "attn_norm"], c.rms_eps)
        q, k, v = self._qkv(p, x)
        q = q.reshape(t, c.n_heads, c.head_dim).transpose(1, 0, 2)  # [H, T, hd]
        k = k.reshape(t, c.n_kv_heads, c.head_dim).transpose(1, 0, 2)  # [KV, T, hd]
        v = v.reshape(t, c.n_kv_heads, c.head_dim).transpose(1, 0, 2)
        if spec.qk_norm:
            q, k = rms_norm(q, w[p + "q_norm"], c.rms_eps), rms_norm(k, w[p + "k_norm"], c.rms_eps)
        if self._rope[i] is not None:
            cos, sin = tables[self._rope[i]]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        cache.write(i, k, v)
        keys, values = cache.view(i, t)  # [KV, S, hd]
        q = q.reshape(c.n_kv_heads, c.group * t, c.head_dim)  # query heads grouped under their KV head
        scores = (q @ keys.transpose(0, 2, 1)) * self.dtype.type(1.0 / np.sqrt(c.head_dim))  # [KV, G*T, S]
        scores = scores.reshape(c.n_kv_heads, c.group, t, -1)
        mask = masks[spec.layer(i).window]
        hole = cache.absent[i, :scores.shape[-1]]
        scores = np.where(mask & ~hole if hole.any() else mask, scores, -np.inf)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = (scores / scores.sum(axis=-1, keepdims=True)).reshape(c.n_kv_heads, c.group * t, -1)
        attn = (probs @ values).reshape(c.n_heads, t, c.head_dim).transpose(1, 0, 2).reshape(t, -1)
        a = linear(attn, w[p + "o"])
        if spec.o_bias:
            a = a + w[p + "o_bias"]
        if spec.post_norms:
            a = rms_norm(a, w[p + "post_attn_norm"], c.rms_eps)
        h = h + a
        x = rms_norm(h, w[p + "ffn_norm"], c.rms_eps)
        m = self._mlp(p, x)
        if spec.post_norms:
            m = rms_norm(m, w[p + "post_ffn_norm"], c.rms_eps)
        return h + m

    def _qkv(self, p: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q [T, H*hd], k, v [T, KV*hd], biases added."""
        c, spec, w = self.config, self.config.block, self._w
        if spec.fused_qkv:
            qkv = linear(x, w[p + "qkv"])
            if spec.qkv_bias:
                qkv = qkv + w[p + "qkv_bias"]
            return tuple(np.split(qkv, [c.n_heads * c.head_dim, (c.n_heads + c.n_kv_heads) * c.head_dim], axis=-1))
        q, k, v = linear(x, w[p + "q"]), linear(x, w[p + "k"]), linear(x, w[p + "v"])
        if spec.qkv_bias:
            q, k, v = q + w[p + "q_bias"], k + w[p + "k_bias"], v + w[p + "v_bias"]
        return q, k, v

    def _mlp(self, p: str, x: np.ndarray) -> np.ndarray:
        """down(act(gate) * up) with the declared activation."""
        spec, w = self.config.block, self._w
        if spec.fused_gate_up:
            gate, up = np.split(linear(x, w[p + "gate_up"]), 2, axis=-1)
        else:
            gate, up = linear(x, w[p + "gate"]), None
        act = gate / (1.0 + np.exp(-gate)) if spec.activation is Activation.SILU else gelu_tanh(gate)
        return linear(act * (linear(x, w[p + "up"]) if up is None else up), w[p + "down"])
