"""When a chain drafter stops drafting (docs/algorithms.md section 3): confidence stop and the on-line logistic
acceptance predictor. Used inside a drafter's loop (model drafter, layer skip, early exit), so drafting stops early
instead of drafting k tokens and throwing some away.

Features of draft token i: (c_i, H_i) = the drafter's softmax probability of its own token and the entropy of that
softmax, both of the RAW draft logits at temperature 1 (under greedy sampling the processed q is one-hot and says
nothing about confidence).

Semantics shared by both policies: `stop(feats)` is asked after each drafted token; when it says stop, that token is
kept and drafting ends (it is verified, so the policy still sees labels for low-confidence tokens and can lower its
threshold again). `observe(feats, n_accepted)` labels the verified prefix: tokens 1..n accepted, token n+1 rejected
(when it was drafted); tokens after it carry no label.

Spec strings (StopSpec; a drafter spec's suffix `+<stop>`, runtime/drafters/spec.py): `conf` | `conf:<threshold>` (fixed threshold: no
re-fit) | `logistic` | `logistic:<h>`.
"""
from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np

Features = np.ndarray  # [n, 2] float64: (own-token probability, entropy) per drafted token


def stop_features(logits: np.ndarray, token: int) -> tuple[float, float]:
    """(softmax probability of `token`, entropy of the softmax) of one raw logits row [V], temperature 1."""
    x = np.asarray(logits, dtype=np.float64).reshape(-1)
    z = np.exp(x - x.max())
    p = z / z.sum()
    return float(p[token]), float(-np.sum(p * np.log(np.maximum(p, 1e-300))))


def labelled(feats: Features, n_accepted: int) -> tuple[Features, np.ndarray]:
    """The verified part of a draft: (features [m, 2], labels [m] 1 = accepted), m = min(n_accepted + 1, k)."""
    m = min(n_accepted + 1, len(feats))
    return feats[:m], (np.arange(m) < n_accepted).astype(np.float64)


class DraftStop(Protocol):
    name: str

    def stop(self, feats: Features) -> bool: ...  # feats of the tokens drafted so far this round

    def observe(self, feats: Features, n_accepted: int) -> None: ...


class ConfidenceStop:
    """Stop when the draft's probability of its own token < threshold (HF assisted generation's proxy of SpecDec++).

    Re-fit on-line as Hugging Face transformers does (`AssistedCandidateGenerator`): over the last `window` labelled
    tokens, the threshold t minimising FPR(t) + 3 FNR(t) for the classifier "accepted iff c >= t" (a missed
    acceptance costs more than a wasted verify position).
    """

    def __init__(self, threshold: float = 0.4, *, refit: bool = True, window: int = 256, min_samples: int = 16) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"confidence threshold must be in [0, 1], got {threshold}")
        self.threshold = threshold
        self.refit = refit
        self.min_samples = min_samples
        self._c: deque[float] = deque(maxlen=window)
        self._y: deque[float] = deque(maxlen=window)
        self.name = f"conf:{threshold}" if not refit else "conf"

    def stop(self, feats: Features) -> bool:
        return bool(feats[-1, 0] < self.threshold)

    def observe(self, feats: Features, n_accepted: int) -> None:
        f, y = labelled(feats, n_accepted)
        self._c.extend(f[:, 0])
        self._y.extend(y)
        if self.refit and len(self._y) >= self.min_samples:
            self.threshold = fit_threshold(np.array(self._c), np.array(self._y), self.threshold)


def fit_threshold(c: np.ndarray, y: np.ndarray, current: float) -> float:
    """argmin_t FPR(t) + 3 FNR(t) over the observed confidences (ties: the lowest t); `current` without both classes.

    c: [n] confidences; y: [n] 1 = accepted.
    """
    pos, neg = y.sum(), (1 - y).sum()
    if pos == 0 or neg == 0:
        return current
    ts = np.unique(c)
    pred = c[None, :] >= ts[:, None]  # [n_t, n]
    fnr = ((~pred) * y).sum(1) / pos
    fpr = (pred * (1 - y)).sum(1) / neg
    return float(ts[int(np.argmin(fpr + 3 * fnr))])


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -40, 40)))


class LogisticStop:
    """SpecDec++-style stop: a_i = sigmoid(w0 c_i + w1 H_i + w2) predicts that token i is accepted given the ones
    before it were; stop once 1 - prod_i a_i > h. (w0, w1, w2) is fitted on-line by L2-regularised logistic
    regression (Newton steps) on the last `window` labelled tokens; the prior (4, 0, -2) trusts confidence."""

    def __init__(self, h: float = 0.5, *, window: int = 512, l2: float = 1e-2, min_samples: int = 16) -> None:
        if not 0.0 < h < 1.0:
            raise ValueError(f"the logistic stop's rejection threshold h must be in (0, 1), got {h}")
        self.h = h
        self.l2 = l2
        self.min_samples = min_samples
        self.w = np.array([4.0, 0.0, -2.0])
        self._x: deque[np.ndarray] = deque(maxlen=window)
        self._y: deque[float] = deque(maxlen=window)
        self.name = f"logistic:{h}"

    def predict(self, feats: Features) -> np.ndarray:
        """[n] predicted acceptance probabilities a_i."""
        f = np.atleast_2d(feats)
        return sigmoid(f[:, 0] * self.w[0] + f[:, 1] * self.w[1] + self.w[2])

    def stop(self, feats: Features) -> bool:
        return bool(1.0 - np.prod(self.predict(feats)) > self.h)

    def observe(self, feats: Features, n_accepted: int) -> None:
        f, y = labelled(feats, n_accepted)
        self._x.extend(f)
        self._y.extend(y)
        if len(self._y) >= self.min_samples:
            self.w = fit_logistic(np.array(self._x), np.array(self._y), self.w, self.l2)


def fit_logistic(x: np.ndarray, y: np.ndarray, w0: np.ndarray, l2: float, steps: int = 8) -> np.ndarray:
    """Weights [3] of sigmoid(x @ w[:2] + w[2]) maximising the L2-penalised log-likelihood (Newton from w0).

    x: [n, 2] features; y: [n] labels in {0, 1}. The penalty keeps a separable case finite.
    """
    a = np.concatenate([x, np.ones((len(x), 1))], axis=1)
    w = np.array(w0, dtype=np.float64)
    reg = l2 * len(y) * np.diag([1.0, 1.0, 0.0])  # the bias is not penalised
    for _ in range(steps):
        p = sigmoid(a @ w)
        grad = a.T @ (p - y) + reg @ w
        hess = (a * (p * (1 - p))[:, None]).T @ a + reg + 1e-9 * np.eye(3)
        step = np.linalg.solve(hess, grad)
        w = w - step
        if np.abs(step).max() < 1e-6:
            break
    return w


def format_number(x: float) -> str:
    """A spec's number as text that parses back to it: 2.0 -> '2', 0.4 -> '0.4'."""
    x = float(x)
    return str(int(x)) if x.is_integer() else repr(x)


class StopKind(enum.Enum):
    CONF = "conf"  # ConfidenceStop (a number: a fixed threshold, no re-fit)
    LOGISTIC = "logistic"  # LogisticStop (a number: the rejection threshold h)


@dataclass(frozen=True)
class StopSpec:
    """A draft-stop policy as written in a drafter spec's '+<stop>' suffix; `build` makes a fresh policy."""

    kind: StopKind
    value: float | None = None

    @classmethod
    def parse(cls, text: str) -> "StopSpec":
        """'conf' | 'conf:<threshold>' | 'logistic' | 'logistic:<h>'; the policy's own checks run here too."""
        head, _, arg = text.partition(":")
        try:
            value = float(arg) if arg else None
        except ValueError:
            raise ValueError(f"draft stop {text!r}: the argument must be a number, as conf:0.4 or logistic:0.5"
                             ) from None
        try:
            spec = cls(StopKind(head), value)
        except ValueError:
            raise ValueError(f"unknown draft stop {text!r}; use conf, conf:<threshold>, logistic or logistic:<h>"
                             ) from None
        spec.build()  # a value out of range fails at start-up
        return spec

    def build(self) -> DraftStop:
        if self.kind is StopKind.CONF:
            return ConfidenceStop() if self.value is None else ConfidenceStop(self.value, refit=False)
        return LogisticStop() if self.value is None else LogisticStop(self.value)

    def __str__(self) -> str:
        return self.kind.value + ("" if self.value is None else f":{format_number(self.value)}")


def parse_stop(text: str) -> DraftStop:
    """'conf' | 'conf:<threshold>' | 'logistic' | 'logistic:<h>'."""
    return StopSpec.parse(text).build()
