"""The llama family (Llama 2/3.x, SmolLM, TinyLlama, ...): config, weight names, and the Q/K row permutation.

llama.cpp's converter permutes Q and K rows of llama models so its interleaved RoPE works; the
canonical layout is Hugging Face's rotate_half order, so reading un-permutes and writing permutes.

Llama 3.x: the Hugging Face config names the llama3 RoPE rule (rope_scaling rope_type llama3); llama.cpp's converter
writes it as the tensor rope_freqs.weight instead ([head_dim/2] divisors, ggml_rope_ext's freq_factors) with no
rope.scaling keys. Reading a GGUF keeps the divisors (RopeScaling kind "freq_factors"); writing one from either form
writes the tensor (`gguf_config_tensors`), so both agree to float32 rounding of the divisors.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from . import family_base
from .block import BlockSpec
from .config import ModelConfig
from .rope import Rope, default_rope, inv_freq

ARCH = "llama"
HF_MODEL_TYPES = (ARCH,)  # the config.json model_types this module reads
DEFAULT_CHAT_TEMPLATE: str | None = None  # the file's own template, or the runtime's default (ChatML)
END_OF_TURN: str | None = None  # stop ids come from the file
BLOCK = BlockSpec()  # pre-norm RMSNorm, SwiGLU, RoPE on every layer; GGUF files may add q/k/v biases
# GGUF / Hugging Face tensor names (family_base.Names); rope_freqs is configuration (config_from_gguf reads it)
NAMES = family_base.LLAMA_NAMES.extend(gguf_config=frozenset({family_base.ROPE_FREQS}))
gguf_metadata = family_base.gguf_metadata  # no keys beyond the llama-like ones


def config_from_gguf(meta: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]],
                     values: Callable[[str], np.ndarray] | None = None) -> ModelConfig:
    """ModelConfig from GGUF metadata and GGUF tensor name -> numpy shape; `values` reads a configuration tensor
    (NAMES.gguf_config) as float32."""
    return family_base.llama_like_config(meta, tensors, arch=ARCH, block=BLOCK, values=values)


def gguf_config_tensors(cfg: ModelConfig) -> dict[str, np.ndarray]:
    """rope_freqs.weight for llama3 RoPE (from the HF rule or a GGUF's divisors), as llama.cpp's converter writes it;
    none otherwise."""
    return rope_freqs_tensor(cfg)


def rope_freqs_tensor(cfg: ModelConfig) -> dict[str, np.ndarray]:
    """{rope_freqs.weight: float32 [dim/2] divisors} for a llama3 / freq_factors config; {} for any other."""
    own = default_rope(cfg)
    if own.scaling.kind == "freq_factors":
        return {family_base.ROPE_FREQS: np.asarray(own.scaling.freq_factors, np.float32)}
    if own.scaling.kind != "llama3":
        return {}
    plain = inv_freq(Rope(own.theta, type(own.scaling)(), own.dim))
    return {family_base.ROPE_FREQS: (plain / inv_freq(own)).astype(np.float32)}


def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
    """ModelConfig from a Hugging Face config.json (LlamaForCausalLM); `attention_bias` gives q/k/v(/o) biases."""
    if hf.get("attention_bias"):
        # LlamaAttention puts the same flag on o_proj, which has no canonical tensor (nor a GGUF one).
        raise ValueError("attention_bias: true (llama q/k/v/o biases) is not supported")
    return family_base.llama_like_config_from_hf(hf, arch=ARCH, block=BLOCK)


def _heads(canonical: str, config: ModelConfig) -> int | None:
    """Heads whose rows are permuted in GGUF: q (and its bias) by n_heads, k by n_kv_heads."""
    kind = canonical.rsplit(".", 1)[-1]
    heads = {"q": config.n_heads, "q_bias": config.n_heads, "k": config.n_kv_heads, "k_bias": config.n_kv_heads}
    return heads.get(kind)


def permute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Rows of a q or k projection (or bias) [n_heads*hd, ...], HF rotate_half order -> llama.cpp's interleaved-pair
    RoPE order (convert_hf_to_gguf's LlamaModel.permute): within each head, row j*hd/2 + i goes to 2i + j."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def to_gguf_layout(canonical: str, w: np.ndarray, config: ModelConfig) -> np.ndarray:
    """Canonical (HF rotate_half) -> GGUF row order, as llama.cpp's convert_hf_to_gguf permutes it."""
    n = _heads(canonical, config)
    return w if n is None else permute_rows(w, n)


def from_gguf_layout(canonical: str, w: np.ndarray, config: ModelConfig) -> np.ndarray:
    """GGUF row order -> canonical: the inverse of `to_gguf_layout`."""
    n = _heads(canonical, config)
    if n is None:
        return w
    return w.reshape(n, w.shape[0] // n // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tokenizer_pre(config: ModelConfig) -> str:
    """Default `tokenizer.ggml.pre` when writing a file of this family (SmolLM-style vocab)."""
    return "smollm"
