"""The transformer block a family declares, once: the NumPy reference and every ONNX profile build from it.

    h ─► norm ─► attention (q/k norm, RoPE of the layer, window of the layer) ─(post norm)─► + h
      ─► norm ─► MLP (activation) ─(post norm)─► + h ─► next block

`BlockSpec` says which variant of each step a model runs; `ModelConfig.block` carries it (models/config.py holds the
sizes and the main RoPE base and scaling; models/rope.py turns both into tables). A family module declares its
`BLOCK` and refines it per checkpoint (a llama file with q/k/v biases, a per-layer window pattern). A builder that
cannot emit a declared variant raises `UnsupportedVariant` naming the field, at build time (`require`).

Canonical tensor names per variant (`layer_tensors`): q_norm/k_norm [head_dim], post_attn_norm/post_ffn_norm [D],
o_bias [D], fused qkv [(H + 2 KV) hd, D] (+ qkv_bias) instead of q/k/v, fused gate_up [2F, D] (gate rows first).
"""
from __future__ import annotations

import enum
import numbers
from dataclasses import asdict, dataclass
from typing import Any, Mapping

import numpy as np


class UnsupportedVariant(NotImplementedError, ValueError):
    """A declared block variant that this builder or backend does not emit (a ValueError too, so the CLI's clear
    error path reports it)."""


class Norm(enum.Enum):
    RMS = "rms"  # x / sqrt(mean(x^2) + eps) * w
    RMS_PLUS_ONE = "rms_plus_one"  # ... * (1 + w): gemma stores the weight minus one


class Activation(enum.Enum):
    SILU = "silu"  # SwiGLU: silu(gate) * up
    GELU_TANH = "gelu_tanh"  # GeGLU with the tanh approximation (gemma)


@dataclass(frozen=True)
class LayerSpec:
    """What may differ between layers of one model."""

    rope: bool = True  # False: this layer's attention has no position encoding (smollm3's NoPE layers)
    rope_theta: float | None = None  # a base of its own, unscaled (gemma3's local layers); None: the config's RoPE
    window: int | None = None  # sliding attention: a query at position p sees keys at p - window + 1 .. p; None: all


DEFAULT_LAYER = LayerSpec()


@dataclass(frozen=True)
class BlockSpec:
    """One model's block; the defaults are the llama block (pre-norm RMSNorm, SwiGLU, full RoPE, no biases)."""

    norm: Norm = Norm.RMS  # every norm of the model (attn, ffn, post, q/k, final)
    post_norms: bool = False  # also norm the attention and MLP outputs before their residual adds (gemma2/3)
    qk_norm: bool = False  # RMSNorm over each head's q and k before RoPE (qwen3, gemma3)
    activation: Activation = Activation.SILU
    qkv_bias: bool = False  # qwen2
    o_bias: bool = False
    fused_qkv: bool = False  # one qkv tensor (phi3)
    fused_gate_up: bool = False  # one gate_up tensor (phi3)
    embed_scale: float = 1.0  # embeddings multiplied by this (gemma: sqrt(d_model))
    rotary_fraction: float = 1.0  # partial rotary: the first fraction of each head's dims rotate (phi4-mini)
    layers: tuple[LayerSpec, ...] = ()  # per layer; empty: every layer is LayerSpec()

    def __post_init__(self) -> None:
        if not isinstance(self.norm, Norm) or not isinstance(self.activation, Activation):
            raise TypeError(f"block norm and activation must be Norm and Activation, not {self.norm!r}, "
                            f"{self.activation!r}")
        for k in ("embed_scale", "rotary_fraction"):
            v = getattr(self, k)
            if not isinstance(v, numbers.Real) or isinstance(v, bool) or not 0 < v < float("inf"):
                raise ValueError(f"block {k} must be a positive finite number, not {v!r}")
        if self.rotary_fraction > 1:
            raise ValueError(f"block rotary_fraction {self.rotary_fraction} exceeds 1")
        object.__setattr__(self, "layers", tuple(self.layers))
        for i, lay in enumerate(self.layers):
            if not isinstance(lay, LayerSpec):
                raise TypeError(f"block layers[{i}] must be a LayerSpec, not {type(lay).__name__}")
            if lay.window is not None and (not _is_int(lay.window) or lay.window < 1):
                raise ValueError(f"block layers[{i}].window must be a positive integer or None, not {lay.window!r}")
            if lay.rope_theta is not None and (not isinstance(lay.rope_theta, numbers.Real)
                                               or isinstance(lay.rope_theta, bool) or not lay.rope_theta > 0):
                raise ValueError(f"block layers[{i}].rope_theta must be a positive number, not {lay.rope_theta!r}")

    def layer(self, i: int) -> LayerSpec:
        return self.layers[i] if self.layers else DEFAULT_LAYER

    def windows(self) -> tuple[int, ...]:
        """The distinct sliding windows the layers use, ascending (empty: all attention is global)."""
        return tuple(sorted({lay.window for lay in self.layers if lay.window is not None}))

    def norm_scale(self, w: np.ndarray) -> np.ndarray:
        """The multiplier a norm with stored weight `w` applies (same dtype as w)."""
        return w if self.norm is Norm.RMS else w + w.dtype.type(1)

    def qkv_parts(self, p: str) -> list[str]:
        """Canonical tensors of layer prefix `p` ("layers.3") whose rows stack into the q|k|v projection."""
        return [f"{p}.qkv"] if self.fused_qkv else [f"{p}.q", f"{p}.k", f"{p}.v"]

    def qkv_bias_parts(self, p: str) -> list[str]:
        return [f"{p}.qkv_bias"] if self.fused_qkv else [f"{p}.q_bias", f"{p}.k_bias", f"{p}.v_bias"]

    def gate_up_parts(self, p: str) -> list[str]:
        return [f"{p}.gate_up"] if self.fused_gate_up else [f"{p}.gate", f"{p}.up"]

    def layer_tensors(self, p: str, D: int, F: int, H: int, KV: int, hd: int) -> dict[str, tuple[int, ...]]:
        """Canonical name -> shape of one layer's tensors; `p` is the prefix "layers.{i}.". The order is the llama
        layer's, then the variants' extra tensors (seeded test weights are drawn in this order)."""
        qkv = {p + "qkv": ((H + 2 * KV) * hd, D)} if self.fused_qkv else \
            {p + "q": (H * hd, D), p + "k": (KV * hd, D), p + "v": (KV * hd, D)}
        gate_up = {p + "gate_up": (2 * F, D)} if self.fused_gate_up else {p + "gate": (F, D), p + "up": (F, D)}
        out = {p + "attn_norm": (D,), **qkv, p + "o": (D, H * hd), p + "ffn_norm": (D,), **gate_up, p + "down": (D, F)}
        if self.qkv_bias:
            out.update({p + "qkv_bias": ((H + 2 * KV) * hd,)} if self.fused_qkv else
                       {p + "q_bias": (H * hd,), p + "k_bias": (KV * hd,), p + "v_bias": (KV * hd,)})
        if self.qk_norm:
            out.update({p + "q_norm": (hd,), p + "k_norm": (hd,)})
        if self.o_bias:
            out[p + "o_bias"] = (D,)
        if self.post_norms:
            out.update({p + "post_attn_norm": (D,), p + "post_ffn_norm": (D,)})
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["norm"], d["activation"] = self.norm.value, self.activation.value
        d["layers"] = [asdict(lay) for lay in self.layers]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "BlockSpec":
        """BlockSpec from `to_dict`'s form; TypeError / ValueError on wrong keys or values."""
        if not isinstance(d, Mapping):
            raise TypeError(f"block must be an object, not {type(d).__name__}")
        d = dict(d)
        try:
            d["norm"] = Norm(d.get("norm", Norm.RMS.value))
            d["activation"] = Activation(d.get("activation", Activation.SILU.value))
        except ValueError as e:
            raise ValueError(f"block: {e}") from None
        layers = d.get("layers", [])
        if not isinstance(layers, (list, tuple)) or not all(isinstance(x, Mapping) for x in layers):
            raise TypeError("block layers must be a list of objects")
        d["layers"] = tuple(LayerSpec(**x) for x in layers)
        return cls(**d)


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


LLAMA = BlockSpec()
__all__ = ["Activation", "BlockSpec", "DEFAULT_LAYER", "LLAMA", "LayerSpec", "Norm", "UnsupportedVariant"]
