"""Backends behind one protocol, declared in the registry (registry.py); `open_backend` builds a GGUF engine's
backend from a GGUF model, `open_onnx` the artifact engine's from an exported artifact by its manifest's format."""
from __future__ import annotations

from importlib import import_module
from pathlib import Path

import numpy as np

from ...models.manifest import FORMAT, OPTIMUM_FORMAT, Manifest, Profile, read_manifest
from .base import Backend, BackendCaps, Cache, LayerPlan, TokenizingBackend
from .registry import (ALL_LAYERS, REGISTRY, BackendInfo, BackendKind, Opens, artifact_engine,  # noqa: F401
                       backend_names, default_gguf_engine, describe_gpu_layers, gguf_engines, info, parse_gpu_layers,
                       reference_engine)

# manifest format -> (module, class) of the backend that runs that graph layout (imported on use: onnxruntime)
ONNX_BACKENDS: dict[str, tuple[str, str]] = {
    FORMAT: (".onnxrt", "OnnxBackend"),
    OPTIMUM_FORMAT: (".onnx_optimum", "OptimumBackend"),
}


def open_backend(kind: BackendKind, gguf, *, n_ctx: int | None = None, n_threads: int | None = None,
                 dtype=np.float32, exact_batches: bool = True, gpu_layers: int = 0, **tuning) -> Backend:
    """The backend of a GGUF engine (runtime/backends/registry.py) over a models.gguf_in.GGUFModel, or for an
    engine that reads any GGUF a models.gguf_any.MetadataGGUF (an architecture without a family module: the NumPy
    backend refuses it with the family message). The NumPy backend dequantizes to float32 (or float64).
    exact_batches=False: for plain decoding only, an engine with plain-decoding kernels uses them (llama.cpp
    without flash attention: about 8% faster one-token steps on 2 AVX2 cores; its verify batches then differ from
    one-token calls, so a drafter would not be lossless). tuning: what a gated engine's gate found for the file
    (max_call, batch_invariant; assembly/engine_gate.py). gpu_layers: layers the engine offloads (resolved by
    BackendInfo.gpu_layers: ALL_LAYERS, N or 0)."""
    engine = info(kind)
    if engine.open is None:
        raise ValueError(f"the {engine.name} backend runs exported artifacts, not GGUF files: run `specedge export "
                         "MODEL --format onnx` and pass the output directory (or its catalogue-style name)")
    if gpu_layers and engine.gpu_offload is None:
        engine.gpu_layers(gpu_layers)  # raises: this engine takes no --gpu-layers
    return engine.open(gguf, n_ctx=n_ctx, n_threads=n_threads, exact_batches=exact_batches, dtype=dtype,
                       gpu_layers=gpu_layers, **tuning)


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


__all__ = ["ALL_LAYERS", "Backend", "BackendCaps", "BackendInfo", "BackendKind", "Cache", "LayerPlan", "Opens",
           "TokenizingBackend",
           "artifact_engine", "backend_names", "default_gguf_engine", "describe_gpu_layers", "gguf_engines", "info",
           "open_backend", "open_onnx", "parse_gpu_layers", "reference_engine"]
