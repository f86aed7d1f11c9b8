"""The backend registry: one declared descriptor per engine, the only place that says what an engine is.

    BackendKind -> BackendInfo(name, opens, package, distribution, extra, traits, open)
    info(kind), by_name(text), installed(kind), gguf_engines(), artifact_engine(), reference_engine()

The apps, the assembly layer (loading, the planner, the auto-tuner) and perf/ ask the registry instead of testing
BackendKind values: which engines open a GGUF and which an exported artifact, which package each needs (and the
pip extra that installs it), its display name, the package version a plan or profile depends on, whether it has
plain-decoding kernels faster than its batch-invariant ones, whether it tokenizes files our code cannot.

Adding a backend (docs/ARCHITECTURE.md, "Adding a backend"): its module under runtime/backends/ implementing the
Backend protocol with declared BackendCaps, one BackendKind member and one BackendInfo here (`open` builds it from a
GGUF; artifact engines are opened by their manifest in open_onnx), and its tests.
"""
from __future__ import annotations

import enum
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .base import Backend


class BackendKind(enum.Enum):
    NUMPY = "numpy"
    LLAMACPP = "llamacpp"
    IK = "ik"  # ik_llama.cpp through ik-llama-cpp-python's library: batch-invariant at any thread count
    NATIVE = "native"  # specedge's own C kernels (csrc/native): batch-invariant by construction, flat verify cost
    ONNX = "onnx"  # loads an exported artifact (manifest directory), not a GGUF


class Opens(enum.Enum):
    GGUF = "gguf"  # a GGUF file (a catalogue name, a path, a hub GGUF)
    ARTIFACT = "artifact"  # an exported ONNX artifact directory (manifest.json)


@dataclass(frozen=True)
class BackendInfo:
    """What one engine is, declared once.

    name: the display name (plan tables, bench rows); package: the module its code imports (None: always there);
    distribution: the pip distribution whose version keys plans and profiles; extra: the specedge extra installing
    it. plain_kernels: what its faster kernels for plain decoding are ("" : it has none), kernels that are not
    batch-invariant (opened with exact_batches=False when no drafter verifies batches; the planner measures them as
    a target of their own). reads_any_gguf: it runs GGUFs our family modules or
    tokenizers cannot read (its own tokenizer). reference: the speedup is stated against its plain decoding.
    devices: it takes --device (execution providers); draft_models: catalogue draft models (separate GGUFs) are
    planned on it; many_caches: one loaded model holds any number of KV caches (a draft of the same file shares
    its weights); planned: the planner measures it as a target where installed; gated: each file passes a gate
    before it runs (assembly/engine_gate.py: faithful call size, batch invariance), probe(backend, widths,
    prefixes) -> bool its batch-invariance probe. open: (gguf, n_ctx, n_threads, exact_batches, gpu_layers) -> Backend,
    for Opens.GGUF engines. gpu_offload: () -> whether the installed build offloads layers (--gpu-layers)."""
    kind: BackendKind
    name: str
    opens: Opens
    package: str | None
    distribution: str
    extra: str | None
    open: Callable[..., Backend] | None = None
    gpu_offload: Callable[[], bool] | None = None  # whether the installed build can put layers on a GPU (None: the
    #                                                engine takes no --gpu-layers)
    plain_kernels: str = ""
    reads_any_gguf: bool = False
    reference: bool = False
    devices: bool = False
    draft_models: bool = False
    many_caches: bool = False
    planned: bool = False
    gated: bool = False
    probe: Callable[..., bool] | None = None
    check: Callable[..., None] | None = None  # check(gguf): raises ValueError naming why this engine cannot run
    #                                           the file (a tensor format it lacks), before any gate or load
    why_missing: Callable[[], str | None] | None = None  # why the engine is not there (None: it is), for an
    #                                                      engine no pip extra installs (the native extension)

    @property
    def value(self) -> str:
        return self.kind.value

    def installed(self) -> bool:
        if self.why_missing is not None:
            return self.why_missing() is None
        return self.package is None or importlib.util.find_spec(self.package) is not None

    def version(self) -> str | None:
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None

    def offloads(self) -> bool:
        """Whether the installed build can put layers on a GPU (False where the engine or its library is missing;
        loading that library refuses it with its own message)."""
        if self.gpu_offload is None or not self.installed():
            return False
        try:
            return self.gpu_offload()
        except (ImportError, OSError):
            return False

    def gpu_layers(self, requested: int | None) -> int:
        """The layers this engine puts on a GPU for a request (--gpu-layers; None: not given): all (ALL_LAYERS)
        where the installed build can offload (llama_supports_gpu_offload: Metal, CUDA, Vulkan builds), else 0.
        ValueError naming the fix when a request cannot be honoured (a CPU-only build, an engine without layers)."""
        can = self.offloads()
        if requested is None:
            return ALL_LAYERS if can else 0
        if requested == 0 or can:
            return requested
        if self.gpu_offload is None:
            raise ValueError(f"--gpu-layers: the {self.name} backend has no layers to put on a GPU ("
                             + ("it takes --device for its execution provider" if self.devices else
                                "its build runs on the CPU") + "); leave --gpu-layers out")
        what = "all layers" if requested == ALL_LAYERS else f"{requested} layers"
        raise ValueError(f"--gpu-layers asks for {what} on a GPU, but this {self.name} build ({self.distribution} "
                         f"{self.version()}) has no GPU offload (llama_supports_gpu_offload() is false): install a "
                         "GPU build (CMAKE_ARGS=\"-DGGML_CUDA=on\", Metal is the default on macOS), or use "
                         "--gpu-layers 0")

    def missing(self) -> str:
        """One line: what to install for this engine (or why it is not there)."""
        if self.why_missing is not None:
            return f"{self.name} is missing: {self.why_missing()}"
        return f"{self.name} needs {self.package} (pip install 'specedge[{self.extra}]')"


ALL_LAYERS = -1  # --gpu-layers all: every layer on the GPU (llama.cpp's n_gpu_layers -1)


def parse_gpu_layers(text: str | int) -> int:
    """--gpu-layers N|all -> N (>= 0) or ALL_LAYERS; ValueError naming the accepted forms."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    elif str(text).strip().lower() == "all":
        return ALL_LAYERS
    else:
        try:
            value = int(str(text).strip())
        except ValueError:
            value = -2
    if value < 0 and value != ALL_LAYERS:
        raise ValueError(f"--gpu-layers takes a number of layers (0 or more) or 'all', not {text!r}")
    return value


def describe_gpu_layers(layers: int, total: int | None = None) -> str:
    """Where the layers run, for one line: 'on the CPU' | 'all layers on the GPU' | '12 of 30 layers on the GPU'."""
    if layers == 0:
        return "on the CPU"
    if layers == ALL_LAYERS or (total is not None and layers >= total):
        return "all layers on the GPU"
    return f"{layers} of {total} layers on the GPU" if total else f"{layers} layers on the GPU"


def _llamacpp_offloads() -> bool:
    import llama_cpp
    return bool(llama_cpp.llama_supports_gpu_offload())


def _open_numpy(gguf, *, n_ctx=None, n_threads=None, exact_batches=True, dtype=np.float32, **_) -> Backend:
    from .numpy_ref import NumpyBackend
    return NumpyBackend(gguf.load_weights(), dtype=dtype)


def _open_llamacpp(gguf, *, n_ctx=None, n_threads=None, exact_batches=True, dtype=None, gpu_layers=0, **_
                   ) -> Backend:
    from ...models.gguf_any import MetadataGGUF
    from .llamacpp import LlamaCppBackend
    no_weights = gguf.unsupported if isinstance(gguf, MetadataGGUF) else None
    return LlamaCppBackend(gguf.path, gguf.config, n_ctx=n_ctx, n_threads=n_threads, flash_attn=exact_batches,
                           no_weights=no_weights, gpu_layers=gpu_layers)


def _open_ik(gguf, *, n_ctx=None, n_threads=None, exact_batches=True, max_call=None, batch_invariant=True,
             plain_faithful=True, gpu_layers=0, **_) -> Backend:
    """exact_batches=False: repacked weights (its plain kernels) where the file's gate found them faithful."""
    from ...models.gguf_any import MetadataGGUF
    from .ik import DEFAULT_MAX_CALL, IkBackend
    no_weights = gguf.unsupported if isinstance(gguf, MetadataGGUF) else None
    return IkBackend(gguf.path, gguf.config, n_ctx=n_ctx, n_threads=n_threads, max_call=max_call or DEFAULT_MAX_CALL,
                     batch_invariant=batch_invariant, no_weights=no_weights, gpu_layers=gpu_layers,
                     repack=not exact_batches and plain_faithful)


def _open_native(gguf, *, n_ctx=None, n_threads=None, exact_batches=True, **_) -> Backend:
    """max_call and the gate's other tunings do not apply: every call size computes the same rows."""
    from .native import NativeBackend
    _check_native(gguf)
    return NativeBackend(gguf, n_threads=n_threads)


def _check_native(gguf) -> None:
    from ...models.gguf_any import MetadataGGUF
    from .native import NativeUnsupported, check_model
    if isinstance(gguf, MetadataGGUF):
        raise NativeUnsupported(f"the native engine runs the families specedge reads; {gguf.unsupported}")
    check_model(gguf.config, gguf.tensor_types())


def _native_missing() -> str | None:
    from .native_lib import available
    return available()


def _probe_native(backend, widths, prefixes) -> bool:
    from .base import probe_batch_invariance
    return probe_batch_invariance(backend, widths, prefixes)


def _probe_ik(backend, widths, prefixes) -> bool:
    from .ik import batch_invariant
    return batch_invariant(backend, widths, prefixes)


REGISTRY: dict[BackendKind, BackendInfo] = {i.kind: i for i in (
    BackendInfo(BackendKind.LLAMACPP, "llama.cpp", Opens.GGUF, "llama_cpp", "llama_cpp_python", "llama",
                _open_llamacpp, _llamacpp_offloads, plain_kernels="without flash attention", reads_any_gguf=True,
                reference=True, draft_models=True, planned=True),
    # ik: gpu_offload None, the pinned wheel (SUPPORTED in ik.py) is a CPU build (llama_supports_gpu_offload false)
    BackendInfo(BackendKind.IK, "ik_llama.cpp", Opens.GGUF, "ik_llama_cpp", "ik-llama-cpp-python", "ik", _open_ik,
                plain_kernels="repacked", reads_any_gguf=True, draft_models=True, planned=True, gated=True,
                probe=_probe_ik),
    BackendInfo(BackendKind.NATIVE, "native", Opens.GGUF, None, "specedge", None, _open_native,
                draft_models=True, many_caches=True, planned=True, gated=True, probe=_probe_native,
                check=_check_native, why_missing=_native_missing),
    BackendInfo(BackendKind.ONNX, "onnx", Opens.ARTIFACT, "onnxruntime", "onnxruntime", "onnx", devices=True,
                planned=True),
    BackendInfo(BackendKind.NUMPY, "numpy", Opens.GGUF, None, "numpy", None, _open_numpy, many_caches=True),
)}


def info(kind: BackendKind | str) -> BackendInfo:
    """The descriptor of a kind (or its value, as plans and --backend store it); ValueError naming the choices."""
    try:
        return REGISTRY[kind if isinstance(kind, BackendKind) else BackendKind(kind)]
    except (ValueError, KeyError):
        raise ValueError(f"unknown backend {kind!r}; choose one of {', '.join(backend_names())}") from None


def backend_names() -> list[str]:
    """The --backend choices."""
    return [k.value for k in REGISTRY]


def gguf_engines(installed: bool = True) -> list[BackendInfo]:
    """The engines that open a GGUF, in the registry's order of preference (the default first)."""
    return [i for i in REGISTRY.values() if i.opens is Opens.GGUF and (i.installed() or not installed)]


def default_gguf_engine() -> BackendInfo:
    """The engine a GGUF names when none is asked for: the first GGUF engine that reads any GGUF."""
    return next(i for i in REGISTRY.values() if i.opens is Opens.GGUF and i.reads_any_gguf)


def artifact_engine() -> BackendInfo:
    """The engine an exported artifact names."""
    return next(i for i in REGISTRY.values() if i.opens is Opens.ARTIFACT)


def engines_found() -> dict[str, str | None]:
    """Display name -> installed version (None: not installed), in the registry's order."""
    return {i.name: (i.version() if i.installed() else None) for i in REGISTRY.values()}


def engines_line() -> str:
    """'engines: llama.cpp 0.3.36, ik_llama.cpp 0.1.5, onnx 1.32.0, numpy 2.4.6' (+ '; not installed: ...')."""
    found = engines_found()
    have = [f"{n} {v}" for n, v in found.items() if v is not None]
    missing = [f"{i.name} (pip install 'specedge[{i.extra}]')" for i in REGISTRY.values()
               if found[i.name] is None and i.extra]
    return "engines: " + ", ".join(have) + (f"; not installed: {', '.join(missing)}" if missing else "")


def reference_engine() -> BackendInfo:
    """The float reference every other engine is checked against (parity gates, layer plans, LoRA-Drop fits)."""
    return REGISTRY[BackendKind.NUMPY]
