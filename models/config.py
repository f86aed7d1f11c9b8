"""What a model is: a frozen config (the blueprint) and immutable canonical weights.

Canonical weights use Hugging Face layouts so every reader (GGUF, safetensors) and every
writer (ONNX, GGUF variants) meets in one place:
  - matrices are float32 [out_features, in_features];
  - Q and K rows are in HF "rotate_half" order (GGUF llama files store them permuted for
    llama.cpp's interleaved RoPE; the llama family reader undoes that);
  - names are the keys of `tensor_names()` below (which tensors a layer has follows `block`, models/block.py).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping

import numpy as np

from .block import BlockSpec


@dataclass(frozen=True)
class RopeScaling:
    """RoPE scaling as data (models/rope.py computes none, linear, llama3, freq_factors and longrope; yarn is declared
    only)."""

    kind: str = "none"  # none | linear | llama3 | freq_factors | yarn | longrope
    factor: float = 1.0
    original_context: int = 0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    short_factor: tuple[float, ...] = ()  # longrope: per-frequency divisors within the original context
    long_factor: tuple[float, ...] = ()  # longrope: beyond it
    freq_factors: tuple[float, ...] = ()  # freq_factors: per-frequency divisors (a GGUF's rope_freqs), then `factor`
    attn_factor: float = 1.0  # cos/sin multiplied by it (longrope's sqrt(1 + ln(s) / ln(original)); GGUF attn_factor)

    def __post_init__(self) -> None:  # lists from a manifest become tuples: a Rope is a dict key
        object.__setattr__(self, "short_factor", tuple(self.short_factor))
        object.__setattr__(self, "long_factor", tuple(self.long_factor))
        object.__setattr__(self, "freq_factors", tuple(float(f) for f in self.freq_factors))


@dataclass(frozen=True)
class ModelConfig:
    arch: str  # family key: "llama", "qwen2"
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    rms_eps: float
    rope_theta: float
    context_length: int
    tied_embeddings: bool
    block: BlockSpec = field(default_factory=BlockSpec)  # the family's block, refined per checkpoint
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    name: str = ""

    def __post_init__(self) -> None:
        # A damaged file or manifest is caught here, before a size drives a division, an allocation or a loop.
        # d_model, d_ff, rms_eps and rope_theta may be 0: optimum artifacts describe other architectures with 0 for
        # "not applicable" (export/optimum_export.py describe_config).
        sizes = {"n_layers": self.n_layers, "n_heads": self.n_heads, "n_kv_heads": self.n_kv_heads,
                 "head_dim": self.head_dim, "vocab_size": self.vocab_size, "context_length": self.context_length,
                 "d_model": self.d_model, "d_ff": self.d_ff}
        bad = {k: v for k, v in sizes.items() if not isinstance(v, numbers.Integral) or isinstance(v, bool)
               or v < (0 if k in ("d_model", "d_ff") else 1)}
        if bad:
            raise ValueError(f"model config sizes must be positive integers: {bad}")
        for k in ("rms_eps", "rope_theta"):
            v = getattr(self, k)
            if not isinstance(v, numbers.Real) or isinstance(v, bool) or not 0 <= v < float("inf"):
                raise ValueError(f"model config {k} must be a finite number >= 0, not {v!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if not isinstance(self.block, BlockSpec):
            raise TypeError(f"model config block must be a BlockSpec, not {type(self.block).__name__}")
        if self.block.layers and len(self.block.layers) != self.n_layers:
            raise ValueError(f"the block declares {len(self.block.layers)} layers; the model has {self.n_layers}")

    @property
    def group(self) -> int:
        """Query heads per KV head (grouped-query attention)."""
        return self.n_heads // self.n_kv_heads

    def tensor_names(self) -> dict[str, tuple[int, ...]]:
        """Every canonical tensor name with its expected shape."""
        D, F, V, H, KV, hd = self.d_model, self.d_ff, self.vocab_size, self.n_heads, self.n_kv_heads, self.head_dim
        out: dict[str, tuple[int, ...]] = {"embed": (V, D), "norm": (D,)}
        if not self.tied_embeddings:
            out["lm_head"] = (V, D)
        for i in range(self.n_layers):
            out.update(self.block.layer_tensors(f"layers.{i}.", D, F, H, KV, hd))
        return out


def _with_qkv_bias(init):
    """`ModelConfig(..., qkv_bias=b)`, the spelling from before `block`, sets block.qkv_bias (on the given block or
    the llama one); `cfg.qkv_bias` reads it. Not a field, so dataclasses.replace never passes it."""
    def __init__(self, *args, qkv_bias: bool | None = None, **kw) -> None:
        if qkv_bias is not None:
            if not isinstance(qkv_bias, bool):
                raise TypeError(f"qkv_bias must be a boolean, not {qkv_bias!r}")
            if "block" in kw and kw["block"].qkv_bias != qkv_bias:
                raise ValueError(f"qkv_bias={qkv_bias} contradicts block.qkv_bias={kw['block'].qkv_bias}")
            kw["block"] = replace(kw.get("block", BlockSpec()), qkv_bias=qkv_bias)
        init(self, *args, **kw)
    __init__.__doc__ = init.__doc__
    return __init__


ModelConfig.__init__ = _with_qkv_bias(ModelConfig.__init__)  # type: ignore[method-assign]
ModelConfig.qkv_bias = property(lambda self: self.block.qkv_bias,  # type: ignore[attr-defined]
                                doc="q/k/v projections carry biases (qwen2): the block's declaration.")


@dataclass(frozen=True)
class Weights:
    """Immutable canonical float32 tensors, shape-checked against the config."""

    config: ModelConfig
    tensors: Mapping[str, np.ndarray]

    def __post_init__(self) -> None:
        want = self.config.tensor_names()
        missing = sorted(set(want) - set(self.tensors))
        if missing:
            raise ValueError(f"model weights are missing tensors: {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        for name, shape in want.items():
            got = tuple(self.tensors[name].shape)
            if got != shape:
                raise ValueError(f"tensor {name!r} has shape {got}, config expects {shape}")
        for t in self.tensors.values():
            t.setflags(write=False)
        object.__setattr__(self, "tensors", MappingProxyType(dict(self.tensors)))

    def __getitem__(self, name: str) -> np.ndarray:
        return self.tensors[name]

    @property
    def lm_head(self) -> np.ndarray:
        return self.tensors["embed"] if self.config.tied_embeddings else self.tensors["lm_head"]

    def nbytes(self) -> int:
        return sum(int(t.nbytes) for t in self.tensors.values())
