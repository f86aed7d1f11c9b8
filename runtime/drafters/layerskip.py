"""Layer-skip drafters (docs/algorithms.md 2.3): the target with some middle layers skipped; first and last always run.

- `LayerSkipDrafter` (balanced / Unified Layer Skipping): keep round(L / R) layers spread evenly (linspace) for a
  requested speed ratio R.
- `SwiftDrafter` (SWIFT): the skip set is searched on the fly during decoding. After each round (when the search is
  still running) one candidate is scored: the fraction of the last `window` committed tokens whose argmax under the
  skipped model equals the real next token. Candidates are random swaps of one skipped and one kept layer around
  the best set so far; every 25th is a cheap surrogate instead of SWIFT's Bayesian optimisation: skip the layers
  whose skipping went with the highest mean score over the candidates scored so far. Kept if better; the search
  stops at a score > `target_score`, `max_iters` candidates, or `patience` without improvement. Drafting: a top-1
  chain that stops when the top-1 probability < 0.8 (a fixed ConfidenceStop unless another stop is given).

Scoring is exact, not approximate: the window is re-run with the candidate plan AT ITS OWN positions (roll the cache
back `window` slots: the tokens see the committed full-model K/V before them and the candidate's K/V among
themselves, exactly as drafting would), then the full model re-runs the window to restore those slots. Running it
in scratch rows past the length instead would let the window attend to its own committed copy, and induction heads
then predict every next token by copying, so every candidate scores near 1. Costs two forwards of `window` tokens
per candidate; the cache length is unchanged afterwards.
"""
from __future__ import annotations

import numpy as np

from ..backends.base import LayerPlan
from ..draft_stop import ConfidenceStop, DraftStop
from ..types import Tokens
from .selfspec import SelfSpecDrafter


def balanced_layers(n_layers: int, ratio: float) -> tuple[int, ...]:
    """round(L / R) layer indices including 0 and L-1, evenly spaced (docs/algorithms.md 2.3, Unified Layer Skipping).

    Example: L = 30, R = 2 -> 15 layers: 0, 2, 4, ..., 12, 15, 17, ..., 29 (linspace(0, 29, 15) rounded).
    """
    if ratio < 1.0:
        raise ValueError(f"the layer-skip speed ratio R must be >= 1 (R = 1 keeps every layer), got {ratio}")
    n = int(np.clip(round(n_layers / ratio), min(2, n_layers), n_layers))
    return tuple(int(i) for i in np.unique(np.round(np.linspace(0, n_layers - 1, n)).astype(int)))


class LayerSkipDrafter(SelfSpecDrafter):
    """Balanced layer skip at speed ratio R (spec `skip:<R>`)."""

    def __init__(self, ratio: float, stop: DraftStop | None = None) -> None:
        super().__init__(stop)
        balanced_layers(2, ratio)  # validates R at construction
        self.ratio = ratio
        self.name = f"skip:{ratio:g}"
        self.plan = LayerPlan()

    def on_bind(self) -> None:
        self.plan = LayerPlan(layers=balanced_layers(self.target.config.n_layers, self.ratio))

    def plan_for(self, context: Tokens, k: int) -> tuple[LayerPlan, int]:
        return self.plan, k


class SwiftDrafter(SelfSpecDrafter):
    """SWIFT: on-the-fly skip-set search (spec `swift`)."""

    def __init__(self, stop: DraftStop | None = None, *, skip_ratio: float = 0.45, window: int = 32,
                 target_score: float = 0.93, max_iters: int = 1000, patience: int = 300, surrogate_every: int = 25,
                 seed: int = 0) -> None:
        super().__init__(stop if stop is not None else ConfidenceStop(0.8, refit=False))
        if not 0.0 <= skip_ratio < 1.0:
            raise ValueError(f"SWIFT's skip ratio must be in [0, 1), got {skip_ratio}")
        self.name = "swift"
        self.skip_ratio, self.window, self.target_score = skip_ratio, window, target_score
        self.max_iters, self.patience, self.surrogate_every = max_iters, patience, surrogate_every
        self._seed = seed
        self._searched = None  # the target the search state belongs to

    def on_bind(self) -> None:
        """A new sequence on the same target continues the search (the skip set is a property of the model)."""
        if self._searched is self.target:
            return
        self._searched = self.target
        n = self.target.config.n_layers
        middle = np.arange(1, n - 1)
        n_skip = int(round(self.skip_ratio * len(middle)))
        self.best_skip = frozenset(int(i) for i in middle[::2][:n_skip])  # start from "every other layer"
        self.best_score = -1.0
        self.iters = self.since_best = 0
        self.history: list[tuple[frozenset[int], float]] = []
        self.rng = np.random.default_rng(self._seed)

    @property
    def searching(self) -> bool:
        return (self.best_score <= self.target_score and self.iters < self.max_iters
                and self.since_best < self.patience)

    def plan_of(self, skip: frozenset[int]) -> LayerPlan:
        return LayerPlan(layers=tuple(i for i in range(self.target.config.n_layers) if i not in skip))

    def plan_for(self, context: Tokens, k: int) -> tuple[LayerPlan, int]:
        return self.plan_of(self.best_skip), k

    def learn(self, n_accepted: int, next_token: int) -> None:
        """One search step on the committed context (prompt + output so far)."""
        ctx = np.concatenate([self._context, self._draft[:n_accepted], [next_token]]).astype(np.int32)
        if not self.searching or self.cache.length < self.window or len(ctx) != self.cache.length + 1:
            return
        if self.iters % 10 == 0:  # score the starting set first; the window moves: re-score the incumbent now and then
            self.best_score = self.score(self.best_skip, ctx)
        cand = self.surrogate() if (self.iters + 1) % self.surrogate_every == 0 else self.neighbour()
        s = self.score(cand, ctx)
        self.history.append((cand, s))
        self.iters += 1
        if s > self.best_score:
            self.best_skip, self.best_score, self.since_best = cand, s, 0
        else:
            self.since_best += 1

    def neighbour(self) -> frozenset[int]:
        """The best set with one skipped layer swapped for one kept middle layer (the skip count stays fixed)."""
        n = self.target.config.n_layers
        kept = [i for i in range(1, n - 1) if i not in self.best_skip]
        if not self.best_skip or not kept:
            return self.best_skip
        out = self.rng.choice(sorted(self.best_skip))
        inn = self.rng.choice(kept)
        return frozenset((self.best_skip - {int(out)}) | {int(inn)})

    def surrogate(self) -> frozenset[int]:
        """Skip the layers whose skipping went with the highest mean score so far (SWIFT uses Bayesian optimisation)."""
        n = self.target.config.n_layers
        if not self.history:
            return self.neighbour()
        value = {}
        for i in range(1, n - 1):
            on = [s for skip, s in self.history if i in skip]
            off = [s for skip, s in self.history if i not in skip]
            value[i] = (np.mean(on) if on else 0.5) - (np.mean(off) if off else 0.5)
        ranked = sorted(value, key=lambda i: -value[i])
        return frozenset(ranked[:len(self.best_skip)])

    def score(self, skip: frozenset[int], ctx: Tokens) -> float:
        """Fraction of the last `window` committed tokens the skipped model predicts (argmax == real next token).

        requires: cache.length == len(ctx) - 1 >= window; the cache is as it was afterwards (see the module doc).
        """
        base = self.cache.length
        start = base - self.window
        window = ctx[start:base]
        self.cache.rollback(start)
        h, _ = self.target.hidden(window, self.cache, plan=self.plan_of(skip))
        pred = np.argmax(self.target.logits_from_hidden(h), axis=-1)
        self.cache.rollback(start)
        self.target.hidden(window, self.cache)  # the full model rewrites the window's K/V in every layer
        return float(np.mean(pred == ctx[start + 1:base + 1]))
