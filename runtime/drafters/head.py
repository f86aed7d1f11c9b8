"""The head drafter (`--drafter head:<dir>`, docs/drafters.md): an EAGLE-3-style trained draft head (one decoder
layer over the target's tapped hidden states and the next token's embedding, its own trimmed vocabulary mapped to
target ids by d2t), run in float32 NumPy with its own KV cache. The files and the math: head_model.py and
docs/drafters.md "The head drafter" (the format the trainer writes).

Where its inputs come from (the Drafter seam's taps, base.py caps.reads_taps): the stepper's prefill runs the target
as hidden(prompt, taps=verify_taps) and calls observe_prompt; each verify forward taps the same layers and calls
observe_verify with the emitted tokens. So the head costs the target nothing extra.

KV (the one place this is written down): the head's entry at position p is the decoder layer run at t = p - 1 with
g = fc(taps of the target at t) and e = embed(x_p): its K/V (RoPE at p) and its output o (before the final norm).
Entries exist only where the target's taps were seen: a session that reuses a cached prefix the head did not
observe (another conversation's, or a call made without the head) leaves a hole there, and the head attends over
the entries it has (positions in ascending order). Drafting from context x_0..x_P reads the entry at P (its o gives
the first draft's logits), then runs steps at P+1, P+2, ... with g = the previous step's o and e = the token it
drafted; those rows are dropped when `propose` returns, so rollback after partial acceptance is nothing to do: the
next verify's taps write the true entries. Correctness never depends on the head, only acceptance does: without an
entry at P (nothing observed there) it drafts nothing that round.
"""
from __future__ import annotations

import enum

import numpy as np

from ..sampling import logits_to_probs, sample
from ..session import common_prefix
from ..types import EMPTY_DRAFT, Draft, SamplingParams, Tokens
from ..vocab_trim import expand_logits
from .base import BackendNeed, Drafter, DrafterCaps
from .head_model import HeadModel, TargetEmbedding

CHUNK = 64  # prompt rows the head ingests per call: bounds the [H, T, S] attention scores (and a packed call's rows)
_MATRICES = ("fc", "wqkv", "wo", "w_gate_up", "w_down", "lm_head")


class Precision(enum.Enum):
    """How the head's matrices run. Either way the output is the target's (the head only drafts)."""

    FP32 = "fp32"  # the format's float32 math, NumPy's BLAS (the reference; what the trainer computes)
    Q8_0 = "q8_0"  # weights as 8-bit blocks of 32 through the native engine's kernels, activations quantized per 32
    #                as it does for its own matmuls: 4x fewer bytes per drafted token (logits within ~0.5%)


def default_precision() -> Precision:
    """Q8_0 where the native kernels are built, else FP32."""
    from ..backends import native_lib
    return Precision.Q8_0 if native_lib.available() is None else Precision.FP32


class Linear:
    """y = x @ w.T for w [out, in] float32: NumPy, or the native engine's packed Q8_0 matmul (in % 32 == 0)."""

    def __init__(self, w: np.ndarray, precision: Precision) -> None:
        self.w, self.packed = w, None
        self.pool = None  # a native target's matmul(packed, x): the packed matrix on its thread pool (HeadRunner.use)
        if precision is Precision.Q8_0 and w.shape[1] % 32 == 0:
            from gguf import GGMLQuantizationType
            from gguf.quants import quantize
            from ..backends.native_lib import PackedMatrix
            raw = quantize(w, GGMLQuantizationType.Q8_0).view(np.uint8).reshape(w.shape[0], -1)
            self.packed = PackedMatrix("Q8_0", raw)

    @property
    def nbytes(self) -> int:
        return int(self.w.nbytes) if self.packed is None else self.packed.nbytes

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.packed is None:
            return x @ self.w.T
        if self.pool is not None:
            return self.pool(self.packed, x)
        return self.packed.matmul(x)


class HeadCache:
    """The head's K/V, [KV, capacity, hd] each, the position of each row and its output o [capacity, D]; rows in
    ascending position order, `n` of them; grows by doubling."""

    def __init__(self, n_kv: int, head_dim: int, dim: int, capacity: int = 256) -> None:
        self.k = np.zeros((n_kv, capacity, head_dim), dtype=np.float32)
        self.v = np.zeros_like(self.k)
        self.pos = np.zeros(capacity, dtype=np.int64)
        self.o = np.zeros((capacity, dim), dtype=np.float32)
        self.n = 0

    def truncate(self, position: int) -> None:
        """Forget the rows at positions >= position."""
        self.n = int(np.searchsorted(self.pos[:self.n], position, side="left"))

    def reserve(self, t: int) -> None:
        cap = self.k.shape[1]
        if self.n + t <= cap:
            return
        new = max(2 * cap, self.n + t)
        for name in ("k", "v"):
            old = getattr(self, name)
            grown = np.zeros((old.shape[0], new, old.shape[2]), dtype=np.float32)
            grown[:, :self.n] = old[:, :self.n]
            setattr(self, name, grown)
        self.pos = np.concatenate([self.pos[:self.n], np.zeros(new - self.n, dtype=np.int64)])
        self.o = np.concatenate([self.o[:self.n], np.zeros((new - self.n, self.o.shape[1]), dtype=np.float32)])

    @property
    def last_position(self) -> int:
        return int(self.pos[self.n - 1]) if self.n else -1


def _rms(x: np.ndarray, eps: float) -> np.ndarray:
    """x [T, D] / sqrt(mean(x^2) + eps) (the weight is folded into the next matmul: head_model.py)."""
    ms = np.einsum("ij,ij->i", x, x) * np.float32(1.0 / x.shape[1])
    return x * (1.0 / np.sqrt(ms + np.float32(eps)))[:, None]


class HeadRunner:
    """The head's forward over its cache (docs/drafters.md "The head drafter"), float32 or Q8_0 matrices."""

    def __init__(self, head: HeadModel, precision: Precision = Precision.FP32) -> None:
        c = self.c = head.config
        self.w = {n: Linear(head.w[n], precision) for n in _MATRICES}
        self.d2t = head.d2t
        self.group = c.n_heads // c.n_kv_heads
        self.inv_freq = c.rope_theta ** (-np.arange(0, c.head_dim, 2, dtype=np.float64) / c.head_dim)
        self._cos = self._sin = np.zeros((0, c.head_dim // 2), dtype=np.float32)
        self.scale = np.float32(1.0 / np.sqrt(c.head_dim))
        self.split = (c.n_heads * c.head_dim, (c.n_heads + c.n_kv_heads) * c.head_dim)

    def use(self, target) -> None:
        """Run the packed (Q8_0) matrices on the target's thread pool when it offers one (the native engine's
        `matmul`: the same bits as one thread, each output row computed by one thread), else on the calling thread."""
        pool = getattr(target, "matmul", None)
        for lin in self.w.values():
            lin.pool = pool if lin.packed is not None else None

    def fuse(self, taps: list[np.ndarray]) -> np.ndarray:
        """g = fc @ concat(taps) : [T, nT*D] -> [T, D]."""
        return self.w["fc"](np.concatenate([np.asarray(t, dtype=np.float32) for t in taps], axis=1))

    def bytes_per_token(self, first: bool = False) -> int:
        """Weight bytes one drafted token reads (`first`: the step that fuses taps, fc included)."""
        return sum(self.w[n].nbytes for n in _MATRICES if first or n != "fc") + 4 * self.c.hidden

    def rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """NeoX / HF rotate-half RoPE of x [T, heads, hd] at positions pos [T] (float64 angles, float32 tables grown
        by doubling)."""
        if pos[-1] >= len(self._cos):
            ang = np.arange(max(2 * len(self._cos), int(pos[-1]) + 1, 256), dtype=np.float64)[:, None] * self.inv_freq
            self._cos, self._sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
        cos, sin = self._cos[pos][:, None, :], self._sin[pos][:, None, :]
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def step(self, cache: HeadCache, g: np.ndarray, e: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """One decoder layer over T rows (g, e [T, D], RoPE positions pos [T], ascending and past every cached
        row): appends their K/V and o to the cache and returns o [T, D]."""
        c, w, t = self.c, self.w, len(pos)
        u = np.concatenate([_rms(e, c.rms_eps), _rms(g, c.rms_eps)], axis=1)  # norm weights are in wqkv
        qkv = w["wqkv"](u)
        qk = self.rope(qkv[:, :self.split[1]].reshape(t, c.n_heads + c.n_kv_heads, c.head_dim), pos)
        q, k = qk[:, :c.n_heads], qk[:, c.n_heads:]
        cache.reserve(t)
        s = slice(cache.n, cache.n + t)
        cache.k[:, s] = k.transpose(1, 0, 2)
        cache.v[:, s] = qkv[:, self.split[1]:].reshape(t, c.n_kv_heads, c.head_dim).transpose(1, 0, 2)
        cache.pos[s] = pos
        n = cache.n + t
        # query heads grouped under their KV head (head h reads KV head h // group): [KV, G*T, hd]
        qg = q.reshape(t, c.n_kv_heads, self.group, c.head_dim).transpose(1, 2, 0, 3).reshape(c.n_kv_heads, -1,
                                                                                               c.head_dim)
        scores = (qg @ cache.k[:, :n].transpose(0, 2, 1)) * self.scale  # [KV, G*T, S]
        if t > 1:  # causal by position (a hole is simply absent)
            allowed = cache.pos[:n][None, :] <= pos[:, None]  # [T, S]
            scores = np.where(np.tile(allowed, (self.group, 1))[None], scores, np.float32(-np.inf))
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        attn = (scores @ cache.v[:, :n]).reshape(c.n_kv_heads, self.group, t, c.head_dim)
        r = g + w["wo"](attn.transpose(2, 0, 1, 3).reshape(t, -1))
        gu = w["w_gate_up"](_rms(r, c.rms_eps))  # post_norm is in w_gate_up
        gate, up = gu[:, :c.ffn], gu[:, c.ffn:]
        o = r + w["w_down"]((gate / (1.0 + np.exp(-gate))) * up)
        cache.o[s] = o
        cache.n = n
        return o

    def logits(self, o: np.ndarray) -> np.ndarray:
        """Draft logits [T, Vd] = lm_head @ RMSNorm(o, norm) (norm folded into lm_head)."""
        return self.w["lm_head"](_rms(o, self.c.rms_eps))


class HeadDrafter(Drafter):
    """A chain drafter over a trained head (module docstring); q rows over the draft vocabulary mapped to target ids
    (zero elsewhere), so speculative sampling stays lossless."""

    caps = DrafterCaps(reads_taps=True, pays_per_token=True, needs=frozenset({BackendNeed.TAPS}))

    def __init__(self, head: HeadModel, embedding: TargetEmbedding, *, name: str | None = None,
                 precision: Precision = Precision.FP32) -> None:
        c = head.config
        self.head, self.embedding = head, embedding
        self.run = HeadRunner(head, precision)
        self.cache = HeadCache(c.n_kv_heads, c.head_dim, c.hidden)
        self.name = name or f"head:{head.path if head.path is not None else c.model}"
        self.verify_taps = tuple(c.taps)
        self.weight_bytes_per_token = self.run.bytes_per_token()
        self._held = np.zeros(0, dtype=np.int32)  # the committed tokens the cache's rows were computed from

    def check(self, target) -> None:
        super().check(target)
        self.head.check_target(target.config)
        self.run.use(target)  # checked against the target it drafts for: its thread pool, where it has one

    def observe_prompt(self, taps: dict[int, np.ndarray], tokens: Tokens, start: int) -> None:
        """Prefill's taps {n: [T - 1 - start, D]} at positions start..T-2 of tokens [T]: entries start+1..T-1. Rows the
        cache holds from an earlier sequence are kept while the tokens agree (and below `start`)."""
        tokens = np.asarray(tokens, dtype=np.int32)
        self.cache.truncate(min(common_prefix(self._held, tokens), start + 1))
        self._held = tokens.copy()
        rows = len(tokens) - 1 - start
        for a in range(0, max(rows, 0), CHUNK):
            b = min(rows, a + CHUNK)
            self._ingest([taps[n][a:b] for n in self.verify_taps], tokens[start + 1 + a:start + 1 + b],
                         start + 1 + a)

    def observe_verify(self, taps: dict[int, np.ndarray], emitted: Tokens) -> None:
        """The verify forward's taps (rows at positions C-1.. for C committed tokens before the round) and the m
        emitted tokens: entries C..C+m-1 (the draft's rows were dropped when it was proposed)."""
        m, c = len(emitted), len(self._held)
        self.cache.truncate(c)
        self._held = np.concatenate([self._held, np.asarray(emitted, dtype=np.int32)])
        self._ingest([taps[n][:m] for n in self.verify_taps], emitted, c)

    def _ingest(self, taps: list[np.ndarray], tokens: np.ndarray, first: int) -> None:
        """Entries at positions first.. for tokens [T] (e) and the target's taps one position before each."""
        pos = first + np.arange(len(tokens), dtype=np.int64)
        self.run.step(self.cache, self.run.fuse(taps), self.embedding.rows(tokens), pos)

    def propose(self, context: Tokens, k: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        """Up to k tokens after context (argmax under greedy params, else sampled from q = logits_to_probs of the
        draft logits over the target vocabulary, -inf off d2t); nothing when no entry exists at len(context) - 1."""
        p = len(context) - 1
        self.cache.truncate(p + 1)
        if k <= 0 or self.cache.last_position != p:
            return EMPTY_DRAFT
        run, d2t, greedy = self.run, self.head.d2t, params.greedy
        vocab = self.head.config.vocab
        tokens = np.zeros(k, dtype=np.int32)
        q = None if greedy else np.zeros((k, vocab), dtype=np.float64)
        o = self.cache.o[self.cache.n - 1:self.cache.n]
        try:
            for i in range(k):
                logits = run.logits(o)
                if greedy:
                    tokens[i] = d2t[int(np.argmax(logits[0]))]
                else:
                    history = np.concatenate([context, tokens[:i]])
                    q[i] = logits_to_probs(expand_logits(logits, d2t, vocab), params, history=history)[0]
                    tokens[i] = sample(q[i], rng)
                if i + 1 < k:
                    o = run.step(self.cache, o, self.embedding.rows(tokens[i:i + 1]), np.array([p + 1 + i]))
        finally:
            self.cache.truncate(p + 1)  # the draft's rows: the verify's taps write the true ones
        return Draft(tokens=tokens, q=q)
