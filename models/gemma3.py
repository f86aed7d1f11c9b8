"""The gemma3 family (Gemma 3 text models: 270M, 1B, and the text half of 4B/12B/27B checkpoints).

    embed * sqrt(d) ─► [(1 + w) RMSNorm ─► attention (q/k (1 + w) RMSNorm, RoPE of the layer, window of the layer)
                        ─► post norm ─► + h ─► norm ─► GeGLU (tanh) ─► post norm ─► + h] x L ─► norm ─► tied head

Layers alternate: five sliding-window layers whose RoPE has its own unscaled base (HF `rope_local_base_freq`,
10000), then one global layer at the config's base and scaling. Hugging Face lists them (`layer_types`, or the
older `sliding_window_pattern`); a GGUF file has only `gemma3.attention.sliding_window`, and llama.cpp applies
its fixed gemma3 rule (src/llama-model.cpp: `set_swa_pattern(6)`, layer i is global iff i % 6 == 5; sliding
layers RoPE at `rope_freq_base_train_swa = 10000` with scale 1; global layers at the file's freq_base and rope
scaling), which this reader reproduces.

Norm weights: Hugging Face stores w and multiplies by (1 + w) (BlockSpec Norm.RMS_PLUS_ONE); llama.cpp's converter
(convert_hf_to_gguf.py Gemma3Model, `norm_shift`) writes w + 1 for every `*norm.weight`, q/k norms included, and
llama.cpp multiplies plainly. The canonical form is Hugging Face's: `from_gguf_layout` subtracts 1 from norm
tensors, `to_gguf_layout` adds it back. Q/K rows: llama.cpp runs gemma3 with NEOX RoPE, so no permutation.

Attention scale: Hugging Face uses query_pre_attn_scalar ** -0.5 and llama.cpp 1/sqrt(head_dim) except for the
62-layer 27B (1/sqrt(d_model / n_heads)). The block builders scale by 1/sqrt(head_dim), so a checkpoint whose
scalar differs from head_dim (27B: 168 vs 128) is refused, as are logit soft-capping, attention biases,
bidirectional attention and vision towers (multimodal `gemma3` configs).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Mapping

import numpy as np

from . import family_base
from .block import Activation, BlockSpec, LayerSpec, Norm
from .config import ModelConfig

ARCH = "gemma3"
HF_MODEL_TYPES = ("gemma3_text", "gemma3")  # Gemma3ForCausalLM; "gemma3" (multimodal) is refused by config_from_hf
BLOCK = BlockSpec(norm=Norm.RMS_PLUS_ONE, post_norms=True, qk_norm=True, activation=Activation.GELU_TANH)
NAMES = family_base.LLAMA_NAMES.extend(
    gguf_layer={"attn_q_norm.weight": "q_norm", "attn_k_norm.weight": "k_norm",
                "post_attention_norm.weight": "post_attn_norm", "post_ffw_norm.weight": "post_ffn_norm"},
    hf_layer={"self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm",
              "post_attention_layernorm.weight": "post_attn_norm",  # in llama this name is the pre-MLP norm
              "pre_feedforward_layernorm.weight": "ffn_norm",
              "post_feedforward_layernorm.weight": "post_ffn_norm"})
gguf_config_tensors = family_base.gguf_config_tensors  # none

SWA_PERIOD = 6  # llama.cpp's gemma3 rule: every 6th layer (i % 6 == 5) is global
SWA_ROPE_THETA = 10000.0  # llama.cpp's rope_freq_base_train_swa for gemma3 (HF rope_local_base_freq's default)
_SOFTCAPS = ("final_logit_softcapping", "attn_logit_softcapping")

# Gemma's own turn format (its Hugging Face template, string contents): a system prompt is folded into the first
# user turn, "assistant" is called "model". No {{ bos_token }}: Tokenizer.encode adds BOS (add_bos_token is true).
# Used when a GGUF file has no tokenizer.chat_template (the catalogue's gemma3-270m has none).
DEFAULT_CHAT_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set prefix = messages[0]['content'] + '\n\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for m in turns -%}"
    "{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif -%}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' }}"
    "{{ (prefix if loop.first else '') + (m['content'] | trim) + '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
END_OF_TURN = "<end_of_turn>"  # llama.cpp treats it as end of generation by its text (the file names no eot id)


def _layers(n_layers: int, window: int | None, sliding: Callable[[int], bool], local_theta: float
            ) -> tuple[LayerSpec, ...]:
    if not window:
        return ()  # no sliding window: every layer global at the config's RoPE
    return tuple(LayerSpec(window=int(window), rope_theta=float(local_theta)) if sliding(i) else LayerSpec()
                 for i in range(n_layers))


def _block(cfg: ModelConfig, layers: tuple[LayerSpec, ...]) -> BlockSpec:
    return replace(BLOCK, embed_scale=math.sqrt(cfg.d_model), layers=layers)


def config_from_gguf(meta: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]],
                     values: Callable[[str], np.ndarray] | None = None) -> ModelConfig:
    """ModelConfig from GGUF metadata (llama.cpp's gemma3 reading: sliding window + its fixed 6-layer pattern)."""
    for key in _SOFTCAPS:
        if float(meta.get(f"{ARCH}.{key}") or 0.0):
            raise ValueError(f"{ARCH}.{key} = {meta[f'{ARCH}.{key}']} (logit soft-capping) is not supported by the "
                             "gemma3 family")
    if "blk.0.attn_q.bias" in tensors or "blk.0.attn_output.bias" in tensors:
        raise ValueError("gemma3 attention biases are not supported (llama.cpp's gemma3 has none)")
    cfg = family_base.llama_like_config(meta, tensors, arch=ARCH, block=BLOCK)
    if cfg.n_layers == 62 and cfg.d_model // cfg.n_heads != cfg.head_dim:
        # llama.cpp scales the 27B's queries by 1/sqrt(d_model / n_heads); our builders use 1/sqrt(head_dim).
        raise ValueError(f"query scale 1/sqrt({cfg.d_model // cfg.n_heads}) (gemma3 27B) differs from "
                         f"1/sqrt(head_dim={cfg.head_dim}); not supported by the gemma3 family")
    window = meta.get(f"{ARCH}.attention.sliding_window")
    layers = _layers(cfg.n_layers, int(window) if window else None, lambda i: i % SWA_PERIOD < SWA_PERIOD - 1,
                     SWA_ROPE_THETA)
    return replace(cfg, block=_block(cfg, layers))


def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
    """ModelConfig from a Gemma3ForCausalLM config.json (model_type gemma3_text); ValueError names the field that
    is not supported (a multimodal `gemma3` config's vision_config, soft-capping, a query scalar != head_dim)."""
    for key in ("vision_config", "text_config"):
        if hf.get(key) is not None:
            raise ValueError(f"{key} is set: a multimodal gemma3 checkpoint (vision tower); the gemma3 family "
                             "reads Gemma3ForCausalLM text checkpoints (model_type gemma3_text)")
    for key in _SOFTCAPS:
        if hf.get(key) is not None:
            raise ValueError(f"{key} = {hf[key]} (logit soft-capping) is not supported by the gemma3 family")
    for key in ("attention_bias", "use_bidirectional_attention"):
        if hf.get(key):
            raise ValueError(f"{key}: true is not supported by the gemma3 family")
    act = hf.get("hidden_activation", hf.get("hidden_act", "gelu_pytorch_tanh"))
    if act != "gelu_pytorch_tanh":
        raise ValueError(f"hidden_activation {act!r} is not supported (gemma3 runs GeGLU with gelu_pytorch_tanh)")
    base = {k: v for k, v in hf.items() if k not in ("hidden_act", "hidden_activation")}
    cfg = family_base.llama_like_config_from_hf(base, arch=ARCH, block=BLOCK)
    if "tie_word_embeddings" not in hf:  # Gemma3TextConfig's default is tied
        cfg = replace(cfg, tied_embeddings=True)
    scalar = hf.get("query_pre_attn_scalar", cfg.head_dim)
    if float(scalar) != cfg.head_dim:
        raise ValueError(f"query_pre_attn_scalar = {scalar} differs from head_dim = {cfg.head_dim}; the builders "
                         "scale queries by 1/sqrt(head_dim)")
    kinds = hf.get("layer_types")
    if kinds is not None:
        if len(kinds) != cfg.n_layers or not set(kinds) <= {"sliding_attention", "full_attention"}:
            raise ValueError(f"layer_types {kinds!r} is not {cfg.n_layers} of sliding_attention / full_attention")
        sliding = lambda i: kinds[i] == "sliding_attention"  # noqa: E731
    else:
        period = int(hf.get("sliding_window_pattern", SWA_PERIOD))
        sliding = lambda i: bool((i + 1) % period)  # noqa: E731  (transformers' rule)
    layers = _layers(cfg.n_layers, hf.get("sliding_window"), sliding, hf.get("rope_local_base_freq", SWA_ROPE_THETA))
    return replace(cfg, block=_block(cfg, layers))


def gguf_metadata(cfg: ModelConfig) -> dict[str, Any]:
    """gemma3.attention.sliding_window (llama.cpp derives the layer pattern itself); ValueError when the block's
    layers are not the pattern and local base llama.cpp would run."""
    windows = cfg.block.windows()
    if not windows:
        return {}
    want = _layers(cfg.n_layers, windows[0], lambda i: i % SWA_PERIOD < SWA_PERIOD - 1, SWA_ROPE_THETA)
    if len(windows) > 1 or cfg.block.layers != want:
        raise ValueError("a gemma3 GGUF can only express llama.cpp's pattern (every 6th layer global, sliding layers "
                         f"at RoPE base {SWA_ROPE_THETA:g}); this model's layers differ")
    return {f"{ARCH}.attention.sliding_window": int(windows[0])}


def _is_norm(canonical: str) -> bool:
    return canonical.rsplit(".", 1)[-1].endswith("norm")


def to_gguf_layout(canonical: str, w: np.ndarray, config: ModelConfig) -> np.ndarray:
    """Canonical (HF: norm weight w, multiplier 1 + w) -> GGUF (norm weight stored as 1 + w)."""
    return w + w.dtype.type(1) if _is_norm(canonical) and w.dtype.kind == "f" else w


def from_gguf_layout(canonical: str, w: np.ndarray, config: ModelConfig) -> np.ndarray:
    """GGUF -> canonical: norm weights minus 1. Stored blocks (raw bytes, GGUFModel.raw_blocks) pass unchanged:
    only row order could change there, and norms are F32, which transcoding reads as floats."""
    return w - w.dtype.type(1) if _is_norm(canonical) and w.dtype.kind == "f" else w


def tokenizer_pre(config: ModelConfig) -> str:
    """Default `tokenizer.ggml.pre` when writing a file of this family."""
    return "default"
