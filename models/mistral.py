"""Mistral checkpoints (Hugging Face model_type "mistral": Mistral 7B, Mistral NeMo, Ministral-style dense models):
the llama block, read into a llama ModelConfig.

llama.cpp's converter writes Mistral as general.architecture "llama" (Q/K rows permuted like llama's), with the
SentencePiece vocabulary (`tokenizer.ggml.model == "llama"`: models/tokenizer_spm.py) or, for newer releases, a
byte-level BPE one, so every Mistral GGUF is read by models/llama.py. This module reads the Hugging Face side:
config.json's `sliding_window` (Mistral 7B v0.1: 4096) becomes a window on every layer, as transformers applies it
(llama.cpp runs those GGUFs without a window; the two differ only beyond the window).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping

import numpy as np

from . import family_base, llama
from .block import LayerSpec
from .config import ModelConfig

ARCH = "mistral"
HF_MODEL_TYPES = (ARCH,)  # the config.json model_types this module reads
DEFAULT_CHAT_TEMPLATE: str | None = None  # the file's own template, or the runtime's default (ChatML)
END_OF_TURN: str | None = None  # stop ids come from the file
BLOCK = llama.BLOCK
NAMES = llama.NAMES  # MistralForCausalLM's state dict names are LlamaForCausalLM's
gguf_metadata = llama.gguf_metadata
gguf_config_tensors = llama.gguf_config_tensors
to_gguf_layout = llama.to_gguf_layout
from_gguf_layout = llama.from_gguf_layout


def config_from_gguf(meta: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]],
                     values: Callable[[str], np.ndarray] | None = None) -> ModelConfig:
    """llama.cpp writes Mistral GGUFs as "llama"; a file claiming "mistral" is not one llama.cpp's converter makes."""
    raise ValueError("general.architecture 'mistral' is not a llama.cpp architecture: Mistral GGUFs are written as "
                     "'llama' (re-convert the model with llama.cpp's convert_hf_to_gguf.py)")


def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
    """A llama ModelConfig from a MistralForCausalLM config.json; a sliding window below the context becomes every
    layer's window."""
    if hf.get("attention_bias"):
        raise ValueError("config.json attention_bias: true is not supported by specedge's mistral family")
    cfg = family_base.llama_like_config_from_hf(hf, arch=llama.ARCH, block=BLOCK)
    window = hf.get("sliding_window")
    if window and int(window) < cfg.context_length:
        cfg = replace(cfg, block=replace(cfg.block, layers=(LayerSpec(window=int(window)),) * cfg.n_layers))
    return cfg


def tokenizer_pre(config: ModelConfig) -> str:
    """Mistral's byte-level BPE releases (Tekken) name no pre-tokenizer we build; SentencePiece ones need none."""
    return "default"
