"""Registry of model families: `family(arch)` returns the module that knows that architecture.

Each family module exposes ARCH (the GGUF general.architecture and the Hugging Face model_type), BLOCK (its block
declaration, models/block.py: what the NumPy reference and the ONNX builders build), config_from_gguf(meta, tensors), config_from_hf(config_json), GLOBAL_NAMES / LAYER_NAMES (GGUF -> canonical;
Hugging Face names are one table for all, family_base.HF_*), from_gguf_layout / to_gguf_layout (row-order quirks)
and tokenizer_pre.
"""
from __future__ import annotations

from types import ModuleType

from . import llama, qwen2

_FAMILIES: dict[str, ModuleType] = {m.ARCH: m for m in (llama, qwen2)}
SUPPORTED_ARCHS: tuple[str, ...] = tuple(sorted(_FAMILIES))


def family(arch: str) -> ModuleType:
    """The family module for `arch` (GGUF general.architecture); ValueError if unsupported."""
    try:
        return _FAMILIES[arch]
    except KeyError:
        raise ValueError(f"unsupported model architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}") from None
