"""The smollm3 family (SmolLM3): the llama block with RoPE left out of every 4th layer (NoPE layers).

Hugging Face lists the layers in `no_rope_layers` (1 = this layer uses RoPE), or derives them from
`no_rope_layer_interval` (layer i skips RoPE when (i + 1) % interval == 0). llama.cpp has no GGUF key for it: its
smollm3 graph skips RoPE where (il + 1) % 4 == 0 (n_no_rope_layer_step = 4), so a GGUF is read with that pattern and
a config with any other pattern cannot be written as a GGUF (`gguf_metadata` refuses it). The converter
(SmolLM3Model, a LlamaModel) permutes Q/K rows like llama.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping

import numpy as np

from . import family_base, llama
from .block import BlockSpec, LayerSpec
from .config import ModelConfig

ARCH = "smollm3"
HF_MODEL_TYPES = (ARCH,)  # the config.json model_types this module reads
DEFAULT_CHAT_TEMPLATE: str | None = None  # the file's own template, or the runtime's default (ChatML)
END_OF_TURN: str | None = None  # stop ids come from the file
BLOCK = BlockSpec()  # refined per checkpoint: LayerSpec(rope=False) on the NoPE layers
NAMES = family_base.LLAMA_NAMES
gguf_config_tensors = family_base.gguf_config_tensors  # none (llama.cpp's smollm3 reads no rope_freqs)
to_gguf_layout = llama.to_gguf_layout  # Q/K rows permuted for llama.cpp's interleaved RoPE
from_gguf_layout = llama.from_gguf_layout
LLAMA_CPP_NO_ROPE_STEP = 4  # llama.cpp's hparams.n_no_rope_layer_step for smollm3 (no GGUF key)


def nope_block(uses_rope: list[bool]) -> BlockSpec:
    """The smollm3 block with RoPE on the layers where `uses_rope` is true."""
    return replace(BLOCK, layers=tuple(LayerSpec(rope=bool(r)) for r in uses_rope))


def _step_pattern(n_layers: int, step: int) -> list[bool]:
    return [(i + 1) % step != 0 for i in range(n_layers)]


def config_from_gguf(meta: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]],
                     values: Callable[[str], np.ndarray] | None = None) -> ModelConfig:
    """ModelConfig from GGUF metadata: llama-like, NoPE every 4th layer as llama.cpp runs it."""
    cfg = family_base.llama_like_config(meta, tensors, arch=ARCH, block=BLOCK)
    return replace(cfg, block=replace(cfg.block, layers=nope_block(
        _step_pattern(cfg.n_layers, LLAMA_CPP_NO_ROPE_STEP)).layers))


def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
    """ModelConfig from a Hugging Face config.json (SmolLM3ForCausalLM): no_rope_layers / no_rope_layer_interval."""
    if hf.get("attention_bias"):
        raise ValueError("config.json attention_bias: true is not supported by specedge's smollm3 family")
    if hf.get("use_sliding_window") and hf.get("sliding_window"):
        raise ValueError(f"config.json use_sliding_window (window {hf['sliding_window']}) is not supported by "
                         "specedge's smollm3 family")
    # SmolLM3Config keeps PretrainedConfig's tie_word_embeddings=True, which save_pretrained leaves out as a default
    cfg = family_base.llama_like_config_from_hf({"tie_word_embeddings": True, **hf}, arch=ARCH, block=BLOCK)
    listed = hf.get("no_rope_layers")
    if listed is None:
        interval = int(hf.get("no_rope_layer_interval") or LLAMA_CPP_NO_ROPE_STEP)
        listed = _step_pattern(cfg.n_layers, interval)
    if not isinstance(listed, (list, tuple)) or len(listed) != cfg.n_layers:
        raise ValueError(f"config.json no_rope_layers must list {cfg.n_layers} layers (smollm3 family), "
                         f"not {listed!r}")
    return replace(cfg, block=nope_block([bool(r) for r in listed]))


def gguf_metadata(cfg: ModelConfig) -> dict[str, Any]:
    """No keys of its own; refuses a NoPE pattern llama.cpp would not run (it hard-codes every 4th layer)."""
    want = _step_pattern(cfg.n_layers, LLAMA_CPP_NO_ROPE_STEP)
    got = [cfg.block.layer(i).rope for i in range(cfg.n_layers)]
    if got != want:
        raise ValueError(f"smollm3 layers with RoPE {got} differ from llama.cpp's fixed pattern (every "
                         f"{LLAMA_CPP_NO_ROPE_STEP}th layer without); such a model cannot be written as a GGUF")
    return {}


def tokenizer_pre(config: ModelConfig) -> str:
    """Default `tokenizer.ggml.pre` when writing a file of this family (tiny files: SmolLM's; real SmolLM3 files
    carry llama-bpe)."""
    return "smollm"
