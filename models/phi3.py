"""The phi3 family (Phi-3 / Phi-3.5 mini and medium, Phi-4-mini): llama-like with fused tensors, LongRoPE and
partial rotary.

    qkv      one [(H + 2 KV) hd, D] projection, q rows then k then v (GGUF attn_qkv, HF self_attn.qkv_proj)
    gate_up  one [2F, D] projection, gate rows first: silu(gate) * up (GGUF ffn_up, HF mlp.gate_up_proj;
             llama.cpp's LLM_FFN_SWIGLU without a gate tensor splits ffn_up's output in halves, the first silu'd)
    RoPE     NEOX (rotate_half), so GGUF rows are canonical as stored (convert_hf_to_gguf does not permute phi3);
             partial rotary when rope.dimension_count < head dim (Phi-4-mini: 96 of 128);
             LongRoPE ("su"/"longrope"): per-frequency divisors rope_factors_long/short.weight (GGUF configuration
             tensors) or rope_scaling.long_factor/short_factor, picked by context (models/rope.py), and cos/sin
             scaled by rope.scaling.attn_factor (GGUF) / attention_factor or sqrt(1 + ln(s) / ln(original)) (HF,
             s = max_position_embeddings / original_max_position_embeddings), as convert_hf_to_gguf computes it.

Sliding window: llama.cpp (src/models/phi3.cpp) reads phi3.attention.sliding_window and then disables it ("Phi SWA
is currently disabled"), so a GGUF runs with global attention here too; transformers' Phi3Attention applies
config.sliding_window, so a Hugging Face checkpoint gets it as LayerSpec.window on every layer (it only differs
beyond `sliding_window` positions: Phi-3-mini-4k's 2047).
Refused, naming the field: mixture-of-experts (phimoe's experts; its own architecture), Phi-3-small's blocksparse
attention (model_type phi3small is not registered; its fields are refused here too), rope scaling other than
longrope/su, activations other than silu.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Mapping

import numpy as np

from . import family_base
from .block import BlockSpec, LayerSpec
from .config import ModelConfig, RopeScaling
from .rope import rotary_dim

ARCH = "phi3"
HF_MODEL_TYPES = (ARCH,)  # the config.json model_types this module reads
DEFAULT_CHAT_TEMPLATE: str | None = None  # the file's own template, or the runtime's default (ChatML)
END_OF_TURN: str | None = None  # stop ids come from the file
BLOCK = BlockSpec(fused_qkv=True, fused_gate_up=True)  # the llama block with fused q|k|v and gate|up
LONG, SHORT = "rope_factors_long.weight", "rope_factors_short.weight"
NAMES = family_base.LLAMA_NAMES.extend(
    gguf_layer={"attn_qkv.weight": "qkv", "ffn_up.weight": "gate_up"},  # phi3's ffn_up holds gate|up
    hf_layer={"self_attn.qkv_proj.weight": "qkv", "mlp.gate_up_proj.weight": "gate_up"},
    gguf_config=frozenset({LONG, SHORT}))
_HF_REFUSED = {  # config.json fields of phi3 variants the builders do not run
    "num_local_experts": "mixture-of-experts layers (phimoe)",
    "blocksparse_block_size": "blocksparse attention (Phi-3-small)",
    "dense_attention_every_n_layers": "blocksparse attention (Phi-3-small)",
}


def config_from_gguf(meta: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]],
                     values: Callable[[str], np.ndarray] | None = None) -> ModelConfig:
    """ModelConfig from GGUF metadata and GGUF tensor name -> numpy shape; `values` reads the LongRoPE factor
    tensors (NAMES.gguf_config) as float32."""
    if f"{ARCH}.expert_count" in meta or "blk.0.ffn_gate_inp.weight" in tensors:
        raise ValueError(f"{ARCH}: mixture-of-experts layers ({ARCH}.expert_count / ffn_gate_inp) are not supported")
    if str(meta.get(f"{ARCH}.rope.scaling.type", "none")) not in ("none", "linear"):
        raise ValueError(f"{ARCH}: rope scaling type {meta[f'{ARCH}.rope.scaling.type']!r} is not supported")
    block = replace(BLOCK, fused_qkv="blk.0.attn_qkv.weight" in tensors)  # llama.cpp also takes separate q/k/v
    cfg = family_base.llama_like_config(meta, tensors, arch=ARCH, block=block, partial_rotary=True)
    original = int(meta.get(f"{ARCH}.rope.scaling.original_context_length") or cfg.context_length)
    attn = float(meta.get(f"{ARCH}.rope.scaling.attn_factor", 1.0))
    if LONG not in tensors and SHORT not in tensors:
        return replace(cfg, rope_scaling=RopeScaling(attn_factor=attn)) if attn != 1.0 else cfg
    if values is None:
        raise ValueError(f"{ARCH}: the file has LongRoPE factor tensors but no reader for them was given")
    half = rotary_dim(cfg) // 2
    # llama.cpp rotates with no divisors when the chosen tensor is absent: ones here.
    long_f, short_f = (tuple(float(v) for v in values(n).reshape(-1)) if n in tensors else (1.0,) * half
                       for n in (LONG, SHORT))
    return replace(cfg, rope_scaling=_longrope(long_f, short_f, half, original, cfg.context_length, attn))


def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
    """ModelConfig from a Hugging Face config.json (Phi3ForCausalLM); ValueError names a field we do not build."""
    for key, what in _HF_REFUSED.items():
        if hf.get(key):
            raise ValueError(f"{ARCH}: {what} ({key}: {hf[key]!r}) are not supported")
    rs = hf.get("rope_scaling") or {}
    kind = str(rs.get("rope_type", rs.get("type", "default"))).lower()
    if kind not in ("default", "longrope", "su"):
        raise ValueError(f"{ARCH}: rope_scaling type {kind!r} is not supported (longrope / su are)")
    plain = {k: v for k, v in hf.items() if k != "rope_scaling"}  # the llama reader knows no longrope
    cfg = family_base.llama_like_config_from_hf(plain, arch=ARCH, block=BLOCK, partial_rotary=True)
    window = hf.get("sliding_window")
    if window and int(window) < cfg.context_length:  # transformers applies it (module docstring)
        cfg = replace(cfg, block=replace(cfg.block, layers=(LayerSpec(window=int(window)),) * cfg.n_layers))
    if kind == "default":
        return cfg
    original = int(hf.get("original_max_position_embeddings") or cfg.context_length)
    scale = cfg.context_length / original
    attn = rs.get("attention_factor")
    if attn is None:  # transformers' _compute_longrope_parameters and convert_hf_to_gguf
        attn = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1.0 else 1.0
    try:
        long_f, short_f = (tuple(float(v) for v in rs[k]) for k in ("long_factor", "short_factor"))
    except (KeyError, TypeError):
        raise ValueError(f"{ARCH}: rope_scaling {kind} needs long_factor and short_factor lists") from None
    return replace(cfg, rope_scaling=_longrope(long_f, short_f, rotary_dim(cfg) // 2, original,
                                               cfg.context_length, float(attn)))


def _longrope(long_f: tuple[float, ...], short_f: tuple[float, ...], half: int, original: int, context: int,
              attn: float) -> RopeScaling:
    if len(long_f) != half or len(short_f) != half:
        raise ValueError(f"{ARCH}: LongRoPE factors have {len(long_f)} long and {len(short_f)} short entries; the "
                         f"rotary dim needs {half} each")
    if not all(math.isfinite(v) and v > 0 for v in long_f + short_f):
        raise ValueError(f"{ARCH}: LongRoPE factors must be positive finite numbers")
    return RopeScaling(kind="longrope", factor=context / original, original_context=original, short_factor=short_f,
                       long_factor=long_f, attn_factor=attn)


def gguf_metadata(cfg: ModelConfig) -> dict[str, Any]:
    """The phi3 keys convert_hf_to_gguf writes beyond the llama-like ones: original context, LongRoPE's attention
    factor, and the sliding window (0: none; llama.cpp reads and disables it)."""
    rs, window = cfg.rope_scaling, cfg.block.windows()
    out: dict[str, Any] = {f"{ARCH}.rope.scaling.original_context_length": rs.original_context or cfg.context_length,
                           f"{ARCH}.attention.sliding_window": window[0] if window else 0}
    if rs.kind == "longrope" or rs.attn_factor != 1.0:
        out[f"{ARCH}.rope.scaling.attn_factor"] = float(rs.attn_factor)
    return out


def gguf_config_tensors(cfg: ModelConfig) -> dict[str, np.ndarray]:
    """rope_factors_long/short.weight [rot/2] for a LongRoPE model; none otherwise."""
    rs = cfg.rope_scaling
    if rs.kind != "longrope":
        return {}
    return {LONG: np.asarray(rs.long_factor, np.float32), SHORT: np.asarray(rs.short_factor, np.float32)}


to_gguf_layout = from_gguf_layout = family_base.same_layout  # NEOX RoPE; gate rows first in both


def tokenizer_pre(config: ModelConfig) -> str:
    """Default `tokenizer.ggml.pre` when writing a byte-level BPE file of this family (Phi-4-mini's; Phi-3's own
    vocabulary is SentencePiece)."""
    return "gpt-4o"
