"""ik_llama.cpp (the fork with its own CPU matrix kernels) through the library ik-llama-cpp-python ships, bound
with ctypes in ik_lib.py: a llama.cpp engine whose verify batches give the same logits as one-token calls at any
thread count, so greedy speculation on it is token-identical to its plain decoding (PERF_FACTS.md, docs/ik.md).

Settings that make it exact (measured; docs/ik.md "Why these settings"):
  n_ubatch <= 31   at 32+ rows ik repacks Q4_1/Q5_1 weights for a GEMM kernel that drops the tail blocks of rows
                   whose width is not a multiple of 128 (SmolLM2's 576): every row of such a call is wrong. A call
                   of any size is split into ubatches by llama_decode; `max_call` comes from the per-file gate
                   (assembly/engine_gate.py, GateTuning), 16 by default.
  flash_attn off   ik's flash attention takes a one-token shortcut over sliding windows (Gemma 3) that batches do not
  no repacking     ik's run-time repacking (its -rtr: Q4_K -> Q4_K_R4, Q6_K -> Q6_K_R4, ...) makes one-token calls
                   faster (Qwen2.5-Coder-1.5B Q4_K_M on 2 Zen 4 cores: 27 -> 32 tok/s) but its R4 kernels take
                   `nrc_y == 1` shortcuts (the Q8 scale folded in first), so a verify row differs from a one-token
                   call: plain decoding only (`repack=True`, the registry's Kernels.FAST_PLAIN_ONLY; docs/ik.md).
  GOMP_SPINCOUNT=3000   its OpenMP threads spin that long before they sleep (ik_lib.py; docs/ik.md has the table).
One context holds one sequence: `new_cache` clears it, so a backend serves one live cache.
"""
from __future__ import annotations

import gc
import os
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ...models.config import ModelConfig
from ..cores import default_threads
from ..kv import LengthCursor
from ..types import Logits, Mask, Tokens
from .base import (BackendCaps, LayerPlan, Variance, check_room, fast_kernels_variance, gate_variance, gpu_variance,
                   probe_batch_invariance)
from .ik_lib import c_int32, load_library
from .llamacpp_tokenizer import LlamaCppTokenizer
from .registry import GateTuning

DEFAULT_MAX_CALL = 16  # n_ubatch: the Q4_1/Q5_1 GEMM fault starts at 32 rows
ENGINE = "ik_llama.cpp"


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
                 n_threads: int | None = None, tuning: GateTuning = GateTuning(), no_weights: str | None = None,
                 gpu_layers: int = 0, repack: bool = False) -> None:
        """tuning: what the file's gate found (assembly/engine_gate.py): max_call, the ubatch size (<= 31 unless
        the gate found larger calls faithful; None: DEFAULT_MAX_CALL), and batch invariance at these threads.
        repack: ik's run-time repacking of the weights (plain decoding only: not batch-invariant; the weights are
        read into memory instead of mapped); gpu_layers: n_gpu_layers (-1: all) where the build offloads (the
        published wheel does not, so the registry resolves it to 0 there; offloaded layers are not claimed
        batch-invariant); no_weights: why our code cannot read this file's weights (drafters that run the target's
        own layers are refused with it)."""
        self._lib = lib = load_library()
        self.config = config
        self.n_ctx = int(n_ctx or config.context_length)
        self.threads = default_threads(n_threads)
        self.max_call = int(tuning.max_call or DEFAULT_MAX_CALL)
        self.gpu_layers = int(gpu_layers)
        self._model = self._load_model(gguf_path, repack)
        self.repacked = self._repack(gguf_path) if repack else 0
        self._ctx = self._new_context(gguf_path)
        self._n_batch = int(lib.llama_n_batch(self._ctx))
        self._vocab = IkVocab(lib, self._model)
        self._n_vocab = self._vocab.n_tokens()
        if self._n_vocab != config.vocab_size:
            raise ValueError(f"ik_llama.cpp reports vocabulary {self._n_vocab}, the GGUF config says "
                             f"{config.vocab_size}")
        self._bind_batch()
        self._size = int(Path(gguf_path).stat().st_size)
        self._live: Callable[[], IkCache | None] = lambda: None  # a weak reference: the cache holds the backend,
        # and a cycle would keep the model until Python's cycle collector runs (ik's ggml has a fixed pool of 64
        # contexts, a few per model: twenty-odd backends awaiting collection and the next load fails)
        hint = None if no_weights is None else (
            f"only llama.cpp engines run this file ({no_weights}), and they run chains of the full model; use a "
            "drafter that needs only token ids (ngram, lookup) or a draft model with the same vocabulary")
        self.caps = replace(type(self).caps, max_context=self.n_ctx, layer_hint=hint, reuse_hint=hint, tree_hint=hint,
                            variance=self._variance(tuning))

    def _variance(self, tuning: GateTuning) -> Variance | None:
        """Batch-invariant on the CPU with its exact kernels where the file's gate probe found it so."""
        if self.gpu_layers:
            return gpu_variance(ENGINE)
        if self.repacked:
            return fast_kernels_variance(ENGINE, "repacked")
        return None if tuning.batch_invariant else gate_variance(ENGINE, self.threads)

    def _load_model(self, gguf_path: str | Path, repack: bool):
        lib = self._lib
        mp = lib.llama_model_default_params()
        mp.n_gpu_layers = self.gpu_layers
        mp.use_mmap = not repack  # repacking rewrites the weights in place
        model = lib.llama_model_load_from_file(os.fsencode(str(gguf_path)), mp)
        if not model:  # ggml's 64 contexts may be held by unreachable backends: collect them, then once more
            gc.collect()
            model = lib.llama_model_load_from_file(os.fsencode(str(gguf_path)), mp)
        if not model:
            raise RuntimeError(f"ik_llama.cpp could not load {gguf_path} (an architecture or quantisation it does "
                               "not read); use --backend llamacpp")
        return model

    def _new_context(self, gguf_path: str | Path):
        lib = self._lib
        cp = lib.llama_context_default_params()
        cp.n_ctx, cp.n_threads, cp.n_threads_batch = self.n_ctx, self.threads, self.threads
        cp.n_batch, cp.n_ubatch = 512, self.max_call
        cp.flash_attn = False  # ik's flash attention is not batch-invariant beyond a sliding window (Gemma 3)
        ctx = lib.llama_init_from_model(self._model, cp)
        if not ctx:
            lib.llama_free_model(self._model)
            self._model = None
            raise RuntimeError(f"ik_llama.cpp could not create a context of {self.n_ctx} positions for {gguf_path}")
        return ctx

    def _bind_batch(self) -> None:
        """One llama_batch of n_batch rows for every call, its arrays viewed as NumPy (sequence 0 throughout)."""
        self._batch = b = self._lib.llama_batch_init(self._n_batch, 0, 1)
        self._tok = np.ctypeslib.as_array(b.token, shape=(self._n_batch,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(self._n_batch,))
        np.ctypeslib.as_array(b.n_seq_id, shape=(self._n_batch,))[:] = 1
        for i in range(self._n_batch):
            b.seq_id[i][0] = 0
        self._want = np.ctypeslib.as_array(b.logits, shape=(self._n_batch,))  # which rows' logits, set per call

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
            if getattr(self, "_batch", None) is not None:
                self._lib.llama_batch_free(self._batch)
                self._batch = None
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
