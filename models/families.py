"""Registry of model families: `family(arch)` returns the module that knows that architecture.

Each family module exposes ARCH (the GGUF general.architecture and the Hugging Face model_type), BLOCK (its block
declaration, models/block.py: what the NumPy reference and the ONNX builders build), config_from_gguf(meta, tensors,
values) (`values` reads the configuration tensors NAMES.gguf_config, e.g. llama3's rope_freqs),
config_from_hf(config_json) and HF_MODEL_TYPES (the config.json model_types it reads: ARCH, or gemma3_text),
NAMES (family_base.Names: its GGUF and Hugging Face tensor names, LLAMA_NAMES extended with its own),
from_gguf_layout / to_gguf_layout (row-order quirks), tokenizer_pre, DEFAULT_CHAT_TEMPLATE and END_OF_TURN (None, or
gemma3's turn template for a file without one and its <end_of_turn> stop token), and for writers
gguf_metadata(config) (its own GGUF keys) and gguf_config_tensors(config).

Adding a family: write its module (ARCH, BLOCK, the config readers that refine BLOCK per checkpoint: biases, a
per-layer window or RoPE pattern, the embedding scale; its layout quirks; NAMES for tensors with new names) and list
it in _FAMILIES below. The NumPy reference and every ONNX profile build any block BLOCK can
declare; only a new kind of op (a field models/block.py does not have yet) touches the builders, once each:
runtime/backends/numpy_ref.py, export/onnx_block.py (shared by every profile) or the profiles' attention plumbing
(export/onnx_graph.py, export/onnx_static.py), each refusing what it cannot emit with UnsupportedVariant
(export/onnx_graph.py check_dynamic).
"""
from __future__ import annotations

from types import ModuleType

from . import gemma3, llama, mistral, phi3, qwen2, qwen3, smollm3

_FAMILIES: dict[str, ModuleType] = {m.ARCH: m for m in (llama, qwen2, qwen3, smollm3, phi3, mistral, gemma3)}
SUPPORTED_ARCHS: tuple[str, ...] = tuple(sorted(_FAMILIES))
# Hugging Face model_type -> family (each module's HF_MODEL_TYPES: its ARCH, or others such as gemma3_text).
_HF_TYPES: dict[str, ModuleType] = {t: m for m in _FAMILIES.values() for t in m.HF_MODEL_TYPES}
HF_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_HF_TYPES))
# Variants of a supported family that are architectures of their own (GGUF general.architecture or Hugging Face
# model_type) -> (family, what no builder here runs): refused by name rather than as an unknown architecture.
VARIANTS: dict[str, tuple[str, str]] = {
    "qwen3moe": ("qwen3", "mixture of experts"), "qwen3_moe": ("qwen3", "mixture of experts"),
    "qwen3next": ("qwen3", "hybrid linear attention / mixture of experts"),
    "qwen3_next": ("qwen3", "hybrid linear attention / mixture of experts"),
    "qwen3vl": ("qwen3", "vision tower"), "qwen3_vl": ("qwen3", "vision tower"),
    "qwen2moe": ("qwen2", "mixture of experts"), "qwen2_moe": ("qwen2", "mixture of experts"),
    "qwen2vl": ("qwen2", "vision tower"), "qwen2_vl": ("qwen2", "vision tower"),
    "mixtral": ("llama", "mixture of experts"), "llama4": ("llama", "mixture of experts, vision tower"),
    "mllama": ("llama", "vision tower"),
}


def unsupported_variant(arch: str) -> str | None:
    """A message naming the field and the family when `arch` is a known variant no builder here runs, else None."""
    if arch not in VARIANTS:
        return None
    fam, what = VARIANTS[arch]
    return (f"architecture {arch!r} (general.architecture / model_type) is the {what} variant of the {fam} family, "
            f"which specedge's {fam} builders do not run; run a GGUF of it with the llama.cpp backend")


def family(arch: str) -> ModuleType:
    """The family module for `arch` (GGUF general.architecture); ValueError if unsupported."""
    try:
        return _FAMILIES[arch]
    except KeyError:
        if (why := unsupported_variant(arch)) is not None:
            raise ValueError(why) from None
        raise ValueError(f"unsupported model architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}") from None


def family_for_hf(model_type: str) -> ModuleType:
    """The family module for a Hugging Face config.json `model_type` (gemma3_text -> gemma3); ValueError if none."""
    try:
        return _HF_TYPES[model_type]
    except KeyError:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {', '.join(HF_MODEL_TYPES)}") from None
