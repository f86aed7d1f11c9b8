"""The qwen3 family (Qwen3 dense): llama-like with per-head q/k RMSNorm before RoPE and no q/k/v biases.

llama.cpp runs qwen3 with NEOX (rotate_half) RoPE and its converter (Qwen3Model, a Qwen2Model) does not permute Q/K,
so GGUF rows are already canonical. head_dim is its own size (attention.key_length / config head_dim), often not
d_model / n_heads. The MoE variant (GGUF qwen3moe, HF qwen3_moe) is another architecture (models/families.py).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from . import family_base
from .block import BlockSpec
from .config import ModelConfig

ARCH = "qwen3"
HF_MODEL_TYPES = (ARCH,)  # the config.json model_types this module reads
DEFAULT_CHAT_TEMPLATE: str | None = None  # the file's own template, or the runtime's default (ChatML)
END_OF_TURN: str | None = None  # stop ids come from the file
BLOCK = BlockSpec(qk_norm=True)  # the llama block with q/k RMSNorm over each head
NAMES = family_base.LLAMA_NAMES.extend(
    gguf_layer={"attn_q_norm.weight": "q_norm", "attn_k_norm.weight": "k_norm"},
    hf_layer={"self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm"})
gguf_metadata = family_base.gguf_metadata  # no keys beyond the llama-like ones
gguf_config_tensors = family_base.gguf_config_tensors  # none


def config_from_gguf(meta: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]],
                     values: Callable[[str], np.ndarray] | None = None) -> ModelConfig:
    """ModelConfig from GGUF metadata and GGUF tensor name -> numpy shape (rope_freqs is not a qwen3 tensor)."""
    if "blk.0.attn_q.bias" in tensors:
        raise ValueError("qwen3 attention has no q/k/v biases, but the file has blk.0.attn_q.bias")
    return family_base.llama_like_config(meta, tensors, arch=ARCH, block=BLOCK)


def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
    """ModelConfig from a Hugging Face config.json (Qwen3ForCausalLM)."""
    if hf.get("attention_bias"):
        raise ValueError("config.json attention_bias: true (q/k/v/o biases) is not supported by specedge's qwen3 "
                         "family")
    window = hf.get("sliding_window")
    if hf.get("use_sliding_window") and window and window < int(hf.get("max_position_embeddings") or 0):
        raise ValueError(f"config.json use_sliding_window (window {window}) is not supported by specedge's qwen3 "
                         "family")
    return family_base.llama_like_config_from_hf(hf, arch=ARCH, block=BLOCK)


to_gguf_layout = from_gguf_layout = family_base.same_layout  # NEOX RoPE: GGUF rows are canonical


def tokenizer_pre(config: ModelConfig) -> str:
    """Default `tokenizer.ggml.pre` when writing a file of this family (Qwen's byte-level BPE)."""
    return "qwen2"
