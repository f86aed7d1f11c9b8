"""ONNX Runtime backend for artifacts of the static-shape profile (export/onnx_static.py; NPU execution providers).

Every call runs the graph on exactly W positions against fixed [1, n_kv, C, head_dim] caches. The runtime owns
everything that varies:
- chunking: T > W tokens (a prompt) go in W-sized pieces; a shorter piece is padded with copies of its last token
  at its last position (they compute that row again, identically, and their logits are dropped);
- the mask: row i may read slots 0..position_i (the committed cache and the causal part of the new rows; slot =
  position), everything else gets the manifest's mask_value;
- the cache: numpy buffers (bound to the session without copies) into which the real rows' new K/V are copied
  at [L, L + t) after each call. The length cursor is the only state; rollback moves it back, and rows past it are
  masked until overwritten.
"""
from __future__ import annotations

import numpy as np

from ...models.config import ModelConfig
from ...models.manifest import Manifest, Profile, manifest_with_profile
from ..cores import cpu_info
from ..kv import LengthCursor
from ..types import Logits, Mask, Tokens
from .base import BackendCaps, LayerPlan
from .onnx_providers import Device
from .onnx_session import open_session, read_bytes_per_token
from .onnxrt import artifact_variance


def _too_long(need: int, c: int) -> str:
    return (f"this static-shape artifact holds at most {c} positions (exported with --max-context {c}); "
            f"{need} are needed: shorten the prompt or lower --max-tokens, or re-export with a larger --max-context")


class StaticCache(LengthCursor):
    """The K/V buffers of one sequence plus the preallocated per-call inputs and outputs, all bound once."""

    def __init__(self, backend: "StaticOnnxBackend", capacity: int) -> None:
        c, io, w = backend.config, backend.io, backend.width
        ort = backend.ort
        self._capacity = capacity
        self._length = 0
        kv = (1, c.n_kv_heads, backend.max_context, c.head_dim)
        self.k = [np.zeros(kv, np.float32) for _ in range(c.n_layers)]  # [1, n_kv, C, hd] slot = position
        self.v = [np.zeros(kv, np.float32) for _ in range(c.n_layers)]
        self.ids = np.zeros((1, w), np.int64)
        self.pos = np.zeros((1, w), np.int64)
        self.bias = np.zeros((1, 1, w, backend.max_context), np.float32)
        self.logits = np.zeros((1, w, c.vocab_size), np.float32)
        new = (1, c.n_kv_heads, w, c.head_dim)
        self.new_k = [np.zeros(new, np.float32) for _ in range(c.n_layers)]
        self.new_v = [np.zeros(new, np.float32) for _ in range(c.n_layers)]
        self.binding = backend.session.io_binding()
        self._values = []  # OrtValues over the numpy buffers (CPU: shared memory), alive as long as the binding
        # A plugin EP (OpenVINO's) keeps inputs in its own memory: onnxruntime copies a bound input when it is bound,
        # so later writes to the numpy buffers would go unseen; for such a session the inputs are bound per run.
        self.rebind = bool(backend.choice.ep_devices)

        def bind(name: str, array: np.ndarray, output: bool = False) -> None:
            value = ort.OrtValue.ortvalue_from_numpy(array)
            (self.binding.bind_ortvalue_output if output else self.binding.bind_ortvalue_input)(name, value)
            self._values.append(value)

        self._inputs = [(io["input_ids"], self.ids), (io["position_ids"], self.pos), (io["attention_bias"], self.bias)]
        self._inputs += [(io[n].format(i=i), a[i]) for i in range(c.n_layers)
                         for n, a in (("past_key", self.k), ("past_value", self.v))]
        self.bind_inputs = lambda: [self.binding.bind_cpu_input(n, a) for n, a in self._inputs]
        for name, array in self._inputs:
            bind(name, array)
        bind(io["logits"], self.logits, output=True)
        for i in range(c.n_layers):
            bind(io["new_key"].format(i=i), self.new_k[i], output=True)
            bind(io["new_value"].format(i=i), self.new_v[i], output=True)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in (*self.k, *self.v))


class StaticOnnxBackend:
    """caps: chains only (the bias input could carry tree masks; not wired yet); max_context = C."""

    name = "onnx"

    def __init__(self, manifest: Manifest | str, *, device: Device | str = Device.CPU, threads: int | None = None,
                 verify: bool = True, log=None) -> None:
        self.manifest = manifest_with_profile(manifest, Profile.STATIC, verify=verify)
        self.config: ModelConfig = self.manifest.config
        self.io = self.manifest.io
        self.width = int(self.io["verify_width"])
        self.max_context = int(self.io["max_context"])
        self.mask_value = np.float32(self.io["mask_value"])
        self.caps = BackendCaps(tree_mask=False, layer_plan=False, partial_rollback=True,
                                max_batch_tokens=self.max_context, max_context=self.max_context,
                                variance=artifact_variance(self.manifest, 0, cpu_info()[1]))
        self._slots = np.arange(self.max_context)
        self.ort, self.session, self.choice, self.threads = open_session(self.manifest, device, threads, log)
        self._weight_bytes = read_bytes_per_token(self.manifest.model_path)

    def new_cache(self, max_len: int) -> StaticCache:
        if max_len > self.max_context:
            raise ValueError(f"a cache of {max_len} positions (prompt + --max-tokens + draft room) does not fit: "
                             + _too_long(max_len, self.max_context))
        return StaticCache(self, max_len)

    def weight_bytes(self, plan: LayerPlan | None = None) -> int:
        """Initializer bytes one call reads (read_bytes_per_token); one call computes W positions."""
        return self._weight_bytes

    def forward(self, tokens: Tokens, cache: StaticCache, *, tree_mask: Mask | None = None,
                plan: LayerPlan | None = None) -> Logits:
        """float32 logits [T, V] for tokens appended at cache.length, in ceil(T / W) session runs."""
        if tree_mask is not None or plan is not None:
            raise ValueError("the ONNX backend runs chains of the full model (no tree masks or layer plans yet)")
        tokens = np.asarray(tokens, dtype=np.int64)
        t = len(tokens)
        if t == 0:
            raise ValueError("forward needs at least one token")
        if cache.length + t > cache.capacity:
            raise ValueError(f"context full: {cache.length} cached + {t} new tokens exceeds the cache capacity "
                             f"{cache.capacity}" + ("" if cache.capacity < self.max_context else
                                                    "; " + _too_long(cache.length + t, self.max_context)))
        out = np.empty((t, self.config.vocab_size), np.float32)
        for start in range(0, t, self.width):
            piece = tokens[start:start + self.width]
            out[start:start + len(piece)] = self._run(piece, cache)
        return out

    def _run(self, piece: np.ndarray, cache: StaticCache) -> np.ndarray:
        """One session run on n <= W tokens at cache.length; copies their K/V rows into the cache; [n, V]."""
        n, base, w = len(piece), cache.length, self.width
        cache.ids[0, :n] = piece
        cache.ids[0, n:] = piece[-1]  # pad rows repeat the last real row: same K/V, same slot
        cache.pos[0] = base + np.minimum(np.arange(w), n - 1)
        np.copyto(cache.bias[0, 0], np.where(self._slots[None, :] <= cache.pos[0][:, None], np.float32(0),
                                             self.mask_value))
        if cache.rebind:
            cache.bind_inputs()
        self.session.run_with_iobinding(cache.binding)
        for i in range(self.config.n_layers):
            cache.k[i][0, :, base:base + n] = cache.new_k[i][0, :, :n]
            cache.v[i][0, :, base:base + n] = cache.new_v[i][0, :, :n]
        cache.advance(n)
        return cache.logits[0, :n]
