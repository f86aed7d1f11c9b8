"""How much of a draft to verify: the prefix that maximizes expected tokens per unit of target time.

Verifying j draft tokens costs one target call over j+1 positions, T(j+1); it yields 1 + sum_{i<=j} prod_{l<=i} a_l
tokens in expectation, where a_l is the probability that draft token l is accepted given tokens 1..l-1 were. So

    j* = argmax_{0 <= j <= len(draft)}  (1 + sum_{i=1..j} prod_{l=1..i} a_l) / (T(j+1) / T(1))

Both factors are learned online, per target and per run:
- T(w)/T(1) from the timed target calls of each width (VerifyCost: a running average per width; widths not seen yet
  are interpolated, or extrapolated with a prior slope). On a compute-bound kernel (llama.cpp Q4 here: T(5)/T(1) ~2.6)
  this cuts drafts short; on a flat one (ONNX int8: ~1.5) it lets them run.
- a_l per draft kind and position (AcceptanceModel: Beta(1, 1) counts that decay, so a kind whose drafts stopped being
  verified drifts back to the prior and gets tried again; a position no verified draft has reached yet takes the
  estimate of the position before it). The kind is the drafter's label for how it made the draft
  (the n-gram drafter labels drafts by the matched n-gram length: a 3-gram match is far more reliable than a 1-gram).

Truncation never changes what is emitted (the verifier sees a shorter draft; the output is the target's either way):
the policy trades only speed.

Example: a = [0.8, 0.8, 0.8], T(w)/T(1) = [1, 1.15, 1.30, 1.50] for w = 1..4
    j = 0: 1 / 1 = 1.00;  j = 1: 1.8 / 1.15 = 1.57;  j = 2: 2.44 / 1.30 = 1.88;  j = 3: 2.95 / 1.50 = 1.97  -> j* = 3
With a = [0.3, 0.3, 0.3]: 1.00, 1.13, 1.07, 0.95 -> j* = 1.
"""
from __future__ import annotations

import numpy as np


def _slope(x: list[int], y: list[float]) -> float:
    """The least-squares line's slope through (x, y), >= 2 distinct x, in closed form (np.polyfit's SVD took 20 us
    each target call)."""
    mx, my = sum(x) / len(x), sum(y) / len(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)


class VerifyCost:
    """Running estimate of T(w), the wall time of a target call over w positions."""

    def __init__(self, prior_slope: float = 0.15, weight: float = 0.1) -> None:
        self.prior_slope = prior_slope  # T(w)/T(1) = 1 + slope * (w - 1) until widths are observed
        self.weight = weight
        self._t: dict[int, float] = {}
        self._t1: float | None = None
        self._slope: float | None = None  # seconds per position of the line through the observed widths (>= 2 of them)
        self._points: dict[int, float] = {}  # width -> seconds: the observed widths and the T(1) estimate

    def observe(self, width: int, seconds: float) -> None:
        old = self._t.get(width)
        if old is None:
            self._t[width] = seconds
        else:  # clip outliers (a preempted call) so one bad sample cannot swing the choice
            self._t[width] = old + self.weight * (min(seconds, 3 * old) - old)
        widths = sorted(self._t)
        times = [self._t[w] for w in widths]
        self._slope = max(_slope(widths, times), 0.0) if len(widths) >= 2 else None
        self._t1 = self._estimate_t1(widths, times)
        self._points = {1: self._t1, **self._t}

    def _estimate_t1(self, widths: list[int], times: list[float]) -> float:
        """T(1): observed, or (a drafter that always drafts never runs a 1-wide call) the least-squares line through
        the observed widths taken back to w = 1, no lower than T(w_min) / w_min (a fully compute-bound kernel);
        from one width, the prior slope. Before this, an unobserved T(1) left the whole curve at the prior slope
        (0.15 per position), which on a flat kernel (fp32 SmolLM2: 0.05) cut a model drafter's drafts short."""
        if widths[0] == 1:
            return times[0]
        floor = times[0] / widths[0]
        if self._slope is None:
            return max(times[0] / (1.0 + self.prior_slope * (widths[0] - 1)), floor)
        return max(times[0] - self._slope * (widths[0] - 1), floor)

    def curve(self, max_width: int) -> np.ndarray:
        """[max_width] T(w)/T(1) for w = 1..max_width, never decreasing (timing noise must not make a wider call
        look cheaper than a narrower one)."""
        return np.maximum.accumulate(np.array([1.0] + [self.relative(w) for w in range(2, max_width + 1)]))

    def relative(self, width: int) -> float:
        """T(width) / T(1) as estimated: observed, interpolated, or beyond the widest observed width extended with
        the observed widths' slope (the prior slope until two widths are seen). The prior there would be
        self-confirming: a policy that never verifies past the widths it believes too costly never measures them
        (fp32 SmolLM2: widths 3-6 seen, T(9)/T(1) taken as 1.52 against 1.40 measured, drafts cut at 5-6)."""
        if self._t1 is None or width == 1:
            return 1.0 + self.prior_slope * (width - 1)
        t = self._points
        if width in t:
            return t[width] / self._t1
        lo = max(w for w in t if w < width)
        hi = min((w for w in t if w > width), default=None)
        r_lo = t[lo] / self._t1
        if hi is None:
            slope = self.prior_slope if self._slope is None else self._slope / self._t1
            return r_lo + slope * (width - lo)
        r_hi = t[hi] / self._t1
        return r_lo + (r_hi - r_lo) * (width - lo) / (hi - lo)


class AcceptanceModel:
    """Per (draft kind, position) acceptance counts with a Beta(1, 1) prior and exponential forgetting."""

    def __init__(self, k_max: int, decay: float = 0.995) -> None:
        self.k_max, self.decay = k_max, decay
        self._acc: dict[int, np.ndarray] = {}
        self._seen: dict[int, np.ndarray] = {}

    def _counts(self, kind: int) -> tuple[np.ndarray, np.ndarray]:
        if kind not in self._acc:
            self._acc[kind], self._seen[kind] = np.zeros(self.k_max), np.zeros(self.k_max)
        return self._acc[kind], self._seen[kind]

    def probs(self, kind: int, n: int) -> np.ndarray:
        """[n] estimated conditional acceptance probabilities of positions 1..n."""
        acc, seen = self._counts(kind)
        n = min(n, self.k_max)
        p = (acc[:n] + 1.0) / (seen[:n] + 2.0)
        # A position no verified draft has reached takes the estimate of the one before it, not the Beta(1, 1)
        # prior: with 0.5 there, a draft model accepted at 0.95 was never verified past 3-4 tokens (the policy never
        # saw deeper positions, so their estimate never rose), and drafting 8 to verify 4 halved its speed.
        for i in range(1, n):
            if seen[i] < 1.0:
                p[i] = p[i - 1]
        return p

    def observe(self, kind: int, verified: int, n_accepted: int) -> None:
        """A draft of this kind had `verified` tokens checked; the first n_accepted passed."""
        for a, s in zip(self._acc.values(), self._seen.values()):
            a *= self.decay
            s *= self.decay
        acc, seen = self._counts(kind)
        reached = min(n_accepted + 1, verified)  # positions whose predecessors were all accepted
        seen[:reached] += 1.0
        acc[:n_accepted] += 1.0


def expected_tokens(accept: np.ndarray) -> np.ndarray:
    """[len(accept) + 1] expected tokens per target call when j = 0..len(accept) draft tokens are verified:
    1 + sum_{i<=j} prod_{l<=i} accept_l (accept_l: acceptance of position l given 1..l-1 were accepted).
    Example: accept [0.8, 0.8] -> [1, 1.8, 2.44]; i.i.d. alpha gives (1 - alpha^(j+1)) / (1 - alpha)."""
    return np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(np.asarray(accept, dtype=float)))])


def best_prefix(accept: np.ndarray, costs: np.ndarray) -> int:
    """argmax_j (1 + sum_{i<=j} prod_{l<=i} accept_l) / costs[j], j = 0..len(accept); costs[j] = T(j+1)/T(1)."""
    gains = expected_tokens(accept)
    rates = gains / np.asarray(costs, dtype=float)[:len(gains)]
    return int(np.argmax(rates))


class AdaptiveDraftLength:
    """The policy the decode loop consults: `choose` before verification, `observe` after it."""

    def __init__(self, k_max: int) -> None:
        self.cost = VerifyCost()
        self.acceptance = AcceptanceModel(k_max)
        self.last_kind = 0

    def budget(self, k: int, kind: int | None = None) -> int:
        """How many tokens a drafter that pays per token should draft (>= 1): the prefix `choose` would keep of a
        draft of `kind` (default: the last kind seen). For a drafter of one kind (a draft model) this is exactly what
        would be kept, so drafting more is time spent on tokens that are cut (measured: model drafter k<=8 on
        SmolLM2 fp32, 1.08x drafting 8 and verifying fewer, against 1.46x for a fixed k=8). A drafter that mixes
        free and paid drafts names the paid one's kind (`budget_kind`): the last kind may be a free source's."""
        return max(1, self.choose(self.last_kind if kind is None else kind, k))

    def choose(self, kind: int, n_drafted: int) -> int:
        if n_drafted == 0:
            return 0
        accept = self.acceptance.probs(kind, n_drafted)
        return best_prefix(accept, self.cost.curve(len(accept) + 1))

    def observe(self, kind: int, verified: int, n_accepted: int, width: int, seconds: float) -> None:
        self.cost.observe(width, seconds)
        if verified:
            self.acceptance.observe(kind, verified, n_accepted)
            self.last_kind = kind
