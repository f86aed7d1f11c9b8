"""What llama-like families share: the GGUF and Hugging Face -> canonical weight name tables, and configs from
GGUF metadata or a Hugging Face config.json.

Family modules (llama.py, qwen2.py) call these with their own quirks and their block declaration (models/block.py);
nothing here branches on an architecture string.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

import numpy as np

from .block import BlockSpec
from .config import ModelConfig, RopeScaling

# GGUF tensor name -> canonical name (models/config.py). `{i}` is the block index.
GLOBAL_NAMES: dict[str, str] = {
    "token_embd.weight": "embed",
    "output_norm.weight": "norm",
    "output.weight": "lm_head",
}
LAYER_NAMES: dict[str, str] = {
    "attn_norm.weight": "attn_norm",
    "attn_q.weight": "q",
    "attn_k.weight": "k",
    "attn_v.weight": "v",
    "attn_output.weight": "o",
    "attn_q.bias": "q_bias",
    "attn_k.bias": "k_bias",
    "attn_v.bias": "v_bias",
    "ffn_norm.weight": "ffn_norm",
    "ffn_gate.weight": "gate",
    "ffn_up.weight": "up",
    "ffn_down.weight": "down",
}
# Hugging Face (LlamaForCausalLM / Qwen2ForCausalLM state dict) -> canonical. HF rows are already canonical
# (rotate_half Q/K order, [out, in]): only names change.
HF_GLOBAL_NAMES: dict[str, str] = {
    "model.embed_tokens.weight": "embed",
    "model.norm.weight": "norm",
    "lm_head.weight": "lm_head",
}
HF_LAYER_NAMES: dict[str, str] = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "q",
    "self_attn.k_proj.weight": "k",
    "self_attn.v_proj.weight": "v",
    "self_attn.o_proj.weight": "o",
    "self_attn.q_proj.bias": "q_bias",
    "self_attn.k_proj.bias": "k_bias",
    "self_attn.v_proj.bias": "v_bias",
    "post_attention_layernorm.weight": "ffn_norm",
    "mlp.gate_proj.weight": "gate",
    "mlp.up_proj.weight": "up",
    "mlp.down_proj.weight": "down",
}
HF_IGNORED = re.compile(r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")  # a buffer old checkpoints saved
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_BLK = re.compile(r"^blk\.(\d+)\.(.+)$")
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class Names:
    """One family's tensor names: GGUF and Hugging Face -> canonical, global and per layer ("blk.{i}." /
    "model.layers.{i}." stripped), plus GGUF tensors that are configuration, not weights (llama3's rope_freqs,
    phi3's rope factors: the family's config_from_gguf reads them, load_weights skips them)."""

    gguf_global: Mapping[str, str]
    gguf_layer: Mapping[str, str]
    hf_global: Mapping[str, str]
    hf_layer: Mapping[str, str]
    gguf_config: frozenset[str] = frozenset()

    def gguf_to_canonical(self, name: str) -> str | None:
        """GGUF tensor name -> canonical name, or None if the table does not know it."""
        return _to_canonical(name, self.gguf_global, _BLK, self.gguf_layer)

    def hf_to_canonical(self, name: str) -> str | None:
        """Hugging Face state-dict name -> canonical name, or None if the table does not know it."""
        return _to_canonical(name, self.hf_global, _HF_LAYER, self.hf_layer)

    def canonical_to_gguf(self, name: str) -> str:
        """Canonical name -> GGUF tensor name (the inverse of `gguf_to_canonical`); KeyError if unknown."""
        return _from_canonical(name, self.gguf_global, self.gguf_layer, "blk.")

    def canonical_to_hf(self, name: str) -> str:
        """Canonical name -> Hugging Face name (the inverse of `hf_to_canonical`); KeyError if unknown."""
        return _from_canonical(name, self.hf_global, self.hf_layer, "model.layers.")

    def extend(self, *, gguf_layer: Mapping[str, str] = {}, hf_layer: Mapping[str, str] = {},
               gguf_config: frozenset[str] = frozenset()) -> "Names":
        """These names plus a family's own (a key given here replaces the inherited entry)."""
        return Names(self.gguf_global, {**self.gguf_layer, **gguf_layer}, self.hf_global,
                     {**self.hf_layer, **hf_layer}, self.gguf_config | gguf_config)


def _to_canonical(name: str, globals_: Mapping[str, str], layer_re: re.Pattern, layer_names: Mapping[str, str]
                  ) -> str | None:
    if name in globals_:
        return globals_[name]
    m = layer_re.match(name)
    if m and m.group(2) in layer_names:
        return f"layers.{m.group(1)}.{layer_names[m.group(2)]}"
    return None


def _from_canonical(name: str, globals_: Mapping[str, str], layer_names: Mapping[str, str], prefix: str) -> str:
    for k, v in globals_.items():
        if v == name:
            return k
    m = _LAYER.match(name)
    if m:
        for k, v in layer_names.items():
            if v == m.group(2):
                return f"{prefix}{m.group(1)}.{k}"
    raise KeyError(f"no file name for canonical tensor {name!r}")


# Rope-scaling kinds as llama.cpp writes them in `{arch}.rope.scaling.type`.
_ROPE_KINDS = {"none": "none", "linear": "linear", "yarn": "yarn", "llama3": "llama3"}

# The llama tables; families extend them (Names.extend) with their own tensors.
LLAMA_NAMES = Names(GLOBAL_NAMES, LAYER_NAMES, HF_GLOBAL_NAMES, HF_LAYER_NAMES)


def gguf_to_canonical(name: str, names: Names = LLAMA_NAMES) -> str | None:
    """GGUF tensor name -> canonical name, or None if the table does not know it."""
    return names.gguf_to_canonical(name)


def hf_to_canonical(name: str, names: Names = LLAMA_NAMES) -> str | None:
    """Hugging Face state-dict name -> canonical name, or None if the table does not know it."""
    return names.hf_to_canonical(name)


def canonical_to_gguf(name: str, names: Names = LLAMA_NAMES) -> str:
    """Canonical name -> GGUF tensor name (the inverse of `gguf_to_canonical`); KeyError if unknown."""
    try:
        return names.canonical_to_gguf(name)
    except KeyError:
        raise KeyError(f"no GGUF name for canonical tensor {name!r}") from None


def same_layout(canonical: str, w: np.ndarray, config: ModelConfig) -> np.ndarray:
    """to_gguf_layout / from_gguf_layout of a family whose GGUF rows are canonical (NEOX RoPE: llama.cpp's converter
    permutes nothing; qwen2, qwen3, phi3)."""
    return w


def gguf_metadata(cfg: ModelConfig) -> dict[str, Any]:
    """Family-specific GGUF metadata keys a writer adds to the llama-like ones (default: none)."""
    return {}


def gguf_config_tensors(cfg: ModelConfig) -> dict[str, np.ndarray]:
    """GGUF tensors that carry configuration (names in Names.gguf_config) a writer adds (default: none)."""
    return {}


def _int(meta: Mapping[str, Any], key: str, default: int | None = None) -> int:
    v = meta.get(key, default)
    if v is None:
        raise ValueError(f"GGUF metadata lacks required key {key!r}")
    if isinstance(v, (list, tuple)):
        # Per-layer values (e.g. OpenELM head counts) need a per-layer config we do not have.
        raise ValueError(f"GGUF metadata {key!r} is a per-layer list {list(v)[:4]}...; not supported")
    return int(v)


def _float(meta: Mapping[str, Any], key: str) -> float:
    if meta.get(key) is None:
        raise ValueError(f"GGUF metadata lacks required key {key!r}")
    return float(meta[key])


def rope_scaling(meta: Mapping[str, Any], arch: str) -> RopeScaling:
    """`{arch}.rope.scaling.*` -> RopeScaling; absent or 'none' -> no scaling."""
    kind = str(meta.get(f"{arch}.rope.scaling.type", "none"))
    if kind not in _ROPE_KINDS:
        raise ValueError(f"unsupported rope scaling type {kind!r}; supported: {sorted(_ROPE_KINDS)}")
    if kind == "none":
        return RopeScaling()
    factor = float(meta.get(f"{arch}.rope.scaling.factor", 1.0))
    orig = int(meta.get(f"{arch}.rope.scaling.original_context_length", 0))
    return RopeScaling(kind=_ROPE_KINDS[kind], factor=factor, original_context=orig)


def special_ids(meta: Mapping[str, Any]) -> tuple[int | None, tuple[int, ...]]:
    """(bos id, eos ids): eos first, then end-of-turn / end-of-message ids if the file names them."""
    bos = meta.get("tokenizer.ggml.bos_token_id")
    eos: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        v = meta.get(key)
        if v is not None and int(v) not in eos:
            eos.append(int(v))
    return (None if bos is None else int(bos)), tuple(eos)


ROPE_FREQS = "rope_freqs.weight"  # llama3 GGUFs: [rope_dim/2] divisors of the RoPE frequencies (ggml freq_factors)


def refuse_gguf_variants(meta: Mapping[str, Any], arch: str) -> None:
    """ValueError naming the field and the family for GGUF variants no builder here runs (experts, SSM layers)."""
    for key, what in ((f"{arch}.expert_count", "mixture-of-experts"), (f"{arch}.ssm.state_size", "state-space (SSM)")):
        if meta.get(key):
            raise ValueError(f"{key} = {meta[key]}: {what} {arch} models are not built by specedge's {arch} family "
                             "(run the file with the llama.cpp backend)")


def gguf_rope_scaling(meta: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]], arch: str,
                      values: Callable[[str], np.ndarray] | None) -> RopeScaling:
    """The file's RoPE scaling: `{arch}.rope.scaling.*`, and llama3's rope_freqs tensor (per-frequency divisors,
    applied by llama.cpp on top of a linear factor) when the family reads it (`values`; None: refused)."""
    scaling = rope_scaling(meta, arch)
    if ROPE_FREQS not in tensors:
        return scaling
    if values is None:
        raise ValueError(f"tensor {ROPE_FREQS} (rope frequency factors) is not read by specedge's {arch} family")
    if scaling.kind not in ("none", "linear"):
        raise ValueError(f"tensor {ROPE_FREQS} with {arch}.rope.scaling.type {scaling.kind!r} is not supported "
                         f"by specedge's {arch} family (only with none or linear)")
    factors = np.asarray(values(ROPE_FREQS), np.float64).reshape(-1)
    if not np.all(np.isfinite(factors)) or not np.all(factors > 0):
        raise ValueError(f"tensor {ROPE_FREQS} holds non-positive or non-finite frequency factors")
    return RopeScaling(kind="freq_factors", factor=scaling.factor, freq_factors=tuple(factors.tolist()))


def llama_like_config(meta: Mapping[str, Any], tensors: Mapping[str, tuple[int, ...]], *, arch: str,
                      block: BlockSpec, values: Callable[[str], np.ndarray] | None = None,
                      partial_rotary: bool = False) -> ModelConfig:
    """ModelConfig from llama-style GGUF metadata; `tensors` maps GGUF tensor names to numpy shapes; `block` is the
    family's declaration, its q/k/v biases set by whether the file has them; `values` reads configuration tensors
    (rope_freqs) for a family that supports them; partial_rotary: a rope dimension_count below the head dim becomes
    block.rotary_fraction (phi3) instead of an error."""
    if "token_embd.weight" not in tensors:
        raise ValueError("the file has no token_embd.weight tensor")
    refuse_gguf_variants(meta, arch)
    d_model = _int(meta, f"{arch}.embedding_length")
    n_heads = _int(meta, f"{arch}.attention.head_count")
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab_default = len(tokens) if isinstance(tokens, (list, tuple)) else tensors["token_embd.weight"][0]
    rope_dim = meta.get(f"{arch}.rope.dimension_count")
    if n_heads < 1:
        raise ValueError(f"{arch}.attention.head_count is {n_heads}; it must be at least 1")
    # llama.cpp's default head dim is n_embd / n_head; a partial-rotary family's rope dim is not the head dim
    head_default = rope_dim if rope_dim is not None and not partial_rotary else d_model // n_heads
    head_dim = _int(meta, f"{arch}.attention.key_length", head_default)
    if rope_dim is not None and int(rope_dim) != head_dim:
        if not partial_rotary:
            raise ValueError(f"partial rotary embeddings (rope dim {rope_dim} < head dim {head_dim}) are not "
                             f"supported for {arch}")
        block = replace(block, rotary_fraction=rotary_fraction(int(rope_dim), head_dim, arch))
    scaling = gguf_rope_scaling(meta, tensors, arch, values)
    rotated = int(rope_dim) if rope_dim is not None else head_dim
    if scaling.freq_factors and len(scaling.freq_factors) != rotated // 2:
        raise ValueError(f"tensor {ROPE_FREQS} has {len(scaling.freq_factors)} factors; a rotary dim of {rotated} "
                         f"rotates {rotated // 2} frequencies")
    bos, eos = special_ids(meta)
    return ModelConfig(
        arch=arch,
        n_layers=_int(meta, f"{arch}.block_count"),
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=_int(meta, f"{arch}.attention.head_count_kv", n_heads),
        head_dim=head_dim,
        d_ff=_int(meta, f"{arch}.feed_forward_length"),
        vocab_size=_int(meta, f"{arch}.vocab_size", int(vocab_default)),
        rms_eps=_float(meta, f"{arch}.attention.layer_norm_rms_epsilon"),
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        context_length=_int(meta, f"{arch}.context_length", 2048),
        tied_embeddings="output.weight" not in tensors,
        block=replace(block, qkv_bias="blk.0.attn_q.bias" in tensors),
        rope_scaling=scaling,
        bos_id=bos,
        eos_ids=eos,
        name=str(meta.get("general.name", "")),
    )


def rotary_fraction(rope_dim: int, head_dim: int, arch: str) -> float:
    """rope_dim / head_dim as BlockSpec.rotary_fraction; ValueError unless it is an even dim in 2..head_dim that
    models/rope.rotary_dim gives back exactly."""
    frac = rope_dim / head_dim
    if not 2 <= rope_dim <= head_dim or rope_dim % 2 or int(head_dim * frac) // 2 * 2 != rope_dim:
        raise ValueError(f"{arch}: rotary dim {rope_dim} for head dim {head_dim} is not supported (an even number "
                         "from 2 to the head dim)")
    return frac


def _hf_value(hf: Mapping[str, Any], key: str, kind=int):
    if hf.get(key) is None:
        raise ValueError(f"config.json lacks required key {key!r}")
    return kind(hf[key])


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in value) if isinstance(value, (list, tuple)) else (int(value),)


def hf_rope(hf: Mapping[str, Any]) -> tuple[float, RopeScaling]:
    """(theta, scaling) from config.json: `rope_theta` + `rope_scaling` (transformers 4) or `rope_parameters` (5)."""
    params = hf.get("rope_parameters") or {}
    theta = float(hf.get("rope_theta", params.get("rope_theta", 10000.0)))
    scaling = hf.get("rope_scaling") or params
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in ("default", None):
        return theta, RopeScaling()
    factor = float(scaling.get("factor", 1.0))
    if kind == "linear":
        return theta, RopeScaling(kind="linear", factor=factor)
    if kind == "llama3":
        return theta, RopeScaling(kind="llama3", factor=factor,
                                  original_context=int(scaling["original_max_position_embeddings"]),
                                  low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
                                  high_freq_factor=float(scaling.get("high_freq_factor", 4.0)))
    raise ValueError(f"rope scaling {kind!r} is not built by specedge (supported: linear, llama3)")


def llama_like_config_from_hf(hf: Mapping[str, Any], *, arch: str, block: BlockSpec,
                              partial_rotary: bool = False) -> ModelConfig:
    """ModelConfig from a Hugging Face config.json of a llama-like model whose block the family declares;
    ValueError names what is not supported. partial_rotary: partial_rotary_factor < 1 becomes block.rotary_fraction
    (transformers rotates the first int(head_dim * factor) dims) instead of an error."""
    for key, what in (("num_local_experts", "mixture-of-experts"), ("num_experts", "mixture-of-experts"),
                      ("vision_config", "vision tower")):
        if hf.get(key):
            raise ValueError(f"config.json {key}: {what} {arch} models are not built by specedge's {arch} family")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"activation {hf['hidden_act']!r} is not supported (the builder runs SwiGLU with silu)")
    if hf.get("mlp_bias"):
        raise ValueError("MLP biases (mlp_bias: true) are not supported")
    partial = float(hf.get("partial_rotary_factor") or 1.0)
    if partial != 1.0 and not partial_rotary:
        raise ValueError(f"partial rotary embeddings (partial_rotary_factor {hf['partial_rotary_factor']}) "
                         f"are not supported for {arch}")
    d_model = _hf_value(hf, "hidden_size")
    n_heads = _hf_value(hf, "num_attention_heads")
    if partial != 1.0:
        head_dim = int(hf.get("head_dim") or d_model // n_heads)
        block = replace(block, rotary_fraction=rotary_fraction(int(head_dim * partial), head_dim, arch))
    theta, scaling = hf_rope(hf)
    eos = _ids(hf.get("eos_token_id"))
    bos = hf.get("bos_token_id")
    return ModelConfig(
        arch=arch,
        n_layers=_hf_value(hf, "num_hidden_layers"),
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=int(hf.get("num_key_value_heads") or n_heads),
        head_dim=int(hf.get("head_dim") or d_model // n_heads),
        d_ff=_hf_value(hf, "intermediate_size"),
        vocab_size=_hf_value(hf, "vocab_size"),
        rms_eps=_hf_value(hf, "rms_norm_eps", float),
        rope_theta=theta,
        context_length=int(hf.get("max_position_embeddings") or 2048),
        tied_embeddings=bool(hf.get("tie_word_embeddings", False)),
        block=block,
        rope_scaling=scaling,
        bos_id=None if bos is None else int(bos),
        eos_ids=eos,
    )
