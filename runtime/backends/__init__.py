"""Backends behind one protocol; `open_backend` builds one from a GGUF model by kind."""
from __future__ import annotations

import enum

import numpy as np

from .base import Backend, BackendCaps, KVCache, LayerPlan


class BackendKind(enum.Enum):
    NUMPY = "numpy"
    LLAMACPP = "llamacpp"
    ONNX = "onnx"  # loads an exported artifact (manifest directory), not a GGUF: apps/engine.py


def open_backend(kind: BackendKind, gguf, *, n_ctx: int | None = None, n_threads: int | None = None,
                 dtype=np.float32) -> Backend:
    """gguf: an export.gguf_in.GGUFModel. The NumPy backend dequantizes to float32 (or float64)."""
    if kind is BackendKind.NUMPY:
        from .numpy_ref import NumpyBackend
        return NumpyBackend(gguf.load_weights(), dtype=dtype)
    if kind is BackendKind.LLAMACPP:
        from .llamacpp import LlamaCppBackend
        return LlamaCppBackend(gguf.path, gguf.config, n_ctx=n_ctx, n_threads=n_threads)
    if kind is BackendKind.ONNX:
        raise ValueError("the ONNX backend runs exported artifacts, not GGUF files: run `specedge export MODEL "
                         "--format onnx` and pass the output directory (or its catalogue-style name)")
    raise ValueError(f"unknown backend {kind!r}; choose one of {[k.value for k in BackendKind]}")


__all__ = ["Backend", "BackendCaps", "BackendKind", "KVCache", "LayerPlan", "open_backend"]
