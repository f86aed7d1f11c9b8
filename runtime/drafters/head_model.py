"""A trained draft head on disk (docs/drafters.md "The head drafter", the format shared with the trainer):
`<dir>/head.json` (what it was trained for and its shape) + `<dir>/head.npz` (float16 weights, `d2t` int64), read with
allow_pickle=False and checked array by array against head.json and the target before any draft runs.

    HeadModel.load(dir)                      -> config + float32 compute weights (norm weights folded in)
    read_head(dir)                           -> (config, stored arrays): the files as written (export/head_gguf.py)
    head.check_target(config, gguf_sha256)   -> ValueError naming the file and the fix on a mismatch
    save_head(dir, config, arrays)           -> writes both files (the trainer and the tests)
    random_head(target_config, taps, ...)    -> a seeded random head for a target (tests, cost measurements)
    TargetEmbedding                          -> the target's token embedding rows (GGUF rows dequantized on demand)

Folding (exact up to float rounding): RMSNorm(x, w) feeds only matmuls, so `W @ (n(x) * w) = (W * w) @ n(x)`;
the compute weights carry input_norm / hidden_norm in wqkv's columns, post_norm in w_gate_up's, norm in lm_head's.
"""
from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ...models.config import ModelConfig

FORMAT = "specedge-draft-head"
VERSION = 1
JSON_NAME, NPZ_NAME = "head.json", "head.npz"
RETRAIN = "train a head for this model with `specedge train-drafter MODEL`"


@dataclass(frozen=True)
class HeadConfig:
    """head.json: the target it was trained for, its taps and its shape (D = target hidden)."""

    model: str
    gguf_sha256: str | None
    arch: str
    n_layers: int
    hidden: int
    vocab: int
    taps: tuple[int, ...]
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    rope_theta: float
    rms_eps: float
    vocab_draft: int
    training: dict = field(default_factory=dict)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every array head.npz must hold, with its shape."""
        D, q, kv = self.hidden, self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        return {"fc": (D, len(self.taps) * D), "input_norm": (D,), "hidden_norm": (D,), "wq": (q, 2 * D),
                "wk": (kv, 2 * D), "wv": (kv, 2 * D), "wo": (D, q), "post_norm": (D,), "w_gate": (self.ffn, D),
                "w_up": (self.ffn, D), "w_down": (D, self.ffn), "norm": (D,), "lm_head": (self.vocab_draft, D),
                "d2t": (self.vocab_draft,)}

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION,
                "target": {"model": self.model, "gguf_sha256": self.gguf_sha256, "arch": self.arch,
                           "n_layers": self.n_layers, "hidden": self.hidden, "vocab": self.vocab},
                "taps": list(self.taps), "n_heads": self.n_heads, "n_kv_heads": self.n_kv_heads,
                "head_dim": self.head_dim, "ffn": self.ffn, "rope_theta": self.rope_theta, "rms_eps": self.rms_eps,
                "vocab_draft": self.vocab_draft, "training": self.training}

    @classmethod
    def from_json(cls, raw: object, where: Path) -> "HeadConfig":
        """Parse head.json's object; ValueError naming the key and the fix."""
        def bad(why: str) -> ValueError:
            return ValueError(f"{where}: {why}; re-copy the head directory or {RETRAIN}")
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise bad(f"not a draft head (\"format\" must be {FORMAT!r})")
        if raw.get("version") != VERSION:
            raise ValueError(f"{where}: draft head format version {raw.get('version')!r}; this runtime reads "
                             f"version {VERSION}: update specedge or {RETRAIN}")
        target = raw.get("target")
        if not isinstance(target, dict):
            raise bad("no \"target\" object")

        def num(obj: dict, key: str, kind: type, lo: float = 1):
            v = obj.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and int(v) != v) or v < lo:
                raise bad(f"{key!r} must be a {'positive integer' if kind is int else 'positive number'}, got {v!r}")
            return kind(v)

        taps = raw.get("taps")
        if not isinstance(taps, list) or not taps or not all(isinstance(t, int) and not isinstance(t, bool)
                                                             for t in taps):
            raise bad(f"\"taps\" must be a non-empty list of layer counts, got {taps!r}")
        sha = target.get("gguf_sha256")
        if sha is not None and not isinstance(sha, str):
            raise bad("target.gguf_sha256 must be a string or null")
        training = raw.get("training") or {}
        if not isinstance(training, dict):
            raise bad("\"training\" must be an object")
        return cls(model=str(target.get("model", "")), gguf_sha256=sha or None, arch=str(target.get("arch", "")),
                   n_layers=num(target, "n_layers", int), hidden=num(target, "hidden", int),
                   vocab=num(target, "vocab", int), taps=tuple(taps), n_heads=num(raw, "n_heads", int),
                   n_kv_heads=num(raw, "n_kv_heads", int), head_dim=num(raw, "head_dim", int),
                   ffn=num(raw, "ffn", int), rope_theta=num(raw, "rope_theta", float, 1e-9),
                   rms_eps=num(raw, "rms_eps", float, 0), vocab_draft=num(raw, "vocab_draft", int),
                   training=training)

    def check(self, where: Path) -> None:
        """Internal consistency: taps within the target's layers, grouped heads, an even head_dim (RoPE)."""
        why = [f"tap {t} is outside 0..{self.n_layers}" for t in self.taps if not 0 <= t <= self.n_layers]
        if self.n_heads % self.n_kv_heads:
            why.append(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            why.append(f"head_dim {self.head_dim} is odd (RoPE rotates pairs)")
        if self.vocab_draft > self.vocab:
            why.append(f"vocab_draft {self.vocab_draft} exceeds the target vocabulary {self.vocab}")
        if why:
            raise ValueError(f"{where}: {'; '.join(why)}; {RETRAIN}")


@dataclass(frozen=True, eq=False)
class HeadModel:
    """A loaded head: its config and float32 C-contiguous compute weights (norms folded, see the module docstring).
    w: fc [D, nT*D], wqkv [(H+2KV)*hd, 2D], wo [D, H*hd], w_gate_up [2F, D], w_down [D, F], lm_head [Vd, D];
    d2t int64 [Vd] (draft id -> target id)."""

    config: HeadConfig
    w: dict[str, np.ndarray]
    d2t: np.ndarray
    path: Path | None = None

    @classmethod
    def load(cls, root: str | Path) -> "HeadModel":
        return cls.from_arrays(*read_head(root), Path(root))

    @classmethod
    def from_arrays(cls, config: HeadConfig, a: dict[str, np.ndarray], path: Path | None = None) -> "HeadModel":
        """Compute weights from checked stored arrays (float16 or float32)."""
        f = {n: np.asarray(v, dtype=np.float32) for n, v in a.items() if n != "d2t"}
        cols = np.concatenate([f["input_norm"], f["hidden_norm"]])
        w = {"fc": f["fc"], "wqkv": np.concatenate([f["wq"], f["wk"], f["wv"]]) * cols[None, :], "wo": f["wo"],
             "w_gate_up": np.concatenate([f["w_gate"], f["w_up"]]) * f["post_norm"][None, :], "w_down": f["w_down"],
             "lm_head": f["lm_head"] * f["norm"][None, :]}
        return cls(config, {n: np.ascontiguousarray(v, dtype=np.float32) for n, v in w.items()},
                   np.ascontiguousarray(a["d2t"], dtype=np.int64), path)

    @property
    def where(self) -> str:
        return str(self.path) if self.path is not None else "the draft head"

    def check_target(self, target: ModelConfig, gguf_sha256: Callable[[], str] | None = None) -> None:
        """The head fits this target: hidden size, vocabulary, layer count, and (when head.json names one and the
        target is a GGUF) the file's SHA-256 (`gguf_sha256` computes it on demand). ValueError naming the fix."""
        c = self.config
        why = [f"{what} {mine} (the target's: {theirs})" for what, mine, theirs in
               (("hidden size", c.hidden, target.d_model), ("vocabulary", c.vocab, target.vocab_size),
                ("layer count", c.n_layers, target.n_layers)) if mine != theirs]
        if why:
            raise ValueError(f"{self.where} was trained for another model ({c.model or 'unnamed'}): "
                             f"{', '.join(why)}; use a head trained for this model or {RETRAIN}")
        if c.gguf_sha256 and gguf_sha256 is not None and gguf_sha256() != c.gguf_sha256:
            raise ValueError(f"{self.where} was trained on another file of {c.model or 'this model'} (its "
                             f"{JSON_NAME} names GGUF sha256 {c.gguf_sha256[:12]}...): the taps it reads would "
                             f"differ; use the GGUF it names, or {RETRAIN}")


def read_head(root: str | Path) -> tuple[HeadConfig, dict[str, np.ndarray]]:
    """A head directory's checked config and stored arrays (as head.npz holds them); FileNotFoundError/ValueError
    naming the file and the fix."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no draft head directory {root}: give a directory holding {JSON_NAME} and "
                                f"{NPZ_NAME}, or {RETRAIN}")
    for name in (JSON_NAME, NPZ_NAME):
        if not (root / name).is_file():
            raise FileNotFoundError(f"{root / name} is missing: a draft head directory holds {JSON_NAME} and "
                                    f"{NPZ_NAME}; re-copy it or {RETRAIN}")
    try:
        raw = json.loads((root / JSON_NAME).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{root / JSON_NAME} is not valid JSON ({e}); re-copy the head or {RETRAIN}") from None
    config = HeadConfig.from_json(raw, root / JSON_NAME)
    config.check(root / JSON_NAME)
    return config, read_arrays(root / NPZ_NAME, config)


def read_arrays(path: Path, config: HeadConfig) -> dict[str, np.ndarray]:
    """head.npz's arrays, each checked against config.shapes() (float16/float32 weights, integer d2t with ids in
    the target vocabulary, all distinct). ValueError naming the array and the fix."""
    def bad(why: str) -> ValueError:
        return ValueError(f"{path}: {why}; re-copy the head or {RETRAIN}")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {n: z[n] for n in z.files}
    except ValueError as e:  # an object array needs pickle: refused, never unpickled
        raise bad(f"an array cannot be read without pickle ({e}); head files hold plain numeric arrays") from None
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        raise bad(f"not a readable .npz ({e})") from None
    want = config.shapes()
    missing, extra = sorted(set(want) - set(arrays)), sorted(set(arrays) - set(want))
    if missing or extra:
        raise bad(f"arrays missing {missing}, unexpected {extra}")
    for name, shape in want.items():
        a = arrays[name]
        if a.shape != shape:
            raise bad(f"array {name!r} has shape {a.shape}, head.json says {shape}")
        ok = a.dtype.kind in "iu" if name == "d2t" else a.dtype in (np.float16, np.float32)
        if not ok:
            raise bad(f"array {name!r} is {a.dtype}, expected {'int64' if name == 'd2t' else 'float16'}")
        if name != "d2t" and not np.isfinite(a).all():
            raise bad(f"array {name!r} holds non-finite values")
    d2t = arrays["d2t"].astype(np.int64)
    if d2t.min() < 0 or d2t.max() >= config.vocab or len(np.unique(d2t)) != len(d2t):
        raise bad(f"d2t must map each draft id to a distinct target id in 0..{config.vocab - 1}")
    return arrays


def save_head(root: str | Path, config: HeadConfig, arrays: dict[str, np.ndarray], *,
              dtype=np.float16) -> Path:
    """Write head.json + head.npz (weights as `dtype`, float16 by default; d2t int64); checks shapes first."""
    root = Path(root)
    config.check(root / JSON_NAME)
    want = config.shapes()
    if set(arrays) != set(want) or any(np.shape(arrays[n]) != s for n, s in want.items()):
        raise ValueError(f"save_head: arrays must be exactly {want}")
    root.mkdir(parents=True, exist_ok=True)
    out = {n: np.asarray(a, dtype=np.int64 if n == "d2t" else dtype) for n, a in arrays.items()}
    np.savez(root / NPZ_NAME, **out)
    (root / JSON_NAME).write_text(json.dumps(config.to_json(), indent=1), encoding="utf-8")
    return root


def random_head(target: ModelConfig, taps: tuple[int, ...], *, n_heads: int = 4, n_kv_heads: int = 2,
                head_dim: int | None = None, ffn: int | None = None, vocab_draft: int | None = None, seed: int = 0,
                model: str = "tiny", gguf_sha256: str | None = None, rope_theta: float = 10000.0
                ) -> tuple[HeadConfig, dict[str, np.ndarray]]:
    """A seeded random head for `target` (weights ~ N(0, 1/fan_in), norms near 1; d2t a random sorted subset of
    vocab_draft target ids): (config, arrays) for save_head."""
    rng = np.random.default_rng(seed)
    D, V = target.d_model, target.vocab_size
    vd = vocab_draft or V
    config = HeadConfig(model=model, gguf_sha256=gguf_sha256, arch=target.arch, n_layers=target.n_layers, hidden=D,
                        vocab=V, taps=tuple(taps), n_heads=n_heads, n_kv_heads=n_kv_heads,
                        head_dim=head_dim or D // n_heads, ffn=ffn or 2 * D, rope_theta=rope_theta,
                        rms_eps=float(target.rms_eps), vocab_draft=vd, training={"command": "random_head (tests)"})
    arrays = {}
    for name, shape in config.shapes().items():
        if name == "d2t":
            arrays[name] = np.sort(rng.choice(V, vd, replace=False)).astype(np.int64)
        elif len(shape) == 1:
            arrays[name] = (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            arrays[name] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
    arrays["lm_head"] *= 4  # a peaked draft distribution, as the tiny targets' heads are
    return config, arrays


class TargetEmbedding:
    """The target's token embedding, rows on demand: `rows(ids)` -> float32 [n, D] times the family's embedding
    scale (gemma: sqrt(D); models/block.py BlockSpec.embed_scale). GGUF rows are dequantized the first time they
    are asked for and kept, packed in order of first use (memory: the rows seen, not the vocabulary)."""

    def __init__(self, dequant: Callable[[np.ndarray], np.ndarray], vocab: int, dim: int, scale: float) -> None:
        self._dequant, self.scale = dequant, float(scale)
        self._slot = np.full(vocab, -1, dtype=np.int64)  # token id -> row of _store
        self._store = np.zeros((256, dim), dtype=np.float32)
        self._n = 0

    @classmethod
    def from_gguf(cls, gguf) -> "TargetEmbedding":
        """A GGUFModel's token_embd (models/gguf_in.py raw_blocks: the stored rows in canonical order)."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize
        kind, raw = gguf.raw_blocks("embed")
        cfg = gguf.config
        qtype = GGMLQuantizationType[kind]
        return cls(lambda ids: dequantize(raw[ids], qtype).reshape(len(ids), cfg.d_model), cfg.vocab_size,
                   cfg.d_model, cfg.block.embed_scale)

    @classmethod
    def from_array(cls, embed: np.ndarray, scale: float = 1.0) -> "TargetEmbedding":
        """Rows of an in-memory [V, D] embedding (a NumPy reference built from weights)."""
        return cls(lambda ids: embed[ids], embed.shape[0], embed.shape[1], scale)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        slots = self._slot[ids]
        if (slots < 0).any():
            new = np.unique(ids[slots < 0])
            if self._n + len(new) > len(self._store):
                grown = np.zeros((max(2 * len(self._store), self._n + len(new)), self._store.shape[1]), np.float32)
                grown[:self._n] = self._store[:self._n]
                self._store = grown
            self._store[self._n:self._n + len(new)] = \
                np.asarray(self._dequant(new), dtype=np.float32) * np.float32(self.scale)
            self._slot[new] = self._n + np.arange(len(new))
            self._n += len(new)
            slots = self._slot[ids]
        return self._store[slots]
