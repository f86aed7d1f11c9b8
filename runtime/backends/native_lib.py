"""ctypes binding of the native engine's C library (csrc/native, built at install as the optional extension
`specedge._native`). Python keeps the orchestration: it validates every tensor against the file before C sees it,
owns the KV cache (numpy fp16 arrays) and the RoPE tables; C packs the weights and runs the forward.

`load()` returns the library or raises NativeMissing with the reason and the fix (no compiler at install, a build
that failed, a platform without the extension), which the registry and the plan show as "missing and why".
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
from functools import lru_cache

import numpy as np

ABI_VERSION = 7
ISA_NAMES = ("portable", "avx2", "avx512", "neon")  # se.h SE_ISA_*
GGML_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14,
              "BF16": 30}  # se.h's
# formats the kernels take as they are (docs/native.md): the float ones multiply float activations
PACKED = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16", "F32")
BLOCKS = {"Q4_0": (18, 32), "Q4_1": (20, 32), "Q5_0": (22, 32), "Q8_0": (34, 32), "Q4_K": (144, 256),
          "Q5_K": (176, 256), "Q6_K": (210, 256), "F32": (4, 1), "F16": (2, 1), "BF16": (2, 1)}  # (bytes, weights)
ACT = {"silu": 0, "gelu_tanh": 1}

c_int, c_int32, c_float, c_size_t, c_void_p = ctypes.c_int, ctypes.c_int32, ctypes.c_float, ctypes.c_size_t, ctypes.c_void_p
_P = ctypes.POINTER


class NativeMissing(RuntimeError):
    """The native engine's library is not there; the message says why and what to do."""


class Cfg(ctypes.Structure):  # se_cfg (csrc/native/model.h)
    _fields_ = [(n, c_int) for n in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "vocab")] + [
        ("rms_eps", c_float), ("embed_scale", c_float)] + [
        (n, c_int) for n in ("activation", "qkv_bias", "o_bias", "qk_norm", "post_norms", "tied", "max_rows",
                             "threads")]


class Call(ctypes.Structure):  # se_call (csrc/native/model.h); pointers as addresses (ndarray.ctypes.data: cheap)
    _fields_ = [("n", c_int), ("length", c_int), ("capacity", c_int),
                ("tokens", c_void_p), ("positions", c_void_p), ("mask", c_void_p),  # int32, int32, uint8
                ("rope_cos", c_void_p), ("rope_sin", c_void_p),  # float *[n_layers]
                ("rope_half", c_void_p), ("window", c_void_p),  # int32 [n_layers]
                ("k_cache", c_void_p), ("v_cache", c_void_p),  # uint16 (fp16)
                ("layers", c_void_p), ("n_run", c_int), ("taps", c_void_p), ("n_taps", c_int),  # int32, int32
                ("tap_out", c_void_p), ("h_out", c_void_p), ("out_rows", c_void_p), ("n_out", c_int),  # float *[], ..
                ("logits", c_void_p)]


_SIGNATURES = {
    "se_abi_version": (c_int, []),
    "se_cpu_isa": (c_int, []),
    "se_isa": (c_int, []),
    "se_set_isa": (c_int, [c_int]),
    "se_model_new": (c_void_p, [_P(Cfg)]),
    "se_model_free": (None, [c_void_p]),
    "se_model_set_mat": (c_int, [c_void_p, c_int, c_int, c_int, c_void_p, c_size_t, c_int, c_int]),
    "se_model_set_vec": (c_int, [c_void_p, c_int, c_int, _P(c_float), c_int]),
    "se_model_ready": (c_int, [c_void_p]),
    "se_model_bytes": (c_size_t, [c_void_p]),
    "se_forward": (c_int, [c_void_p, _P(Call)]),
    "se_head": (c_int, [c_void_p, _P(c_float), c_int, _P(c_float), c_void_p]),
    "se_mat_new": (c_void_p, [c_int, c_void_p, c_size_t, c_int, c_int]),
    "se_mat_delete": (None, [c_void_p]),
    "se_mat_bytes": (c_size_t, [c_void_p]),
    "se_matmul": (c_int, [c_void_p, c_void_p, c_int, c_void_p, c_int, c_int]),  # x, out: ndarray.ctypes.data (cheap)
    "se_model_matmul": (c_int, [c_void_p, c_void_p, c_void_p, c_int, c_void_p]),
    "se_matmul_pool": (c_int, [c_void_p, _P(c_void_p), c_int, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p,
                               _P(c_float), c_int, _P(c_float), c_int]),
    "se_pool_new": (c_void_p, [c_int]),
    "se_pool_free": (None, [c_void_p]),
    "se_quantize": (None, [_P(c_float), c_int, c_int, c_int, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p]),
    "se_vec_exp": (None, [_P(c_float), c_int, c_int]),
    "se_vec_axpy": (None, [_P(c_float), c_float, c_void_p, c_int, c_int]),
    "se_vec_scores": (None, [_P(c_float), c_int, c_void_p, c_int, c_int, c_int, c_float, _P(c_float), c_int]),
    "se_vec_wsum": (None, [_P(c_float), c_void_p, _P(c_int32), c_int, c_int, _P(c_float), c_int]),
    "se_vec_wsum_q": (None, [_P(c_float), c_int, c_void_p, _P(c_int32), c_int, c_int, _P(c_float), c_int]),
    "se_vec_reduce": (c_float, [_P(c_float), c_int, c_int, c_int]),
    "se_vec_exp_sum": (c_float, [_P(c_float), c_int, c_float, c_int]),
    "se_vec_silu_mul": (None, [_P(c_float), _P(c_float), _P(c_float), c_int, c_int]),
    "se_vec_quantize": (None, [_P(c_float), c_int, c_int, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_int]),
    "se_dequant_row": (None, [c_void_p, c_int, _P(c_float)]),
    "se_read_roof": (ctypes.c_uint64, [c_void_p, c_void_p, c_size_t]),
}


def library_path() -> str:
    """Where the built extension is (SPECEDGE_NATIVE_LIB overrides: a sanitizer build in tests)."""
    override = os.environ.get("SPECEDGE_NATIVE_LIB")
    if override:
        return override
    spec = importlib.util.find_spec(f"{__package__.rsplit('.', 2)[0]}._native")
    if spec is None or not spec.origin:
        raise NativeMissing("the native engine was not built when specedge was installed (no C compiler then, or "
                            "its build failed: pip prints why); install a C compiler (gcc or clang) and reinstall "
                            "specedge, or from a checkout run `python setup.py build_ext --inplace`")
    return spec.origin


def build_id() -> str | None:
    """The first 12 hex digits of the built library's SHA-256 (None when there is none): cached plans and profiles
    key the native engine by specedge's version and this, so rebuilding it within one version re-measures."""
    try:
        path = library_path()
        st = os.stat(path)
    except (NativeMissing, OSError):
        return None
    return _digest(path, st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=8)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:12]


@lru_cache(maxsize=None)
def load() -> ctypes.CDLL:
    """The library with every signature declared; NativeMissing naming the reason when it cannot be used."""
    path = library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise NativeMissing(f"the native engine's library {path} does not load ({e}); reinstall specedge") from None
    for name, (res, args) in _SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise NativeMissing(f"{path} lacks {name}: it was built from other sources; reinstall specedge") from None
        fn.restype, fn.argtypes = res, args
    if lib.se_abi_version() != ABI_VERSION:
        raise NativeMissing(f"{path} has ABI {lib.se_abi_version()}, this specedge expects {ABI_VERSION}; reinstall "
                            "specedge (or rebuild in place)")
    return lib


def available() -> str | None:
    """None when the engine can run here, else why not (one line)."""
    try:
        load()
    except NativeMissing as e:
        return str(e)
    return None


def optional_fn(name: str, restype, argtypes: list):
    """A perf tool's function of the library, bound, or None without the engine or in a build that predates it (an
    A/B's OLD.so): unlike the engine's own, these are not required to load."""
    try:
        fn = getattr(load(), name, None)
    except NativeMissing:
        return None
    if fn is not None:
        fn.restype, fn.argtypes = restype, argtypes
    return fn


def core_round_trip_ns(reads: int = 5, rounds: int = 4000) -> float | None:
    """How far apart two cores are: the least of `reads` means of one cache line's round trip between two spinning
    threads (csrc/native/round_trip.c; a thread spinning elsewhere inflates some reads). On the 2-vCPU VMs here it
    reads 50-80 ns at a memory roof of about 35 GB/s and 310-520 ns at about 60 (the vCPUs on different dies: more
    bandwidth, dearer hand-offs; docs/native.md). None without the engine or in a build that predates it."""
    fn = optional_fn("se_round_trip_ns", ctypes.c_double, [ctypes.c_long])
    if fn is None:
        return None
    best = min(fn(rounds) for _ in range(reads))
    return best if best > 0 else None


def isa_name(isa: int) -> str:
    return ISA_NAMES[isa]


def cpu_isas(lib) -> list[int]:
    """The ISAs this CPU runs, portable first: x86 portable .. its best (AVX2, AVX-512), AArch64 portable and NEON."""
    best = lib.se_cpu_isa()
    return [0, best] if ISA_NAMES[best] == "neon" else list(range(best + 1))


def fptr(a: np.ndarray):
    return a.ctypes.data_as(_P(c_float))


def iptr(a: np.ndarray):
    return a.ctypes.data_as(_P(c_int32))


class PackedMatrix:
    """One matrix packed by the C library (tests, the kernel benchmark, a trimmed LM head); freed with the object."""

    def __init__(self, gguf_type: str, raw: np.ndarray) -> None:
        """raw: uint8 [n, row_bytes], the GGUF rows as stored (canonical row order)."""
        if gguf_type not in PACKED:
            raise ValueError(f"the native engine packs {', '.join(PACKED)}, not {gguf_type}")
        self._lib = load()
        raw = np.ascontiguousarray(raw, dtype=np.uint8)
        self.n = raw.shape[0]
        blocks, width = BLOCKS[gguf_type]
        if raw.ndim != 2 or raw.shape[1] % blocks:
            raise ValueError(f"{gguf_type} rows must be whole {blocks}-byte blocks, got shape {raw.shape}")
        self.k = raw.shape[1] // blocks * width
        self.kquant = width == 256  # its activations share a scale per superblock (the C library's span 8)
        self.handle = self._lib.se_mat_new(GGML_TYPES[gguf_type], raw.ctypes.data, raw.shape[1], self.n, self.k)
        if not self.handle:
            raise MemoryError(f"cannot pack a {self.n} x {self.k} {gguf_type} matrix")

    @property
    def nbytes(self) -> int:
        return int(self._lib.se_mat_bytes(self.handle))

    def matmul(self, x: np.ndarray, isa: int | None = None, span: int = 0) -> np.ndarray:
        """[rows, k] float32 -> [rows, n]: activations quantized per 32 (one scale per 256 for a K-quant, or per 32
        with span 1), one thread, the given ISA (None: best)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty((x.shape[0], self.n), dtype=np.float32)
        isa = self._lib.se_cpu_isa() if isa is None else isa
        if self._lib.se_matmul(self.handle, x.ctypes.data, x.shape[0], out.ctypes.data, isa, span) != 0:
            raise ValueError(f"matmul of {x.shape} failed")
        return out

    def matmul_on(self, model, x: np.ndarray) -> np.ndarray:
        """matmul(x) on a native model's thread pool (`model`: its se_model handle): the same bits as matmul(x) at
        the best ISA, the output rows split over the pool's threads. Never while that model runs a forward."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.k:
            raise ValueError(f"matmul_on: x must be [rows, {self.k}], not {x.shape}")
        out = np.empty((x.shape[0], self.n), dtype=np.float32)
        if self._lib.se_model_matmul(model, self.handle, x.ctypes.data, x.shape[0], out.ctypes.data) != 0:
            raise ValueError(f"matmul of {x.shape} on the model's pool failed")
        return out

    def row(self, i: int) -> np.ndarray:
        out = np.empty(self.k, dtype=np.float32)
        self._lib.se_dequant_row(self.handle, i, fptr(out))
        return out

    def __del__(self) -> None:
        if getattr(self, "handle", None):
            self._lib.se_mat_delete(self.handle)
            self.handle = None
