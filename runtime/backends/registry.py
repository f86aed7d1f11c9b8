"""The backend registry: one declared descriptor per engine, the only place that says what an engine is.

    BackendKind -> BackendInfo(name, opens, package, distribution, extra, traits, open)
    info(kind), by_name(text), installed(kind), gguf_engines(), artifact_engine(), reference_engine()
    info(kind).open_gguf(gguf, OpenSettings(n_ctx, n_threads, Kernels, gpu_layers, GateTuning)) -> Backend

The apps, the assembly layer (loading, the planner, the auto-tuner) and perf/ ask the registry instead of testing
BackendKind values: which engines open a GGUF and which an exported artifact, which package each needs (and the
pip extra that installs it), its display name, the package version a plan or profile depends on, whether it has
plain-decoding kernels faster than its batch-invariant ones (Kernels), whether it tokenizes files our code cannot.

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

from .base import Backend
from .blas import quiet_blas


class BackendKind(enum.Enum):
    NUMPY = "numpy"
    LLAMACPP = "llamacpp"
    IK = "ik"  # ik_llama.cpp through ik-llama-cpp-python's library: batch-invariant at any thread count
    NATIVE = "native"  # specedge's own C kernels (csrc/native): batch-invariant by construction, flat verify cost
    ONNX = "onnx"  # loads an exported artifact (manifest directory), not a GGUF


class Kernels(enum.Enum):
    """Which kernels a GGUF engine computes with: one meaning, where "plain" alone also meant "no drafter"."""
    EXACT = "exact"  # its batch-invariant kernels: verify batches may be used (speculation stays lossless)
    FAST_PLAIN_ONLY = "fast-plain-only"  # its faster kernels (BackendInfo.fast_kernels), whose verify batches round
    #                                      differently from one-token calls: for plain decoding only


@dataclass(frozen=True)
class GateTuning:
    """What a gated engine's per-file gate found (assembly/engine_gate.py Gate), the one tuning value its opener
    takes. The defaults are an ungated open's: the engine's own call size, invariance claimed, fast kernels allowed."""
    max_call: int | None = None  # rows per engine call (ik's ubatch); None: the engine's default
    batch_invariant: bool = True  # its verify batches equal one-token calls at these threads (the gate's probe)
    fast_faithful: bool = True  # its fast kernels agree with the reference on this file (Kernels.FAST_PLAIN_ONLY
    #                             opens them only then)

    def __post_init__(self) -> None:
        if self.max_call is not None and self.max_call < 1:
            raise ValueError(f"max_call must be >= 1 (None: the engine's default), got {self.max_call}")


@dataclass(frozen=True)
class OpenSettings:
    """How a GGUF engine's opener builds its backend (BackendInfo.open(gguf, OpenSettings)); open_gguf checks it
    against the engine's traits first, so an opener reads only what its engine declares.
    n_ctx: KV positions (None: the model's context); n_threads: None is runtime.cores.default_threads();
    kernels: FAST_PLAIN_ONLY only on an engine with fast_kernels; gpu_layers: resolved by BackendInfo.gpu_layers
    (ALL_LAYERS, N or 0), non-zero only on an engine that offloads; tuning: only for a gated engine."""
    n_ctx: int | None = None
    n_threads: int | None = None
    kernels: Kernels = Kernels.EXACT
    gpu_layers: int = 0
    tuning: GateTuning = GateTuning()


class Opens(enum.Enum):
    GGUF = "gguf"  # a GGUF file (a catalogue name, a path, a hub GGUF)
    ARTIFACT = "artifact"  # an exported ONNX artifact directory (manifest.json)


@dataclass(frozen=True)
class BackendInfo:
    """What one engine is, declared once.

    name: the display name (plan tables, bench rows); package: the module its code imports (None: always there);
    distribution: the pip distribution whose version keys plans and profiles; extra: the specedge extra installing
    it. fast_kernels: what its faster kernels for plain decoding are (None: it has none), kernels that are not
    batch-invariant (opened with Kernels.FAST_PLAIN_ONLY when no drafter verifies batches; the planner measures them
    as a target of their own). reads_any_gguf: it runs GGUFs our family modules or
    tokenizers cannot read (its own tokenizer). reference: the speedup is stated against its plain decoding.
    devices: it takes --device (execution providers); draft_models: catalogue draft models (separate GGUFs) are
    planned on it; many_caches: one loaded model holds any number of KV caches (a draft of the same file shares
    its weights); planned: the planner measures it as a target where installed; gated: each file passes a gate
    before it runs (assembly/engine_gate.py: faithful call size, batch invariance), probe(backend, widths,
    prefixes) -> bool its batch-invariance probe, GateTuning what its opener takes from the gate. open: (gguf,
    OpenSettings) -> Backend, for Opens.GGUF engines (open_gguf checks the settings first). gpu_offload: () ->
    whether the installed build offloads layers (--gpu-layers)."""
    kind: BackendKind
    name: str
    opens: Opens
    package: str | None
    distribution: str
    extra: str | None
    open: Callable[[object, OpenSettings], Backend] | None = None
    gpu_offload: Callable[[], bool] | None = None  # whether the installed build can put layers on a GPU (None: the
    #                                                engine takes no --gpu-layers)
    fast_kernels: str | None = None
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
    build_id: Callable[[], str | None] | None = None  # which build of an engine compiled with specedge (its library's
    #                                                   digest): a rebuild within one version re-keys the profiles

    @property
    def value(self) -> str:
        return self.kind.value

    def installed(self) -> bool:
        if self.why_missing is not None:
            return self.why_missing() is None
        return self.package is None or importlib.util.find_spec(self.package) is not None

    def version(self) -> str | None:
        try:
            version = importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None
        build = self.build_id() if self.build_id is not None else None
        return f"{version}+{build}" if build else version

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

    def kernels(self, plain: bool) -> Kernels:
        """The kernels a run opens this engine with: its fast ones for plain decoding (no drafter) where it has them,
        else its exact ones."""
        return Kernels.FAST_PLAIN_ONLY if plain and self.fast_kernels is not None else Kernels.EXACT

    def open_gguf(self, gguf, settings: OpenSettings = OpenSettings()) -> Backend:
        """This engine's backend over a GGUF (models.gguf_in.GGUFModel, or a models.gguf_any.MetadataGGUF for an
        engine that reads any GGUF). ValueError naming the fix for what the engine cannot honour: an artifact
        engine, fast kernels it does not have, GPU layers it cannot offload, a gate's tuning on an ungated engine."""
        if self.open is None:
            raise ValueError(f"the {self.name} backend runs exported artifacts, not GGUF files: run `specedge export "
                             "MODEL --format onnx` and pass the output directory (or its catalogue-style name)")
        if settings.kernels is Kernels.FAST_PLAIN_ONLY and self.fast_kernels is None:
            raise ValueError(f"the {self.name} backend has no faster plain-decoding kernels: open it with "
                             "Kernels.EXACT")
        if settings.gpu_layers and self.gpu_offload is None:
            self.gpu_layers(settings.gpu_layers)  # raises: this engine takes no --gpu-layers
        if settings.tuning != GateTuning() and not self.gated:
            raise ValueError(f"the {self.name} backend has no per-file gate, so no gate tuning "
                             f"({settings.tuning}); leave it out")
        if self.kind is not BackendKind.NUMPY:  # an engine on its own threads: NumPy's BLAS must not spin beside it
            quiet_blas()
        return self.open(gguf, settings)

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


def _open_numpy(gguf, how: OpenSettings) -> Backend:
    """float32 weights; the cache takes its length at new_cache, NumPy's BLAS its own threads."""
    from .numpy_ref import NumpyBackend
    return NumpyBackend(gguf.load_weights())


def _no_weights(gguf) -> str | None:
    """Why our code cannot read a file's weights (a GGUF without a family module), for the engines that run it."""
    from ...models.gguf_any import MetadataGGUF
    return gguf.unsupported if isinstance(gguf, MetadataGGUF) else None


def _open_llamacpp(gguf, how: OpenSettings) -> Backend:
    """Kernels.FAST_PLAIN_ONLY: without flash attention."""
    from .llamacpp import LlamaCppBackend
    return LlamaCppBackend(gguf.path, gguf.config, n_ctx=how.n_ctx, n_threads=how.n_threads,
                           flash_attn=how.kernels is Kernels.EXACT, no_weights=_no_weights(gguf),
                           gpu_layers=how.gpu_layers)


def _open_ik(gguf, how: OpenSettings) -> Backend:
    """Kernels.FAST_PLAIN_ONLY: repacked weights (its fast kernels) where the file's gate found them faithful."""
    from .ik import IkBackend
    return IkBackend(gguf.path, gguf.config, n_ctx=how.n_ctx, n_threads=how.n_threads, tuning=how.tuning,
                     no_weights=_no_weights(gguf), gpu_layers=how.gpu_layers,
                     repack=how.kernels is Kernels.FAST_PLAIN_ONLY and how.tuning.fast_faithful)


def _open_native(gguf, how: OpenSettings) -> Backend:
    """The gate's max_call does not apply (every call size computes the same rows); its probe's verdict does."""
    from .native import NativeBackend
    _check_native(gguf)
    return NativeBackend(gguf, n_threads=how.n_threads, batch_invariant=how.tuning.batch_invariant)


def _check_native(gguf) -> None:
    from ...models.gguf_any import MetadataGGUF
    from .native import NativeUnsupported, check_model
    if isinstance(gguf, MetadataGGUF):
        raise NativeUnsupported(f"the native engine runs the families specedge reads; {gguf.unsupported}")
    check_model(gguf.config, gguf.tensor_types())


def _native_missing() -> str | None:
    from .native_lib import available
    return available()


def _native_build() -> str | None:
    from .native_lib import build_id
    return build_id()


def _probe_native(backend, widths, prefixes) -> bool:
    from .base import probe_batch_invariance
    return probe_batch_invariance(backend, widths, prefixes)


def _probe_ik(backend, widths, prefixes) -> bool:
    from .ik import batch_invariant
    return batch_invariant(backend, widths, prefixes)


REGISTRY: dict[BackendKind, BackendInfo] = {i.kind: i for i in (
    BackendInfo(BackendKind.LLAMACPP, "llama.cpp", Opens.GGUF, "llama_cpp", "llama_cpp_python", "llama",
                _open_llamacpp, _llamacpp_offloads, fast_kernels="without flash attention", reads_any_gguf=True,
                reference=True, draft_models=True, planned=True),
    # ik: gpu_offload None, the pinned wheel (SUPPORTED in ik_lib.py) is a CPU build (llama_supports_gpu_offload false)
    BackendInfo(BackendKind.IK, "ik_llama.cpp", Opens.GGUF, "ik_llama_cpp", "ik-llama-cpp-python", "ik", _open_ik,
                fast_kernels="repacked", reads_any_gguf=True, draft_models=True, planned=True, gated=True,
                probe=_probe_ik),
    BackendInfo(BackendKind.NATIVE, "native", Opens.GGUF, None, "specedge", None, _open_native,
                draft_models=True, many_caches=True, planned=True, gated=True, probe=_probe_native,
                check=_check_native, why_missing=_native_missing, build_id=_native_build),
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
