"""llama.cpp through llama-cpp-python: one batched decode of the k+1 verify positions with their logits,
rollback by removing the rejected positions from llama.cpp's KV memory.

We drive `llama_decode` directly rather than `Llama.eval(logits_all=True)`, which would preallocate an
[n_ctx, V] float32 score buffer (1.6 GB at 8k context and a 49k vocabulary).
One llama.cpp context holds one sequence: `new_cache` clears it, so a backend serves one live cache.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import numpy as np

from ...models.config import ModelConfig
from ..cores import default_threads
from ..kv import LengthCursor
from ..types import Logits, Mask, Tokens
from .base import BackendCaps, LayerPlan, Variance, check_room, fast_kernels_variance, gpu_variance
from .llamacpp_tokenizer import LlamaCppTokenizer


_LOG_CALLBACK = None  # kept referenced: llama.cpp calls it for as long as the process runs
_GGML_LOG_ERROR = 4  # ggml_log_level: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (llama-cpp-python's
# _logger.py still maps the older order, so its verbose=False shows every warning)


def _import_llama():
    try:
        import llama_cpp  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("the llama.cpp backend needs llama-cpp-python: pip install 'specedge[llama]'") from e
    _quiet_logs(llama_cpp)
    return llama_cpp


def _quiet_logs(llama_cpp) -> None:
    """llama.cpp's errors reach stderr, its warnings and notes do not (llama-cpp-python's verbose=False still lets
    warnings through, e.g. gemma3's "using full-size SWA cache" on every context);
    SPECEDGE_LLAMA_LOG=1 keeps llama-cpp-python's own logger."""
    global _LOG_CALLBACK
    if _LOG_CALLBACK is not None or os.environ.get("SPECEDGE_LLAMA_LOG"):
        return

    @llama_cpp.llama_log_callback
    def errors_only(level: int, text: bytes, user_data) -> None:
        if level == _GGML_LOG_ERROR:
            sys.stderr.write(text.decode("utf-8", "replace"))

    _LOG_CALLBACK = errors_only
    llama_cpp.llama_log_set(errors_only, ctypes.c_void_p(0))


@contextlib.contextmanager
def _model_params(**fields):
    """llama-cpp-python's Llama() takes its llama_model_params from llama_model_default_params() and exposes no
    argument for some fields (use_extra_bufts): set them there for the duration of one construction."""
    from llama_cpp import llama_cpp as lib
    default = lib.llama_model_default_params

    def params():
        p = default()
        for k, v in fields.items():
            setattr(p, k, v)
        return p
    lib.llama_model_default_params = params
    try:
        yield
    finally:
        lib.llama_model_default_params = default


THREADS_VARIANCE = Variance("on llama.cpp is not batch-invariant here (its verify batches round differently from "
                            "one-token calls at this thread count)",
                            "--backend ik is batch-invariant at any thread count, --threads 1 makes llama.cpp exact")
FILE_VARIANCE = Variance("on llama.cpp is not batch-invariant (its verify batches round differently from one-token "
                         "calls on this file, even at 1 thread with flash attention)",
                         "--backend ik is batch-invariant at any thread count")


def _variance(flash_attn: bool, threads: int, gpu_layers: int) -> Variance | None:
    """What llama.cpp's settings leave of batch invariance (before the per-file probe): flash attention at 1 thread
    on the CPU is the only exact setting."""
    if gpu_layers:
        return gpu_variance("llama.cpp")
    if not flash_attn:
        return fast_kernels_variance("llama.cpp", "without flash attention")
    return THREADS_VARIANCE if threads > 1 else None


class LlamaCppCache(LengthCursor):
    """The Cache protocol (backends/base.py) over llama.cpp's memory for sequence 0."""

    def __init__(self, backend: "LlamaCppBackend", capacity: int) -> None:
        self._backend = backend
        self._capacity = capacity
        self._length = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    def _forget(self, length: int) -> None:
        self._backend._llm._ctx.kv_cache_seq_rm(0, length, -1)


class LlamaCppBackend:
    name = "llamacpp"
    caps = BackendCaps(tree_mask=False, layer_plan=False, partial_rollback=True, max_batch_tokens=512,
                       own_tokenizer=True)

    def __init__(self, gguf_path: str | Path, config: ModelConfig, *, n_ctx: int | None = None,
                 n_threads: int | None = None, n_batch: int = 512, f32_kv: bool = False,
                 flash_attn: bool = True, no_weights: str | None = None, gpu_layers: int = 0) -> None:
        """f32_kv + flash_attn=False: K/V in float32 and float32 attention, for exact parity checks.
        gpu_layers: llama.cpp's n_gpu_layers (-1: all), for builds with GPU offload (Metal, CUDA, Vulkan); a GPU's
        kernels are chosen by batch width, so an offloaded model is not claimed batch-invariant (speculation on it
        is not token-identical to plain greedy; the planner then plans it plain).
        no_weights: why our code cannot read this file's weights (a GGUF without a family module, models/gguf_any.py):
        drafters that run the target's own layers (layer skip, early exit, LoRA-Drop) and tree drafters are refused
        with it.

        Flash attention (the default) makes a position's logits independent of how many tokens share its batch:
        without it, llama.cpp's CPU attention gives a verify batch logits up to ~1.0 away from one-token decoding
        (measured on SmolLM2 Q4_1), which flips greedy argmaxes; with it T=1 and T=16 agree bit for bit. It
        rounds Q/K/V to float16 inside attention, so exact comparisons turn it off.
        """
        llama_cpp = _import_llama()
        self._lib = llama_cpp
        self.threads = threads = default_threads(n_threads)
        kv_type = llama_cpp.GGML_TYPE_F32 if f32_kv else llama_cpp.GGML_TYPE_F16
        self.config = config
        self.n_ctx = int(n_ctx or config.context_length)
        # with flash attention, batch and one-token attention are bit-identical at 1 thread; with more, llama.cpp
        # splits a one-token query's attention across threads differently beyond ~100 cached tokens (README,
        # "Exactness"); the matrix products are probed per file (_batches_match_single_steps)
        hint = None if no_weights is None else (
            f"only llama.cpp runs this file ({no_weights}), and llama.cpp runs chains of the full model; use a "
            "drafter that needs only token ids (ngram, lookup) or a draft model with the same vocabulary "
            "(model:<gguf>)")
        self.gpu_layers = int(gpu_layers)
        self.caps = replace(type(self).caps, max_context=self.n_ctx, layer_hint=hint, reuse_hint=hint, tree_hint=hint,
                            variance=_variance(flash_attn, threads, self.gpu_layers))
        # Repacked weights (llama.cpp's CPU "extra buffer types": Q4_0/Q4_K/IQ4_NL rows interleaved for AVX2/AVX-512)
        # take one kernel for a single token and another for a batch, so a verify batch's logits differ from one-token
        # decoding (Gemma 3 Q4_K_M: 4 of 20 dev prompts diverged); where batches can be exact (flash attention, 1
        # thread) the weights stay as stored: measured on Gemma 3 at 1 thread, one-token steps 33 tok/s either way.
        with _model_params(use_extra_bufts=not (flash_attn and threads == 1)):
            self._llm = llama_cpp.Llama(
                model_path=str(gguf_path), n_gpu_layers=self.gpu_layers, n_ctx=self.n_ctx, n_batch=n_batch,
                n_ubatch=n_batch, n_threads=threads,
                n_threads_batch=threads, logits_all=False, type_k=kv_type, type_v=kv_type, flash_attn=flash_attn,
                verbose=False)
        self._n_vocab = self._llm.n_vocab()
        if self._n_vocab != config.vocab_size:
            raise ValueError(f"llama.cpp reports vocabulary {self._n_vocab}, the GGUF config says {config.vocab_size}")
        self._size = int(Path(gguf_path).stat().st_size)
        self._live: LlamaCppCache | None = None
        if self.caps.batch_invariant and not self._batches_match_single_steps():
            self.caps = replace(self.caps, variance=FILE_VARIANCE)

    def _batches_match_single_steps(self, prefix: int = 4, batch: int = 5) -> bool:
        """Probe (once, at load): after a prefix, do `batch` tokens decoded as one batch give the same logits, bit for
        bit, as one token at a time? Flash attention at 1 thread makes attention batch-invariant, but the matrix
        products are only where llama.cpp runs one kernel for both: SmolLM2's Q4_1 file is (vec_dot either way); Gemma
        3's Q4_K_M file is not when its weights are repacked (one kernel per token, another per batch: greedy speculation
        diverged from plain on 4 of 20 dev prompts), so __init__ keeps them as stored where batches can be exact; this
        probe catches whatever else a build or file may do differently. 2 x 9 token steps; the cache is left empty."""
        n = prefix + batch
        if n > self.n_ctx:
            return False
        ids = [int(i) for i in np.linspace(1, self._n_vocab - 1, n)]
        cache = self.new_cache(n)
        self.feed(ids[:prefix], cache)
        together = self.forward(ids[prefix:], cache)
        cache = self.new_cache(n)
        self.feed(ids[:prefix], cache)
        apart = np.concatenate([self.forward([t], cache) for t in ids[prefix:]])
        self.new_cache(1)
        return bool(np.array_equal(together, apart))

    def set_threads(self, n: int) -> None:
        """The thread count of the next calls (runtime/cores.py ThreadedBackend; llama_set_n_threads). The weights'
        layout was chosen at load for the thread count given then (repacked beyond 1 thread)."""
        if n != self.threads:
            self._lib.llama_set_n_threads(self._llm._ctx.ctx, int(n), int(n))
            self.threads = int(n)

    def new_cache(self, max_len: int) -> LlamaCppCache:
        if max_len > self.n_ctx:
            raise ValueError(f"a cache of {max_len} positions exceeds the llama.cpp context {self.n_ctx}; "
                             "raise --ctx or shorten the request")
        self._llm._ctx.kv_cache_clear()
        self._live = LlamaCppCache(self, max_len)
        return self._live

    def weight_bytes(self, plan: LayerPlan | None = None) -> int:
        """Approximated by the GGUF size (weights dominate; the embedding read is one row per token)."""
        return self._size

    def forward(self, tokens: Tokens, cache: LlamaCppCache, *, tree_mask: Mask | None = None,
                plan: LayerPlan | None = None) -> Logits:
        if tree_mask is not None or plan is not None:
            raise ValueError("the llama.cpp backend runs chains of the full model only (no tree masks or layer plans)")
        out = np.empty((len(tokens), self._n_vocab), dtype=np.float32)
        self._decode(tokens, cache, out)
        return out

    def feed(self, tokens: Tokens, cache: LlamaCppCache) -> None:
        """Append tokens without their logits (FeedingBackend): llama.cpp computes the LM head for the last row of
        each call only (a 700-token prompt skips 699 vocabulary-sized matmuls)."""
        self._decode(tokens, cache, None)

    def _decode(self, tokens: Tokens, cache: LlamaCppCache, out: np.ndarray | None) -> None:
        if cache is not self._live:
            raise ValueError("this cache is not the backend's live sequence (llama.cpp holds one sequence)")
        t = len(tokens)
        check_room(cache, t)
        toks = [int(x) for x in tokens]
        step = self._llm.n_batch
        for s in range(0, t, step):
            chunk = toks[s:s + step]
            self._llm._batch.set_batch(batch=chunk, n_past=cache.length, logits_all=out is not None)
            self._llm._ctx.decode(self._llm._batch)
            n = len(chunk)
            if out is not None:
                out[s:s + n] = np.ctypeslib.as_array(self._llm._ctx.get_logits(),
                                                     shape=(n * self._n_vocab,)).reshape(n, self._n_vocab)
            cache.advance(n)

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's own tokenizer (parse_special=True, no BOS): the reference our tokenizer is tested against."""
        return self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def tokenizer(self, chat_template: str | None, merges: Sequence[str] = ()) -> LlamaCppTokenizer:
        """llama.cpp's own tokenizer for this model (TokenizingBackend): BOS/EOS/end-of-turn ids, add_bos and
        tokenization from llama.cpp's vocabulary; the file's chat template rendered in our sandbox."""
        return LlamaCppTokenizer(MainlineVocab(self._llm), chat_template, merges)


class MainlineVocab:
    """runtime/backends/llamacpp_tokenizer.Vocab over a llama_cpp.Llama (kept alive with it)."""

    def __init__(self, llm) -> None:
        import llama_cpp
        self._lib, self._llm = llama_cpp, llm
        self._vocab = llama_cpp.llama_model_get_vocab(llm.model)

    def n_tokens(self) -> int:
        return self._lib.llama_vocab_n_tokens(self._vocab)

    def bos(self) -> int:
        return self._lib.llama_vocab_bos(self._vocab)

    def specials(self) -> list[int]:
        return [int(self._lib.llama_vocab_eos(self._vocab)), int(self._lib.llama_vocab_eot(self._vocab))]

    def is_eog(self, token: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self._vocab, token))

    def add_bos(self) -> bool:
        return bool(self._lib.llama_vocab_get_add_bos(self._vocab))

    def text(self, token: int) -> bytes:
        return self._lib.llama_vocab_get_text(self._vocab, token)

    def piece(self, token: int, buf, size: int) -> int:
        return self._lib.llama_token_to_piece(self._vocab, token, buf, size, 0, True)

    def tokenize(self, text: bytes) -> list[int]:
        return self._llm.tokenize(text, add_bos=False, special=True)


def vocab_tokenizer(gguf_path: str | Path, chat_template: str | None, merges: Sequence[str] = ()) -> LlamaCppTokenizer:
    """llama.cpp's tokenizer for a GGUF without loading its weights (vocab_only), e.g. for benchmark prompts."""
    llama_cpp = _import_llama()
    llm = llama_cpp.Llama(model_path=str(gguf_path), vocab_only=True, verbose=False)
    return LlamaCppTokenizer(MainlineVocab(llm), chat_template, merges)
