"""The qwen2 family (Qwen2, Qwen2.5, Qwen2.5-Coder): llama-like with Q/K/V biases.

llama.cpp runs qwen2 with NEOX (rotate_half) RoPE, so its GGUF rows are already in canonical order.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from . import family_base
from .block import BlockSpec
from .config import ModelConfig

ARCH = "qwen2"
HF_MODEL_TYPES = (ARCH,)  # the config.json model_types this module reads
DEFAULT_CHAT_TEMPLATE: str | None = None  # the file's own template, or the runtime's default (ChatML)
END_OF_TURN: str | None = None  # stop ids come from the file
BLOCK = BlockSpec(qkv_bias=True)  # the llama block with q/k/v biases
NAMES = family_base.LLAMA_NAMES  # GGUF / Hugging Face tensor names (family_base.Names)
gguf_metadata = family_base.gguf_metadata  # no keys beyond the llama-like ones
gguf_config_tensors = family_base.gguf_config_tensors  # none


def config_from_gguf(meta: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]],
                     values: Callable[[str], np.ndarray] | None = None) -> ModelConfig:
    """ModelConfig from GGUF metadata and GGUF tensor name -> numpy shape; `values` reads a configuration tensor
    (NAMES.gguf_config) as float32."""
    return family_base.llama_like_config(meta, tensors, arch=ARCH, block=BLOCK)


def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
    """ModelConfig from a Hugging Face config.json (Qwen2ForCausalLM: q/k/v biases, no o bias)."""
    window = hf.get("sliding_window")
    if hf.get("use_sliding_window") and window and window < int(hf.get("max_position_embeddings") or 0):
        raise ValueError(f"sliding-window attention (window {window}) is not supported")
    return family_base.llama_like_config_from_hf(hf, arch=ARCH, block=BLOCK)


to_gguf_layout = from_gguf_layout = family_base.same_layout  # NEOX RoPE: GGUF rows are canonical


def tokenizer_pre(config: ModelConfig) -> str:
    """Default `tokenizer.ggml.pre` when writing a file of this family."""
    return "qwen2"
