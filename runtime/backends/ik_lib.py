"""The ctypes binding of ik_llama.cpp's C API, as the library ik-llama-cpp-python ships (runtime/backends/ik.py runs
the engine on it).

We bind the C API ourselves (the wheel's Python helpers leave n_ubatch at 512 and guess flash attention from
py-cpuinfo) and check the ABI we rely on when the library loads: every symbol, the struct sizes, how many bytes
llama_*_default_params write into a sentinel buffer, and their default values at known offsets. A mismatch refuses
the engine with the installed version and what to install.

GOMP_SPINCOUNT=3000: its OpenMP threads spin that long before they sleep (set for the library's own libgomp while it
loads, then restored): the default spin (300000) collapses one-token calls when another process shares the cores
(13 -> 330 ms on SmolLM2, 2 threads, one CPU-burning process; 47 ms with 3000), and never spinning
(OMP_WAIT_POLICY=PASSIVE) costs 3.7x on a quiet machine (47 ms; 12.7 with 3000). docs/ik.md has the table.
"""
from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import platform
from pathlib import Path

DISTRIBUTION = "ik-llama-cpp-python"
SUPPORTED = ("0.1.5",)  # the versions whose struct layouts this module declares (an ABI probe checks them at load)
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
                          f"struct layouts are declared in runtime/backends/ik_lib.py): pip install "
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
