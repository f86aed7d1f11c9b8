"""LoRA-Drop (docs/algorithms.md 2.5): training-free low-rank corrections for temporal layer reuse, their storage, and
the cycle schedule that the drafter, the lossy mode and the perplexity script share.

Definitions (what the fit and the runtime agree on):
  in_l(t)    = the residual stream entering layer l at position t (h after the first l layers);
  out_l(t)   = the residual delta layer l adds there: block_l(in_l(t)) - in_l(t);
  cycle c    = one refresh step (the full model; every layer's out_l is recorded as its anchor) followed by c - 1
               drop steps on which each droppable layer adds `anchor_l + scale * B_l A_l in_l` (runtime/backends/
               base.py LowRankReuse) and the other layers run as usual;
  anchor     = out_l at the most recent refresh position: position t has refresh position t - (t - t0) % c.
Fit on calibration positions that are drop steps of that schedule (full-model activations, teacher forced):
  X = in_l [D, M], D_l = out_l - out_anchor_l [D, M]; W = D_l X^T (X X^T + lambda I)^-1 with
  lambda = ridge * tr(X X^T) / D (scale-free); U_r = top-r left singular vectors of W X; B = U_r, A = U_r^T W.
  scale = 1 (the fit absorbs the official s = 2). rank 0 = pure reuse (A = B = 0).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from .backends.base import LayerPlan, LayeredBackend, LowRankReuse
from .types import Logits, Tokens

ARRAYS = "lora_drop.npz"  # one .npy per tensor inside a zip, read with allow_pickle=False
MANIFEST = "lora_drop.json"
FORMAT = 1


def droppable_layers(n_layers: int, every: int = 4) -> tuple[int, ...]:
    """The official rule: layer l is droppable when l > 0 and l % every != 0 (every=4 in the paper's code)."""
    if every < 2:
        raise ValueError(f"every={every}: keep at least every other layer (every >= 2)")
    return tuple(i for i in range(n_layers) if i > 0 and i % every != 0)


@dataclass(frozen=True)
class LoRADropFit:
    """What to fit: `rank=8,cycle=4[,ridge=1e-3,every=4]` (the --lora-drop option's syntax)."""

    rank: int = 8
    cycle: int = 4
    ridge: float = 0.1  # measured: held-out drop-step error 0.48-0.87 of pure reuse vs 0.81-0.96 at 1e-3 (SmolLM2)
    every: int = 4

    @classmethod
    def parse(cls, text: str) -> "LoRADropFit":
        kw: dict = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, _, val = part.partition("=")
            if key not in ("rank", "cycle", "ridge", "every") or not val:
                raise ValueError(f"--lora-drop {text!r}: use key=value pairs from rank, cycle, ridge, every "
                                 "(e.g. rank=8,cycle=4)")
            kw[key] = float(val) if key == "ridge" else int(val)
        spec = cls(**kw)
        if spec.rank < 0 or spec.cycle < 2 or spec.ridge < 0:
            raise ValueError(f"--lora-drop {text!r}: need rank >= 0, cycle >= 2 (one refresh + drop steps), ridge >= 0")
        return spec


@dataclass(frozen=True, eq=False)
class Corrections:
    """Per droppable layer: a [r, D], b [D, r] (r = rank; 0 = pure reuse)."""

    cycle: int
    layers: tuple[int, ...]
    a: tuple[np.ndarray, ...]
    b: tuple[np.ndarray, ...]
    scale: float = 1.0
    provenance: dict = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return int(self.a[0].shape[0]) if self.a else 0

    def truncated(self, rank: int) -> "Corrections":
        """The first `rank` singular directions (the fit orders them by singular value)."""
        if rank > self.rank:
            raise ValueError(f"rank {rank} > fitted rank {self.rank}: refit with a larger rank")
        return Corrections(self.cycle, self.layers, tuple(a[:rank] for a in self.a), tuple(b[:, :rank] for b in self.b),
                           self.scale, {**self.provenance, "rank": rank})

    def check(self, config) -> None:
        """The corrections fit this model's shape (a clear error instead of a matmul failure mid-decode)."""
        bad = [l for l, a, b in zip(self.layers, self.a, self.b)
               if not 0 <= l < config.n_layers or a.shape[1:] != (config.d_model,) or b.shape[:1] != (config.d_model,)]
        if bad:
            raise ValueError(f"LoRA-Drop corrections for layers {bad} do not fit {config.name or 'this model'} "
                             f"({config.n_layers} layers, d_model {config.d_model}): fit them on this model with "
                             "`specedge export MODEL --lora-drop rank=8,cycle=4`")

    def plan(self, anchors: dict[int, np.ndarray]) -> LayerPlan:
        """The drop-step plan given each droppable layer's anchor delta ([D])."""
        return LayerPlan(reuse=tuple(LowRankReuse(l, anchors[l], a, b, self.scale)
                                     for l, a, b in zip(self.layers, self.a, self.b)))

    def save(self, root: Path) -> Path:
        """Writes lora_drop.npz (a_<l>, b_<l>) and lora_drop.json (the manifest section, with the arrays' SHA-256)."""
        root.mkdir(parents=True, exist_ok=True)
        arrays = {f"{n}_{l}": t for l, a, b in zip(self.layers, self.a, self.b) for n, t in (("a", a), ("b", b))}
        np.savez(root / ARRAYS, **arrays)
        section = {"format": FORMAT, "rank": self.rank, "cycle": self.cycle, "layers": list(self.layers),
                   "scale": self.scale, "calibration": self.provenance,
                   "sha256": hashlib.sha256((root / ARRAYS).read_bytes()).hexdigest(), "file": ARRAYS}
        (root / MANIFEST).write_text(json.dumps({"lora_drop": section}, indent=1))
        return root

    @classmethod
    def load(cls, root: Path) -> "Corrections":
        path = Path(root) / MANIFEST
        if not path.is_file():
            raise FileNotFoundError(f"no {MANIFEST} in {root}: fit corrections with `specedge export MODEL "
                                    "--lora-drop rank=8,cycle=4 --out DIR`")
        s = json.loads(path.read_text())["lora_drop"]
        if s.get("format") != FORMAT:
            raise ValueError(f"{path}: LoRA-Drop format {s.get('format')} (this runtime reads {FORMAT}); refit")
        data = (Path(root) / s["file"]).read_bytes()
        if hashlib.sha256(data).hexdigest() != s["sha256"]:
            raise ValueError(f"{root}/{s['file']} does not match the SHA-256 in {MANIFEST}: refit or re-copy it")
        with np.load(Path(root) / s["file"], allow_pickle=False) as z:
            a = tuple(z[f"a_{l}"] for l in s["layers"])
            b = tuple(z[f"b_{l}"] for l in s["layers"])
        return cls(int(s["cycle"]), tuple(s["layers"]), a, b, float(s["scale"]), s.get("calibration", {}))


def require_reuse(backend) -> None:
    """Start-up check: LoRA-Drop needs drop steps (caps.layer_reuse): the NumPy reference, or a layered ONNX artifact
    of format 6 (export --profile layered)."""
    if not backend.caps.layer_reuse:
        hint = backend.caps.reuse_hint or ("use --backend numpy, or an ONNX artifact exported with "
                                                        "`--profile layered`")
        raise ValueError(f"LoRA-Drop needs a backend that runs drop steps; {backend.name} does not: {hint}")


def pure_reuse(d_model: int, layers: Sequence[int], cycle: int) -> Corrections:
    """The A = B = 0 baseline: drop steps add the anchor delta unchanged."""
    z = np.zeros((0, d_model), dtype=np.float32)
    return Corrections(cycle, tuple(layers), tuple(z for _ in layers), tuple(z.T for _ in layers),
                       provenance={"kind": "pure reuse"})


def residual_streams(backend: LayeredBackend, tokens: Tokens) -> np.ndarray:
    """[L + 1, T, D]: h after the first n layers of the full model, teacher forced on a fresh cache."""
    n = backend.config.n_layers
    _, taps = backend.hidden(np.asarray(tokens, dtype=np.int32), backend.new_cache(len(tokens)),
                             taps=tuple(range(n + 1)))
    return np.stack([taps[i] for i in range(n + 1)]).astype(np.float64)


def drop_pairs(streams: np.ndarray, layer: int, cycle: int) -> tuple[np.ndarray, np.ndarray]:
    """(X [D, M], D_l [D, M]) over the drop positions of one sequence (position 0 is a refresh step)."""
    t = np.arange(streams.shape[1])
    drop = t % cycle != 0
    inp = streams[layer]
    out = streams[layer + 1] - inp
    anchor = out[t - t % cycle]
    return inp[drop].T, (out - anchor)[drop].T


def solve_w(x: np.ndarray, d: np.ndarray, ridge: float) -> np.ndarray:
    """W = D X^T (X X^T + lambda I)^-1, lambda = ridge * tr(X X^T) / dim (symmetric solve, no explicit inverse)."""
    xxt = x @ x.T
    lam = ridge * np.trace(xxt) / len(xxt)
    return np.linalg.solve(xxt + lam * np.eye(len(xxt)), x @ d.T).T


def low_rank(w: np.ndarray, x: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(A [r, D], B [D, r]): B = U_r (top-r left singular vectors of W X), A = U_r^T W."""
    u, _, _ = np.linalg.svd(w @ x, full_matrices=False)
    b = u[:, :rank]
    return b.T @ w, b


def fit(backend: LayeredBackend, sequences: Sequence[Tokens], spec: LoRADropFit,
        provenance: dict | None = None) -> Corrections:
    """Fit every droppable layer on the drop positions of the calibration sequences (module docstring)."""
    layers = droppable_layers(backend.config.n_layers, spec.every)
    streams = [residual_streams(backend, s) for s in sequences if len(s) > spec.cycle]
    if not streams:
        raise ValueError(f"calibration needs at least one sequence longer than the cycle ({spec.cycle} tokens)")
    a_s, b_s = [], []
    for layer in layers:
        pairs = [drop_pairs(s, layer, spec.cycle) for s in streams]
        x = np.concatenate([p[0] for p in pairs], axis=1)
        d = np.concatenate([p[1] for p in pairs], axis=1)
        a, b = low_rank(solve_w(x, d, spec.ridge), x, spec.rank)
        a_s.append(a.astype(np.float32))
        b_s.append(b.astype(np.float32))
    prov = {"n_sequences": len(streams), "n_tokens": int(sum(s.shape[1] for s in streams)), "ridge": spec.ridge,
            "every": spec.every, **(provenance or {})}
    return Corrections(spec.cycle, layers, tuple(a_s), tuple(b_s), 1.0, prov)


class Schedule:
    """The cycle: step i is a refresh (full model, anchors recorded) when i % cycle == 0, else a drop step.

    `step` appends tokens at cache.length like forward (cache.length grows by len(tokens)); the anchors come from
    the LAST token of a refresh call.
    """

    def __init__(self, backend: LayeredBackend, corrections: Corrections) -> None:
        require_reuse(backend)
        corrections.check(backend.config)
        self.backend, self.corr = backend, corrections
        self._anchors: dict[int, np.ndarray] | None = None

    def step(self, tokens: Tokens, cache, i: int) -> Logits:
        """Logits [T, V] for this step (full model when i % cycle == 0 or no anchor is held yet)."""
        if i % self.corr.cycle == 0 or self._anchors is None:
            n = self.backend.config.n_layers
            h, taps = self.backend.hidden(tokens, cache, taps=tuple(range(n + 1)))
            self._anchors = {l: taps[l + 1][-1] - taps[l][-1] for l in self.corr.layers}
        else:
            h, _ = self.backend.hidden(tokens, cache, plan=self.corr.plan(self._anchors))
        return self.backend.logits_from_hidden(h)
