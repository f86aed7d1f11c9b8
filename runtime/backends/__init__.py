"""Backends behind one protocol, declared in the registry (registry.py); `open_backend` builds a GGUF engine's
backend from a GGUF model, `open_onnx` the artifact engine's from an exported artifact by its manifest's format."""
from __future__ import annotations

from importlib import import_module
from pathlib import Path

from ...models.manifest import FORMAT, OPTIMUM_FORMAT, Manifest, Profile, read_manifest
from .base import Backend, BackendCaps, Cache, LayerPlan, TokenizingBackend, Variance
from .blas import quiet_blas
from .registry import (ALL_LAYERS, REGISTRY, BackendInfo, BackendKind, GateTuning, Kernels,  # noqa: F401
                       OpenSettings, Opens, artifact_engine, backend_names, default_gguf_engine, describe_gpu_layers,
                       gguf_engines, info, parse_gpu_layers, reference_engine)

# manifest format -> (module, class) of the backend that runs that graph layout (imported on use: onnxruntime)
ONNX_BACKENDS: dict[str, tuple[str, str]] = {
    FORMAT: (".onnxrt", "OnnxBackend"),
    OPTIMUM_FORMAT: (".onnx_optimum", "OptimumBackend"),
}


def open_backend(kind: BackendKind, gguf, settings: OpenSettings = OpenSettings()) -> Backend:
    """The backend of a GGUF engine (runtime/backends/registry.py) over a models.gguf_in.GGUFModel, or for an
    engine that reads any GGUF a models.gguf_any.MetadataGGUF (an architecture without a family module: the NumPy
    backend refuses it with the family message). settings.kernels FAST_PLAIN_ONLY: for plain decoding only, an
    engine's faster kernels (llama.cpp without flash attention: about 8% faster one-token steps on 2 AVX2 cores;
    its verify batches then differ from one-token calls, so a drafter would not be lossless). settings.tuning:
    what a gated engine's gate found for the file (assembly/engine_gate.py). ValueError for what the engine
    cannot honour (BackendInfo.open_gguf)."""
    return info(kind).open_gguf(gguf, settings)


def open_onnx(manifest: Manifest | str | Path, *, device: str = "cpu", threads: int | None = None,
              verify: bool = True, log=None) -> Backend:
    """The ONNX Runtime backend for an exported artifact, chosen by its manifest's `format` and `profile`."""
    if not isinstance(manifest, Manifest):
        manifest = read_manifest(manifest, verify=verify)
    quiet_blas()  # ONNX Runtime computes on its own threads (runtime/backends/blas.py)
    module, cls = ONNX_BACKENDS[manifest.format]  # read_manifest accepts only formats listed there
    if manifest.profile is Profile.STATIC:  # our builder's static-shape profile (NPU providers)
        module, cls = ".onnx_static", "StaticOnnxBackend"
    elif manifest.profile is Profile.LAYERED:  # one session per segment: layer plans, hidden states
        module, cls = ".onnx_layered", "OnnxLayeredBackend"
    return getattr(import_module(module, __name__), cls)(manifest, device=device, threads=threads, log=log)


__all__ = ["ALL_LAYERS", "Backend", "BackendCaps", "BackendInfo", "BackendKind", "Cache", "GateTuning", "Kernels",
           "LayerPlan", "OpenSettings", "Opens", "TokenizingBackend", "Variance",
           "artifact_engine", "backend_names", "default_gguf_engine", "describe_gpu_layers", "gguf_engines", "info",
           "open_backend", "open_onnx", "parse_gpu_layers", "reference_engine"]
