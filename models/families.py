"""Registry of model families: `family(arch)` returns the module that knows that architecture.

Each family module exposes ARCH (the GGUF general.architecture and the Hugging Face model_type), BLOCK (its block
declaration, models/block.py: what the NumPy reference and the ONNX builders build), config_from_gguf(meta, tensors,
values) (`values` reads the configuration tensors NAMES.gguf_config, e.g. llama3's rope_freqs),
config_from_hf(config_json) (HF_MODEL_TYPES, optional: the config.json model_types it reads when not just
ARCH), NAMES (family_base.Names: its GGUF and Hugging Face tensor names, LLAMA_NAMES
extended with its own), from_gguf_layout / to_gguf_layout (row-order quirks), tokenizer_pre, and for writers
gguf_metadata(config) (its own GGUF keys) and gguf_config_tensors(config). Optional: DEFAULT_CHAT_TEMPLATE, used
when a GGUF file has no tokenizer.chat_template (gemma3).

Adding a family: write its module (ARCH, BLOCK, the config readers that refine BLOCK per checkpoint: biases, a
per-layer window or RoPE pattern, the embedding scale; its layout quirks; NAMES for tensors with new names) and list
it in _FAMILIES below. The NumPy reference and every ONNX profile build any block BLOCK can
declare; only a new kind of op (a field models/block.py does not have yet) touches the builders, once each:
runtime/backends/numpy_ref.py, export/onnx_block.py (shared by every profile) or the profiles' attention plumbing
(export/onnx_graph.py, export/onnx_static.py), each refusing what it cannot emit (BlockSpec.require).
"""
from __future__ import annotations

from types import ModuleType

from . import gemma3, llama, qwen2

_FAMILIES: dict[str, ModuleType] = {m.ARCH: m for m in (llama, qwen2, gemma3)}
SUPPORTED_ARCHS: tuple[str, ...] = tuple(sorted(_FAMILIES))
# Hugging Face model_type -> family, where it differs from ARCH (a module's optional HF_MODEL_TYPES).
_HF_TYPES: dict[str, ModuleType] = {t: m for m in _FAMILIES.values() for t in getattr(m, "HF_MODEL_TYPES", (m.ARCH,))}
HF_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_HF_TYPES))


def family(arch: str) -> ModuleType:
    """The family module for `arch` (GGUF general.architecture); ValueError if unsupported."""
    try:
        return _FAMILIES[arch]
    except KeyError:
        raise ValueError(f"unsupported model architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}") from None


def family_for_hf(model_type: str) -> ModuleType:
    """The family module for a Hugging Face config.json `model_type` (gemma3_text -> gemma3); ValueError if none."""
    try:
        return _HF_TYPES[model_type]
    except KeyError:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {', '.join(HF_MODEL_TYPES)}") from None
