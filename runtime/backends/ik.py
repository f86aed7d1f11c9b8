"""ik_llama.cpp (the fork with its own CPU matrix kernels) through the library ik-llama-cpp-python ships, bound
here with ctypes: a llama.cpp engine whose verify batches give the same logits as one-token calls at any thread
count, so greedy speculation on it is token-identical to its plain decoding (PERF_FACTS.md, docs/ik.md).

We bind the C API ourselves (the wheel's Python helpers leave n_ubatch at 512 and guess flash attention from
py-cpuinfo) and check the ABI we rely on when the library loads: every symbol, the struct sizes, how many bytes
llama_*_default_params write into a sentinel buffer, and their default values at known offsets. A mismatch refuses
the engine with the installed version and what to install.

Settings that make it exact (measured; docs/ik.md "Why these settings"):
  n_ubatch <= 31   at 32+ rows ik repacks Q4_1/Q5_1 weights for a GEMM kernel that drops the tail blocks of rows
                   whose width is not a multiple of 128 (SmolLM2's 576): every row of such a call is wrong. A call
                   of any size is split into ubatches by llama_decode; `max_call` comes from the per-file gate
                   (assembly/engine_gate.py), 16 by default.
  flash_attn off   ik's flash attention takes a one-token shortcut over sliding windows (Gemma 3) that batches do not
  no repacking     ik's run-time repacking (its -rtr: Q4_K -> Q4_K_R4, Q6_K -> Q6_K_R4, ...) makes one-token calls
                   faster (Qwen2.5-Coder-1.5B Q4_K_M on 2 Zen 4 cores: 27 -> 32 tok/s) but its R4 kernels take
                   `nrc_y == 1` shortcuts (the Q8 scale folded in first), so a verify row differs from a one-token
                   call: plain decoding only (`repack=True`, the registry's plain kernels; docs/ik.md).
  GOMP_SPINCOUNT=3000   its OpenMP threads spin that long before they sleep (set for the library's own libgomp
                   while it loads, then restored): the default spin (300000) collapses one-token calls when another
                   process shares the cores (13 -> 330 ms on SmolLM2, 2 threads, one CPU-burning process; 47 ms
                   with 3000), and never spinning (OMP_WAIT_POLICY=PASSIVE) costs 3.7x on a quiet machine
                   (47 ms; 12.7 with 3000). docs/ik.md has the table.
One context holds one sequence: `new_cache` clears it, so a backend serves one live cache.
"""
from __future__ import annotations

import ctypes
import gc
import importlib.metadata
import importlib.util
import os
import platform
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ...models.config import ModelConfig
from ..kv import LengthCursor
from ..types import Logits, Mask, Tokens
from .base import BackendCaps, LayerPlan, check_room, probe_batch_invariance
from .llamacpp_tokenizer import LlamaCppTokenizer

DISTRIBUTION = "ik-llama-cpp-python"
SUPPORTED = ("0.1.5",)  # the versions whose struct layouts this module declares (an ABI probe checks them at load)
DEFAULT_MAX_CALL = 16  # n_ubatch: the Q4_1/Q5_1 GEMM fault starts at 32 rows
OMP_SPINCOUNT = "3000"  # OpenMP spin before sleeping (module docstring)

c_bool, c_int, c_int8, c_int32, c_uint32, c_float, c_void_p, c_char_p, c_size_t = (
    ctypes.c_bool, ctypes.c_int, ctypes.c_int8, ctypes.c_int32, ctypes.c_uint32, ctypes.c_float,
    ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t)
_P = ctypes.POINTER
_progress_cb = ctypes.CFUNCTYPE(c_bool, c_float, c_void_p)
_eval_cb = ctypes.CFUNCTYPE(c_bool, c_void_p, c_bool, c_void_p)
_abort_cb = ctypes.CFUNCTYPE(c_bool, c_void_p)
_log_cb = ctypes.CFUNCTYPE(None, c_int, c_char_p, c_void_p)


class ModelParams(ctypes.Structure):  # llama_model_params of ik_llama.cpp (168 bytes; not mainline's layout)
    _fields_ = [
        ("devices", c_char_p), ("n_gpu_layers", c_int32), ("mla", c_int32), ("split_mode", c_int),
        ("main_gpu", c_int32), ("max_gpu", c_int32), ("ncmoe", c_int32), ("type_k", c_int), ("type_v", c_int),
        ("max_ctx_size", c_uint32), ("n_seq_max", c_int32), ("n_ubatch", c_int32), ("amb", c_int32),
        ("fit_margin", c_int32), ("fit", c_bool), ("worst_graph_tokens", c_int32),
        ("type_k_first", c_int), ("type_k_last", c_int), ("type_v_first", c_int), ("type_v_last", c_int),
        ("n_k_first", c_int32), ("n_k_last", c_int32), ("n_v_first", c_int32), ("n_v_last", c_int32),
        ("tensor_split", _P(c_float)), ("rpc_servers", c_char_p),
        ("progress_callback", _progress_cb), ("progress_callback_user_data", c_void_p),
        ("kv_overrides", c_void_p), ("tensor_buft_overrides", c_void_p),
        ("vocab_only", c_bool), ("use_mmap", c_bool), ("use_mlock", c_bool), ("check_tensors", c_bool),
        ("repack_tensors", c_bool), ("use_thp", c_bool), ("validate_quants", c_bool), ("merge_qkv", c_bool),
        ("merge_up_gate_exps", c_bool), ("mtp", c_bool), ("dry_run", c_bool), ("flash_attn", c_bool),
    ]


class ContextParams(ctypes.Structure):  # llama_context_params of ik_llama.cpp (216 bytes)
    _fields_ = [
        ("seed", c_uint32), ("n_ctx", c_uint32), ("n_batch", c_uint32), ("n_ubatch", c_uint32),
        ("n_seq_max", c_uint32), ("n_threads", c_uint32), ("n_threads_batch", c_uint32),
        ("max_extra_alloc", c_int32), ("worst_case_tokens", c_int32),
        ("rope_scaling_type", c_int), ("pooling_type", c_int), ("attention_type", c_int),
        ("rope_freq_base", c_float), ("rope_freq_scale", c_float), ("yarn_ext_factor", c_float),
        ("yarn_attn_factor", c_float), ("yarn_beta_fast", c_float), ("yarn_beta_slow", c_float),
        ("yarn_orig_ctx", c_uint32), ("defrag_thold", c_float),
        ("cb_eval", _eval_cb), ("cb_eval_user_data", c_void_p),
        ("type_k", c_int), ("type_v", c_int), ("type_reduce", c_int),
        ("type_k_first", c_int), ("type_k_last", c_int), ("type_v_first", c_int), ("type_v_last", c_int),
        ("n_k_first", c_int32), ("n_k_last", c_int32), ("n_v_first", c_int32), ("n_v_last", c_int32),
        ("logits_all", c_bool), ("embeddings", c_bool), ("offload_kqv", c_bool), ("flash_attn", c_bool),
        ("mla_attn", c_int), ("attn_max_batch", c_int),
        ("fused_moe_up_gate", c_bool), ("grouped_expert_routing", c_bool), ("fused_up_gate", c_bool),
        ("fused_mmad", c_bool), ("rope_cache", c_bool), ("graph_reuse", c_bool),
        ("min_experts", c_int), ("thresh_experts", c_float), ("only_active_experts", c_bool),
        ("k_cache_hadamard", c_bool), ("v_cache_hadamard", c_bool), ("split_mode_graph_scheduling", c_bool),
        ("scheduler_async", c_bool), ("mtp", c_bool), ("mtp_op_type", c_int),
        ("abort_callback", _abort_cb), ("abort_callback_data", c_void_p),
        ("offload_policy", c_void_p), ("cuda_params", c_void_p),
    ]


class Batch(ctypes.Structure):  # llama_batch (72 bytes, as mainline)
    _fields_ = [
        ("n_tokens", c_int32), ("token", _P(c_int32)), ("embd", _P(c_float)), ("pos", _P(c_int32)),
        ("n_seq_id", _P(c_int32)), ("seq_id", _P(_P(c_int32))), ("logits", _P(c_int8)),
        ("all_pos_0", c_int32), ("all_pos_1", c_int32), ("all_seq_id", c_int32),
    ]


SIZES = {ModelParams: 168, ContextParams: 216, Batch: 72}
_SIGS = {  # name: (argtypes, restype), as ik's llama.h declares them (several take the model, not the vocabulary)
    "llama_backend_init": ([], None),
    "llama_log_set": ([_log_cb, c_void_p], None),
    "llama_print_system_info": ([], c_char_p),
    "llama_supports_gpu_offload": ([], c_bool),
    "llama_model_default_params": ([], ModelParams),
    "llama_context_default_params": ([], ContextParams),
    "llama_model_load_from_file": ([c_char_p, ModelParams], c_void_p),
    "llama_free_model": ([c_void_p], None),
    "llama_init_from_model": ([c_void_p, ContextParams], c_void_p),
    "llama_free": ([c_void_p], None),
    "llama_n_ctx": ([c_void_p], c_uint32),
    "llama_n_batch": ([c_void_p], c_uint32),
    "llama_n_ubatch": ([c_void_p], c_uint32),
    "llama_model_get_vocab": ([c_void_p], c_void_p),
    "llama_vocab_n_tokens": ([c_void_p], c_int32),
    "llama_vocab_bos": ([c_void_p], c_int32),
    "llama_vocab_eos": ([c_void_p], c_int32),
    "llama_token_eot": ([c_void_p], c_int32),  # takes the model
    "llama_vocab_is_eog": ([c_void_p, c_int32], c_bool),
    "llama_vocab_get_add_bos": ([c_void_p], c_bool),
    "llama_vocab_get_text": ([c_void_p, c_int32], c_char_p),
    "llama_vocab_tokenize": ([c_void_p, c_char_p, c_int32, _P(c_int32), c_int32, c_bool, c_bool], c_int32),
    "llama_token_to_piece_vocab": ([c_void_p, c_int32, c_char_p, c_int32, c_int32, c_bool], c_int32),
    "llama_batch_init": ([c_int32, c_int32, c_int32], Batch),
    "llama_batch_free": ([Batch], None),
    "llama_decode": ([c_void_p, Batch], c_int32),
    "llama_get_logits": ([c_void_p], _P(c_float)),
    "llama_kv_cache_seq_rm": ([c_void_p, c_int32, c_int32, c_int32], c_bool),
    "llama_kv_cache_clear": ([c_void_p], None),
    "llama_set_n_threads": ([c_void_p, c_uint32, c_uint32], None),
    "llama_get_model_tensor": ([c_void_p, c_char_p], c_void_p),
    "iqk_repack_tensor": ([c_void_p], None),  # libggml's, found through libllama's dependencies
}

_LIB = None
_LOG = None  # the log callback, referenced for the life of the process (the library keeps calling it)


def version() -> str | None:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def library_path() -> Path:
    """The libllama.so the wheel ships (found without importing its Python package, which binds the library
    itself); IK_LLAMA_CPP_LIB_PATH overrides, as the wheel's own loader allows."""
    override = os.environ.get("IK_LLAMA_CPP_LIB_PATH")
    if override:
        return Path(override)
    spec = importlib.util.find_spec("ik_llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the ik backend needs ik-llama-cpp-python: pip install 'specedge[ik]' (a prebuilt wheel "
                          "for Linux x86-64, CPython 3.10-3.13)")
    return Path(list(spec.submodule_search_locations)[0]) / "lib" / "libllama.so"


def load_library():
    """The bound library (once per process). ImportError naming the problem: not installed, another version, a
    missing symbol or a struct layout that is not the one declared here."""
    global _LIB, _LOG
    if _LIB is not None:
        return _LIB
    found = version()
    if found is not None and found not in SUPPORTED and "IK_LLAMA_CPP_LIB_PATH" not in os.environ:
        raise ImportError(f"ik-llama-cpp-python {found} is installed; specedge binds {', '.join(SUPPORTED)} (its "
                          f"struct layouts are declared in runtime/backends/ik.py): pip install "
                          f"'ik-llama-cpp-python=={SUPPORTED[-1]}'")
    if platform.machine() not in ("x86_64", "AMD64") or os.name != "posix":
        raise ImportError("the ik backend binds the Linux x86-64 build of ik_llama.cpp (the only wheel published)")
    path = library_path()
    lib = _load_with(path, {"GOMP_SPINCOUNT": OMP_SPINCOUNT})
    missing = [n for n in _SIGS if not hasattr(lib, n)]
    if missing:
        raise ImportError(f"{path} lacks {', '.join(missing)}: not the ik_llama.cpp build specedge binds "
                          f"({DISTRIBUTION} {', '.join(SUPPORTED)})")
    for name, (args, res) in _SIGS.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    check_abi(lib, path)
    if not os.environ.get("SPECEDGE_LLAMA_LOG"):
        _LOG = _log_cb(lambda level, text, data: None)
        lib.llama_log_set(_LOG, None)
    lib.llama_backend_init()
    _LIB = lib
    return lib


def _load_with(path: Path, env: dict[str, str]):
    """CDLL(path) with `env` in the environment while it loads (its bundled libgomp reads them then), each only
    where the user set none; the environment is restored after, so another OpenMP runtime loaded later (mainline
    llama.cpp's) keeps its own defaults."""
    saved = {k: os.environ.get(k) for k in env}
    for k, v in env.items():
        os.environ.setdefault(k, v)
    try:
        return ctypes.CDLL(str(path))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)


def _sret_extent(lib, symbol: str) -> int:
    """How many bytes a struct-returning function writes. SysV x86-64 returns a struct over 16 bytes through a
    hidden pointer (rdi, echoed in rax): we pass a sentinel-filled buffer, twice with different fills."""
    fn = ctypes.CFUNCTYPE(c_void_p, c_void_p)(ctypes.cast(getattr(lib, symbol), c_void_p).value)
    extent = 0
    for fill in (0xAA, 0x55):
        buf = (ctypes.c_ubyte * 1024).from_buffer_copy(bytes([fill]) * 1024)
        if fn(ctypes.addressof(buf)) != ctypes.addressof(buf):
            raise ImportError(f"{symbol}: not the struct-return convention expected")
        extent = max(extent, max(i for i in range(1024) if buf[i] != fill) + 1)
    return extent


def check_abi(lib, path: Path) -> None:
    """The layouts we declare are the library's: struct sizes, the bytes its default-params functions write (a
    field missing on our side shows as a write past our struct's end), and their defaults at known offsets."""
    def refuse(why: str):
        return ImportError(f"{path}: {why}; specedge binds {DISTRIBUTION} {', '.join(SUPPORTED)} (reinstall it: pip "
                           f"install 'ik-llama-cpp-python=={SUPPORTED[-1]}')")
    for cls, size in SIZES.items():
        if ctypes.sizeof(cls) != size:
            raise refuse(f"ctypes {cls.__name__} is {ctypes.sizeof(cls)} bytes, the declared layout {size}")
    for symbol, cls in (("llama_model_default_params", ModelParams), ("llama_context_default_params", ContextParams)):
        written = _sret_extent(lib, symbol)
        if not ctypes.sizeof(cls) - 8 < written <= ctypes.sizeof(cls):
            raise refuse(f"{symbol} writes {written} bytes where the declared struct has {ctypes.sizeof(cls)}")
    cp, mp = lib.llama_context_default_params(), lib.llama_model_default_params()
    got = (cp.seed, cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max, cp.type_k, cp.type_v, cp.yarn_ext_factor,
           cp.defrag_thold, cp.offload_kqv, cp.cb_eval_user_data, cp.abort_callback_data, cp.cuda_params,
           mp.n_gpu_layers, mp.use_mmap, mp.use_mlock, mp.vocab_only, mp.n_k_first, mp.type_k)
    want = (0xFFFFFFFF, 512, 2048, 512, 1, 1, 1, -1.0, -1.0, True, None, None, None, 0, True, False, False, -1, 1)
    if got != want:
        raise refuse(f"the default parameters read {got}, the declared layout gives {want}")


def system_info() -> str:
    return load_library().llama_print_system_info().decode("utf-8", "replace").strip()


class IkVocab:
    """runtime/backends/llamacpp_tokenizer.Vocab over an ik_llama.cpp model; `owner` (the backend) is kept alive
    with it: the model's memory is freed when the backend goes."""

    def __init__(self, lib, model, owner=None) -> None:
        self._lib, self._model, self._owner = lib, model, owner
        self._vocab = lib.llama_model_get_vocab(model)

    def n_tokens(self) -> int:
        return self._lib.llama_vocab_n_tokens(self._vocab)

    def bos(self) -> int:
        return self._lib.llama_vocab_bos(self._vocab)

    def specials(self) -> list[int]:
        return [int(self._lib.llama_vocab_eos(self._vocab)), int(self._lib.llama_token_eot(self._model))]

    def is_eog(self, token: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self._vocab, token))

    def add_bos(self) -> bool:
        return bool(self._lib.llama_vocab_get_add_bos(self._vocab))

    def text(self, token: int) -> bytes:
        return self._lib.llama_vocab_get_text(self._vocab, token) or b""

    def piece(self, token: int, buf, size: int) -> int:
        return self._lib.llama_token_to_piece_vocab(self._vocab, token, buf, size, 0, True)

    def tokenize(self, text: bytes) -> list[int]:
        n = -self._lib.llama_vocab_tokenize(self._vocab, text, len(text), None, 0, False, True)
        out = (c_int32 * max(n, 1))()
        n = self._lib.llama_vocab_tokenize(self._vocab, text, len(text), out, n, False, True)
        return list(out[:n])


class IkCache(LengthCursor):
    """The Cache protocol (backends/base.py) over ik_llama.cpp's KV cache for sequence 0."""

    def __init__(self, backend: "IkBackend", capacity: int) -> None:
        self._backend, self._capacity, self._length = backend, capacity, 0

    @property
    def capacity(self) -> int:
        return self._capacity

    def _forget(self, length: int) -> None:
        self._backend._remove_from(length)


class IkBackend:
    name = "ik"
    caps = BackendCaps(tree_mask=False, layer_plan=False, partial_rollback=True, max_batch_tokens=512,
                       own_tokenizer=True)

    def __init__(self, gguf_path: str | Path, config: ModelConfig, *, n_ctx: int | None = None,
                 n_threads: int | None = None, max_call: int = DEFAULT_MAX_CALL, batch_invariant: bool = True,
                 no_weights: str | None = None, gpu_layers: int = 0, repack: bool = False) -> None:
        """repack: ik's run-time repacking of the weights (plain decoding only: not batch-invariant; the weights are
        read into memory instead of mapped); gpu_layers: n_gpu_layers (-1: all) where the build offloads (the
        published wheel does not, so the registry resolves it to 0 there; offloaded layers are not claimed
        batch-invariant); max_call: the ubatch
        size (<= 31 unless the file's gate found larger calls faithful); batch_invariant:
        what the file's probe found at these threads (assembly/engine_gate.py); no_weights: why our code cannot
        read this file's weights (drafters that run the target's own layers are refused with it)."""
        self._lib = lib = load_library()
        self.config = config
        self.n_ctx = int(n_ctx or config.context_length)
        self.threads = int(n_threads or min(os.cpu_count() or 1, 8))
        self.max_call = int(max_call)
        mp = lib.llama_model_default_params()
        mp.n_gpu_layers = self.gpu_layers = int(gpu_layers)
        mp.use_mmap = not repack  # repacking rewrites the weights in place
        self._model = lib.llama_model_load_from_file(os.fsencode(str(gguf_path)), mp)
        if not self._model:  # ggml's 64 contexts may be held by unreachable backends: collect them, then once more
            gc.collect()
            self._model = lib.llama_model_load_from_file(os.fsencode(str(gguf_path)), mp)
        if not self._model:
            raise RuntimeError(f"ik_llama.cpp could not load {gguf_path} (an architecture or quantisation it does "
                               "not read); use --backend llamacpp")
        self.repacked = self._repack(gguf_path) if repack else 0
        cp = lib.llama_context_default_params()
        cp.n_ctx, cp.n_threads, cp.n_threads_batch = self.n_ctx, self.threads, self.threads
        cp.n_batch, cp.n_ubatch = 512, self.max_call
        cp.flash_attn = False  # ik's flash attention is not batch-invariant beyond a sliding window (Gemma 3)
        self._ctx = lib.llama_init_from_model(self._model, cp)
        if not self._ctx:
            lib.llama_free_model(self._model)
            raise RuntimeError(f"ik_llama.cpp could not create a context of {self.n_ctx} positions for {gguf_path}")
        self._n_batch = int(lib.llama_n_batch(self._ctx))
        self._vocab = IkVocab(lib, self._model)
        self._n_vocab = self._vocab.n_tokens()
        if self._n_vocab != config.vocab_size:
            raise ValueError(f"ik_llama.cpp reports vocabulary {self._n_vocab}, the GGUF config says "
                             f"{config.vocab_size}")
        self._batch = lib.llama_batch_init(self._n_batch, 0, 1)
        b = self._batch
        self._tok = np.ctypeslib.as_array(b.token, shape=(self._n_batch,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(self._n_batch,))
        np.ctypeslib.as_array(b.n_seq_id, shape=(self._n_batch,))[:] = 1
        for i in range(self._n_batch):
            b.seq_id[i][0] = 0
        self._want = np.ctypeslib.as_array(b.logits, shape=(self._n_batch,))  # which rows' logits, set per call
        self._size = int(Path(gguf_path).stat().st_size)
        self._live: Callable[[], IkCache | None] = lambda: None  # a weak reference: the cache holds the backend,
        # and a cycle would keep the model until Python's cycle collector runs (ik's ggml has a fixed pool of 64
        # contexts, a few per model: twenty-odd backends awaiting collection and the next load fails)
        hint = None if no_weights is None else (
            f"only llama.cpp engines run this file ({no_weights}), and they run chains of the full model; use a "
            "drafter that needs only token ids (ngram, lookup) or a draft model with the same vocabulary")
        self.caps = replace(type(self).caps, max_context=self.n_ctx,
                            batch_invariant=batch_invariant and not self.gpu_layers and not self.repacked,
                            layer_hint=hint, reuse_hint=hint, tree_hint=hint)

    def _repack(self, gguf_path: str | Path) -> int:
        """Repack every weight ik has an interleaved layout for, as its loader does with repack_tensors (which this
        binding leaves off to say per tensor what changed): how many tensors changed type. The token embedding
        stays (ik leaves it: rows are gathered from it); a tensor whose rows do not divide into the layout stays."""
        from ...models.gguf_read import read_gguf
        n = 0
        for t in read_gguf(gguf_path).tensors:
            tensor = self._lib.llama_get_model_tensor(self._model, t.name.encode())
            if not tensor:  # a tensor the model does not keep under its file name
                continue
            before = c_int32.from_address(tensor).value  # ggml_tensor.type, its first field
            self._lib.iqk_repack_tensor(tensor)
            n += c_int32.from_address(tensor).value != before
        return n

    def set_threads(self, n: int) -> None:
        """The thread count of the next calls (runtime/cores.py ThreadedBackend; llama_set_n_threads)."""
        if n != self.threads:
            self._lib.llama_set_n_threads(self._ctx, int(n), int(n))
            self.threads = int(n)

    def new_cache(self, max_len: int) -> IkCache:
        if max_len > self.n_ctx:
            raise ValueError(f"a cache of {max_len} positions exceeds the ik_llama.cpp context {self.n_ctx}; "
                             "raise --ctx or shorten the request")
        self._lib.llama_kv_cache_clear(self._ctx)
        cache = IkCache(self, max_len)
        self._live = weakref.ref(cache)
        return cache

    def _remove_from(self, position: int) -> None:
        if not self._lib.llama_kv_cache_seq_rm(self._ctx, 0, position, -1):
            raise RuntimeError(f"ik_llama.cpp could not remove cached positions from {position}")

    def weight_bytes(self, plan: LayerPlan | None = None) -> int:
        """Approximated by the GGUF size (weights dominate; the embedding read is one row per token)."""
        return self._size

    def forward(self, tokens: Tokens, cache: IkCache, *, tree_mask: Mask | None = None,
                plan: LayerPlan | None = None) -> Logits:
        """[T, V] logits, one call of up to n_batch tokens at a time (llama_decode splits it into ubatches of
        max_call rows)."""
        if tree_mask is not None or plan is not None:
            raise ValueError("the ik backend runs chains of the full model only (no tree masks or layer plans)")
        out = np.empty((len(tokens), self._n_vocab), dtype=np.float32)
        self._decode(tokens, cache, out)
        return out

    def feed(self, tokens: Tokens, cache: IkCache) -> None:
        """Append tokens without their logits (FeedingBackend): one row per llama_decode call (the last) instead
        of all, so a prompt does not grow the output buffer that ik_llama.cpp clears on every later call."""
        self._decode(tokens, cache, None)

    def _decode(self, tokens: Tokens, cache: IkCache, out: np.ndarray | None) -> None:
        if cache is not self._live():
            raise ValueError("this cache is not the backend's live sequence (ik_llama.cpp holds one sequence)")
        t = len(tokens)
        check_room(cache, t)
        toks = np.asarray(tokens, dtype=np.int32)
        for s in range(0, t, self._n_batch):
            n = min(self._n_batch, t - s)
            self._tok[:n] = toks[s:s + n]
            self._pos[:n] = np.arange(cache.length, cache.length + n, dtype=np.int32)
            self._want[:n] = 1 if out is not None else 0
            self._want[n - 1] = 1
            self._batch.n_tokens = n
            rc = self._lib.llama_decode(self._ctx, self._batch)
            if rc != 0:
                raise RuntimeError(f"ik_llama.cpp llama_decode returned {rc} at position {cache.length} "
                                   f"({'no room left in its KV cache' if rc == 1 else 'an error'})")
            if out is not None:
                out[s:s + n] = np.ctypeslib.as_array(self._lib.llama_get_logits(self._ctx),
                                                     shape=(n, self._n_vocab))
            cache.advance(n)

    def tokenizer(self, chat_template: str | None, merges: Sequence[str] = ()) -> LlamaCppTokenizer:
        """ik_llama.cpp's own tokenizer for this model (TokenizingBackend), for files ours cannot read."""
        return LlamaCppTokenizer(IkVocab(self._lib, self._model, owner=self), chat_template, merges)

    def tokenize(self, text: str) -> list[int]:
        return self._vocab.tokenize(text.encode("utf-8"))

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            self._lib.llama_batch_free(self._batch)
            self._lib.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            self._lib.llama_free_model(self._model)
            self._model = None

    def __del__(self) -> None:
        self.close()


def batch_invariant(backend: IkBackend, widths: Sequence[int], prefixes: Sequence[int], seed: int = 0) -> bool:
    """base.probe_batch_invariance on ik's one sequence, which is left empty afterwards."""
    try:
        return probe_batch_invariance(backend, widths, prefixes, seed)
    finally:
        backend.new_cache(1)
