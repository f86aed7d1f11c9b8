"""RoPE tables: which rotary embedding each layer runs, and its inverse frequencies and angles.

Every implementation (runtime/backends/numpy_ref.py, the ONNX builders in export/) takes its tables from here, so
a scaling rule is written once. Angles are float64 (positions x inverse frequencies), cast by the caller.

A layer's RoPE (`layer_rope`): none when its LayerSpec says rope=False; a base of its own, unscaled, when it names
rope_theta; else the config's rope_theta with the config's rope_scaling. Rotation is HF rotate_half over the first
`dim` dims of each head (dim = head_dim unless the block declares a rotary fraction).

LongRoPE ("su", phi3): each inverse frequency is divided by a per-frequency factor, `long_factor` when the runtime is
opened with more positions than the model's original context, else `short_factor` -- the rule of llama.cpp's
llama_model::get_rope_factors (n_ctx_seq > n_ctx_orig_yarn ? rope_long : rope_short), decided once per context so
every cached key was rotated like the query reading it. Our runtime's context is `ModelConfig.context_length` (NumPy
and ONNX tables are built for it), so a llama.cpp backend matches when opened with an n_ctx on the same side of
`original_context` (its default n_ctx = context_length is; llama.cpp rounds n_ctx up to a multiple of 256 first, so
contexts that are multiples of 256, as real checkpoints' are, compare alike). transformers instead switches per
forward call by the largest position (> original: long), which agrees whenever a call's positions pass the original
context.
`attn_factor` multiplies cos and sin (llama.cpp's rope attn_factor, transformers' attention_scaling), whatever set
of factors is chosen.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .block import UnsupportedVariant
from .config import ModelConfig, RopeScaling

# what inv_freq computes; "yarn" is declared only
SCALING_KINDS = ("none", "linear", "llama3", "freq_factors", "longrope")


@dataclass(frozen=True)
class Rope:
    """One rotary table: base, scaling and rotated dims per head (hashable: builders key their tables by it)."""

    theta: float
    scaling: RopeScaling
    dim: int
    context: int = 0  # longrope: the positions the runtime is opened with (picks long or short factors); else 0


def default_rope(cfg: ModelConfig) -> Rope:
    """The config's own RoPE (the one every llama / qwen2 layer runs)."""
    context = cfg.context_length if cfg.rope_scaling.kind == "longrope" else 0
    return Rope(float(cfg.rope_theta), cfg.rope_scaling, rotary_dim(cfg), context)


def rotary_dim(cfg: ModelConfig) -> int:
    """Rotated dims per head: head_dim times the block's rotary fraction, rounded down to an even number."""
    return int(cfg.head_dim * cfg.block.rotary_fraction) // 2 * 2


def layer_rope(cfg: ModelConfig, i: int) -> Rope | None:
    """Layer i's RoPE, or None when the layer has no position encoding."""
    lay = cfg.block.layer(i)
    if not lay.rope:
        return None
    if lay.rope_theta is not None:
        return Rope(float(lay.rope_theta), RopeScaling(), rotary_dim(cfg))
    return default_rope(cfg)


def distinct_ropes(cfg: ModelConfig) -> tuple[Rope, ...]:
    """The RoPEs the model's layers run, the config's own first (when any layer runs it), then in layer order;
    a rope's index here names its tables in a graph (`table_name`)."""
    own, used = default_rope(cfg), [layer_rope(cfg, i) for i in range(cfg.n_layers)]
    out: list[Rope] = [own] if own in used else []
    for r in used:
        if r is not None and r not in out:
            out.append(r)
    return tuple(out)


def table_name(cfg: ModelConfig, rope: Rope, kind: str) -> str:
    """Initializer name of a cos/sin table: "rope.cos" for the config's own RoPE, "rope.<n>.cos" for others."""
    n = distinct_ropes(cfg).index(rope)
    return f"rope.{kind}" if rope == default_rope(cfg) else f"rope.{n}.{kind}"


def inv_freq(rope: Rope) -> np.ndarray:
    """[dim/2] float64 inverse frequencies, with linear or llama3 scaling applied."""
    dim = rope.dim
    inv = 1.0 / (rope.theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    rs = rope.scaling
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
    elif rs.kind == "freq_factors":
        # llama.cpp's rope_freqs tensor (llama3 GGUFs): ggml_rope_ext divides each frequency by its factor
        if len(rs.freq_factors) != len(inv):
            raise ValueError(f"RoPE freq_factors has {len(rs.freq_factors)} values; {len(inv)} frequencies rotate")
        inv = inv / np.asarray(rs.freq_factors, np.float64) / rs.factor
    elif rs.kind == "longrope":
        factors = np.asarray(longrope_factors(rs, rope.context), np.float64)
        if factors.shape != inv.shape:
            raise ValueError(f"longrope factors have {factors.size} entries; the rotary dim {dim} needs {inv.size}")
        inv = inv / factors
    elif rs.kind != "none":
        raise UnsupportedVariant(f"RoPE scaling {rs.kind!r} is not built by specedge (supported: "
                                 f"{', '.join(SCALING_KINDS)}); use a model without it or the llama.cpp backend")
    return inv


def longrope_factors(rs: RopeScaling, context: int) -> tuple[float, ...]:
    """LongRoPE's divisors for a runtime of `context` positions: long_factor beyond the original context, else
    short_factor (module docstring)."""
    return rs.long_factor if context > rs.original_context else rs.short_factor


def cos_sin(rope: Rope, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([N, dim/2], [N, dim/2]) float64 cos and sin tables for integer positions [N], times the attention factor."""
    a = angles(rope, positions)
    return np.cos(a) * rope.scaling.attn_factor, np.sin(a) * rope.scaling.attn_factor


def angles(rope: Rope, positions: np.ndarray) -> np.ndarray:
    """[N, dim/2] float64 rotation angles for integer positions [N]."""
    return np.asarray(positions).astype(np.float64)[:, None] * inv_freq(rope)[None, :]


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """The config's own RoPE inverse frequencies [rotary_dim/2] (float64)."""
    return inv_freq(default_rope(cfg))
