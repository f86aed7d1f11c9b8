"""Early-exit drafters (docs/algorithms.md 2.4): the first l layers + final norm + LM head. The first l layers' K/V of
committed tokens is the target's own, so the whole cache is shared (selfspec.py).

- `EarlyExitDrafter` (spec `exit:<l>`): a fixed exit layer.
- `DelDrafter` (DEL, spec `del`): each round picks (l, d) maximising tokens per layer
      TPL(l, d) = [(1 - a_l^(d+1)) / (1 - a_l)] / (d l + L)
  where a_l, the acceptance rate of exit layer l, is estimated from shadow tokens: the drafter asks the decode step
  for the hidden states after each candidate layer during the verify forward (`verify_taps`), applies the final
  norm + LM head to the rows of the accepted span and compares their argmax with the tokens the target emitted
  there (`observe_verify`). The estimate is a window over the last `window` rounds, with a Beta(1, 1) prior.
  Candidates are `n_candidates` layers spread over [L/4, L-1]: every candidate costs one full-vocabulary head per
  verified row, so all L layers (DEL's choice) would cost more than the verify forward itself on a small model.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from ..backends.base import LayerPlan
from ..draft_stop import DraftStop
from ..types import Tokens
from .selfspec import SelfSpecDrafter


def tokens_per_layer(a: float, l: int, d: int, n_layers: int) -> float:
    """TPL(l, d): expected tokens per verify round, (1 - a^(d+1)) / (1 - a), over the layers it runs, d l + L."""
    expected = d + 1.0 if a >= 1.0 else (1.0 - a ** (d + 1)) / (1.0 - a)
    return expected / (d * l + n_layers)


def best_exit(acceptance: dict[int, float], n_layers: int, d_max: int) -> tuple[int, int]:
    """argmax over exit layers l (the keys) and draft lengths d in 1..d_max of TPL(l, d); ties: the smaller l, d.

    Example (L = 8, d_max = 4): a = {2: 0.5, 4: 0.9} -> TPL(2, 1) = 1.5/10 = 0.15, TPL(4, 4) = 4.10/24 = 0.171,
    TPL(4, 3) = 3.44/20 = 0.172 -> (4, 3).
    """
    if not acceptance or d_max < 1:
        raise ValueError("best_exit needs at least one candidate layer and d_max >= 1")
    scores = [(tokens_per_layer(a, l, d, n_layers), -l, -d) for l, a in acceptance.items() for d in range(1, d_max + 1)]
    _, l, d = max(scores)
    return -l, -d


class EarlyExitDrafter(SelfSpecDrafter):
    """Draft with the first `exit_layer` layers (spec `exit:<l>`)."""

    def __init__(self, exit_layer: int, stop: DraftStop | None = None) -> None:
        super().__init__(stop)
        if exit_layer < 1:
            raise ValueError(f"the exit layer must be >= 1, got {exit_layer}")
        self.exit_layer = exit_layer
        self.name = f"exit:{exit_layer}"

    def on_bind(self) -> None:
        n = self.target.config.n_layers
        if self.exit_layer > n:
            raise ValueError(f"exit:{self.exit_layer} is past the target's {n} layers; pick an exit layer in 1..{n}")

    def plan_for(self, context: Tokens, k: int) -> tuple[LayerPlan, int]:
        return LayerPlan(exit_layer=self.exit_layer), k


class DelDrafter(SelfSpecDrafter):
    """DEL: the exit layer and draft length chosen each round from shadow-token acceptance (spec `del`)."""

    def __init__(self, stop: DraftStop | None = None, *, n_candidates: int = 6, window: int = 32) -> None:
        super().__init__(stop)
        self.name = "del"
        self.n_candidates = n_candidates
        self.window = window
        self.verify_taps: tuple[int, ...] = ()
        self.choice = (0, 0)

    def on_bind(self) -> None:
        n = self.target.config.n_layers
        lo = max(1, n // 4)
        self.verify_taps = tuple(int(i) for i in np.unique(np.round(np.linspace(lo, n - 1, self.n_candidates))))
        if not self.verify_taps:  # a one-layer target: the only exit is the target itself
            self.verify_taps = (n,)
        self._hits = {l: deque(maxlen=self.window) for l in self.verify_taps}
        self._seen = {l: deque(maxlen=self.window) for l in self.verify_taps}

    def acceptance(self) -> dict[int, float]:
        """a_l per candidate layer: windowed shadow-token agreement with a Beta(1, 1) prior."""
        return {l: (sum(self._hits[l]) + 1.0) / (sum(self._seen[l]) + 2.0) for l in self.verify_taps}

    def plan_for(self, context: Tokens, k: int) -> tuple[LayerPlan, int]:
        if k < 1:
            return LayerPlan(), 0
        self.choice = best_exit(self.acceptance(), self.target.config.n_layers, k)
        return LayerPlan(exit_layer=self.choice[0]), self.choice[1]

    def observe_verify(self, taps: dict[int, np.ndarray], targets: Tokens) -> None:
        """taps[l]: hidden states [T, D] after layer l of the verify forward over [last, *draft]; targets: the tokens
        the target emitted (accepted + next), row i's real next token."""
        m = len(targets)
        for l in self.verify_taps:
            pred = np.argmax(self.target.logits_from_hidden(taps[l][:m]), axis=-1)
            self._hits[l].append(int(np.sum(pred == targets)))
            self._seen[l].append(m)
