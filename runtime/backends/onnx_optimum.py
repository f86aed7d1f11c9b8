"""ONNX Runtime backend for graphs exported by Hugging Face optimum (manifest format "optimum-onnx").

optimum's text-generation-with-past decoder has this IO (names recorded in the manifest's "io"):

    input_ids                int64 [1, T]
    attention_mask           int64 [1, L + T]                 all ones here (one sequence, no padding)
    position_ids             int64 [1, T]                     L + arange(T)   (absent in some architectures' graphs)
    past_key_values.N.key    [1, n_kv, L, head_dim]           the cache's valid prefix, fed in
    past_key_values.N.value
    logits                   float32 [1, T, V]
    present.N.key            [1, n_kv, L + T, head_dim]       past ++ new rows, a fresh tensor every call
    present.N.value

The graph concatenates past and new K/V into a new present tensor, so every call copies the whole cache (O(L) per
token per layer), where our own builder's GroupQueryAttention writes the T new rows into a shared buffer in place
(runtime/backends/onnxrt.py). That is why `specedge export` builds llama / qwen2 itself and uses optimum only for
architectures it does not build. The cache keeps the last present arrays and a length cursor: rollback lowers the
cursor, and the next call feeds the first `length` rows (a copy only when a rollback left rows past the cursor).
Chains only: optimum's graph takes a 2-D padding mask, not a tree mask.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ...models.config import ModelConfig
from ...models.manifest import Manifest, read_manifest
from ..cores import cpu_info
from ..kv import LengthCursor
from ..types import Logits, Mask, Tokens
from .base import BackendCaps, LayerPlan, check_chain_forward
from .onnx_providers import Device
from .onnx_session import open_session, read_bytes_per_token
from .onnxrt import artifact_variance

_ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


class OptimumCache(LengthCursor):
    """The last present K/V per layer ([1, n_kv, S, head_dim], S >= length) and the length cursor."""

    def __init__(self, capacity: int, empty: list[np.ndarray]) -> None:
        self._capacity = capacity
        self._length = 0
        self.kv: list[np.ndarray] = empty  # past_key_values.0.key, .0.value, 1.key, ... in the graph's input order

    @property
    def capacity(self) -> int:
        return self._capacity

    def valid(self) -> list[np.ndarray]:
        """The committed prefix of every K/V tensor, contiguous (ORT takes C-ordered inputs)."""
        n = self._length
        return [a if a.shape[2] == n else np.ascontiguousarray(a[:, :, :n]) for a in self.kv]

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.kv)


class OptimumBackend:
    """caps: chains only, full model (no tree masks, no layer plans)."""

    name = "onnx"

    def __init__(self, manifest: Manifest | str | Path, *, device: Device | str = Device.CPU,
                 threads: int | None = None, verify: bool = True, log=None) -> None:
        self.manifest = manifest if isinstance(manifest, Manifest) else read_manifest(manifest, verify=verify)
        self.config: ModelConfig = self.manifest.config
        self.io = self.manifest.io
        self.caps = BackendCaps(tree_mask=False, layer_plan=False, partial_rollback=True,
                                max_batch_tokens=self.config.context_length,
                                variance=artifact_variance(self.manifest, 0, cpu_info()[1]))
        self.ort, self.session, self.choice, self.threads = open_session(self.manifest, device, threads, log)
        inputs = {i.name: i for i in self.session.get_inputs()}
        self._past = [self.io[kind].format(i=i) for i in range(self.config.n_layers) for kind in ("past_key",
                                                                                                  "past_value")]
        self._present = [self.io[kind].format(i=i) for i in range(self.config.n_layers)
                         for kind in ("present_key", "present_value")]
        known = {self.io["input_ids"], self.io["attention_mask"], self.io.get("position_ids"), *self._past}
        unknown = sorted(set(inputs) - known)
        missing = sorted(n for n in known - set(inputs) if n is not None)
        if unknown or missing:
            raise ValueError(f"{self.manifest.model_path}: graph inputs do not match the manifest's optimum layout "
                             f"(unexpected {unknown}, missing {missing}); re-export with `--via optimum`")
        self._position_ids = self.io.get("position_ids")
        first = inputs[self._past[0]]
        kv_dtype = _ORT_DTYPES.get(first.type)
        if len(first.shape) != 4 or not all(isinstance(d, int) for d in (first.shape[1], first.shape[3])) \
                or kv_dtype is None:
            raise ValueError(f"{self.manifest.model_path}: past K/V {first.shape} {first.type} is not the "
                             "[batch, heads, past, head_dim] float layout this backend runs")
        self._kv_shape = (1, int(first.shape[1]), 0, int(first.shape[3]))
        self._kv_dtype = kv_dtype
        self._outputs = [self.io["logits"], *self._present]
        self._weight_bytes = read_bytes_per_token(self.manifest.model_path)

    def new_cache(self, max_len: int) -> OptimumCache:
        if max_len > self.config.context_length:
            raise ValueError(f"a cache of {max_len} positions exceeds the model's context {self.config.context_length}"
                             "; lower --ctx")
        return OptimumCache(max_len, [np.zeros(self._kv_shape, self._kv_dtype) for _ in self._past])

    def weight_bytes(self, plan: LayerPlan | None = None) -> int:
        """Initializer bytes one decode step reads (read_bytes_per_token)."""
        return self._weight_bytes

    def forward(self, tokens: Tokens, cache: OptimumCache, *, tree_mask: Mask | None = None,
                plan: LayerPlan | None = None) -> Logits:
        """float32 logits [T, V] for tokens appended at cache.length; one session run for all T positions."""
        t = check_chain_forward("optimum ONNX", tokens, cache, tree_mask, plan)
        n = cache.length
        feeds = {self.io["input_ids"]: np.asarray(tokens, dtype=np.int64).reshape(1, t),
                 self.io["attention_mask"]: np.ones((1, n + t), dtype=np.int64),
                 **dict(zip(self._past, cache.valid()))}
        if self._position_ids:
            feeds[self._position_ids] = np.arange(n, n + t, dtype=np.int64).reshape(1, t)
        logits, *present = self.session.run(self._outputs, feeds)
        cache.kv = present
        cache.advance(t)
        return np.asarray(logits[0], dtype=np.float32)
