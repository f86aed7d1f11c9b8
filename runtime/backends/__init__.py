"""Backends behind one protocol; `open_backend` builds one from a GGUF model by kind, `open_onnx` one from an
exported artifact by its manifest's format."""
from __future__ import annotations

import enum
from importlib import import_module
from pathlib import Path

import numpy as np

from ...models.manifest import FORMAT, OPTIMUM_FORMAT, Manifest, Profile, read_manifest
from .base import Backend, BackendCaps, KVCache, LayerPlan, TokenizingBackend

# manifest format -> (module, class) of the backend that runs that graph layout (imported on use: onnxruntime)
ONNX_BACKENDS: dict[str, tuple[str, str]] = {
    FORMAT: (".onnxrt", "OnnxBackend"),
    OPTIMUM_FORMAT: (".onnx_optimum", "OptimumBackend"),
}


class BackendKind(enum.Enum):
    NUMPY = "numpy"
    LLAMACPP = "llamacpp"
    ONNX = "onnx"  # loads an exported artifact (manifest directory), not a GGUF: apps/engine.py


def open_backend(kind: BackendKind, gguf, *, n_ctx: int | None = None, n_threads: int | None = None,
                 dtype=np.float32, exact_batches: bool = True) -> Backend:
    """gguf: a models.gguf_in.GGUFModel, or for llama.cpp a models.gguf_any.MetadataGGUF (an architecture without a
    family module: the NumPy backend refuses it with the family message). The NumPy backend dequantizes to float32 (or float64). exact_batches=False:
    for plain decoding only, llama.cpp runs without flash attention (about 8% faster one-token steps on 2 AVX2
    cores; its verify batches then differ from one-token calls, so a drafter would not be lossless)."""
    if kind is BackendKind.NUMPY:
        from .numpy_ref import NumpyBackend
        return NumpyBackend(gguf.load_weights(), dtype=dtype)
    if kind is BackendKind.LLAMACPP:
        from ...models.gguf_any import MetadataGGUF
        from .llamacpp import LlamaCppBackend
        no_weights = gguf.unsupported if isinstance(gguf, MetadataGGUF) else None
        return LlamaCppBackend(gguf.path, gguf.config, n_ctx=n_ctx, n_threads=n_threads, flash_attn=exact_batches,
                               no_weights=no_weights)
    if kind is BackendKind.ONNX:
        raise ValueError("the ONNX backend runs exported artifacts, not GGUF files: run `specedge export MODEL "
                         "--format onnx` and pass the output directory (or its catalogue-style name)")
    raise ValueError(f"unknown backend {kind!r}; choose one of {[k.value for k in BackendKind]}")


def open_onnx(manifest: Manifest | str | Path, *, device: str = "cpu", threads: int | None = None,
              verify: bool = True, log=None) -> Backend:
    """The ONNX Runtime backend for an exported artifact, chosen by its manifest's `format` and `profile`."""
    if not isinstance(manifest, Manifest):
        manifest = read_manifest(manifest, verify=verify)
    module, cls = ONNX_BACKENDS[manifest.format]  # read_manifest accepts only formats listed there
    if manifest.profile is Profile.STATIC:  # our builder's static-shape profile (NPU providers)
        module, cls = ".onnx_static", "StaticOnnxBackend"
    elif manifest.profile is Profile.LAYERED:  # one session per segment: layer plans, hidden states
        module, cls = ".onnx_layered", "OnnxLayeredBackend"
    return getattr(import_module(module, __name__), cls)(manifest, device=device, threads=threads, log=log)


__all__ = ["Backend", "BackendCaps", "BackendKind", "KVCache", "LayerPlan", "TokenizingBackend", "open_backend",
           "open_onnx"]
