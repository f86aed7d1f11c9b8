"""The one `logits_to_probs` used by the target and every model drafter, and `sample`.

Order (llama.cpp's logit bias and penalties first, then HF/vLLM-style warpers; typical_p where llama.cpp puts it,
between top-k and top-p):
    logit bias -> repetition, frequency and presence penalties -> greedy one-hot (temperature == 0)
                               or temperature -> top-k -> typical-p -> top-p -> min-p -> renormalise
Everything after the input cast is float64 (docs/algorithms.md: verify in float64).

Ties are broken toward the lowest token id everywhere (greedy argmax, the top-k and top-p boundaries),
so the result is a pure function of (logits, params, history).
"""
from __future__ import annotations

import functools
from collections import Counter

import numpy as np

from .types import Logits, Probs, SamplingParams, Tokens

# top-p compares a cumulative weight with top_p of the total: allow for float64 rounding so that mass 0.8 meets 0.8.
_TOP_P_EPS = 1e-9
# top-p's first candidates: the weights above this fraction of the largest (most of the mass sits in a few tokens)
_TOP_P_FIRST_CUT = 1e-3


def logits_to_probs(logits: Logits, params: SamplingParams, history: Tokens | None = None) -> Probs:
    """Turn T rows of logits into T next-token distributions.

    logits:  [T, V] float (a [V] row is taken as [1, V]).
    history: [H] int token ids ending with the input token of the LAST row; row i sees the penalty window
             `history[: H - (T-1-i)][-repeat_last_n:]` (so a verify pass over [last, *draft] is penalised
             exactly as T separate one-token steps would be). None = no penalty.
             Logit bias ids at or past V (a drafter's smaller vocabulary) do not exist in these rows.
    returns: [T, V] float64, rows sum to 1; one-hot at the argmax when params.greedy.

    Example (temperature 1, top_k 2, V = 4):
        logits [[1, 3, 2, 0]] -> keep ids {1, 2} -> softmax([3, 2]) = [0.731, 0.269]
        -> [[0, 0.731, 0.269, 0]]
    With top_p = 0.7 instead of top_k: softmax = [0.087, 0.644, 0.237, 0.032]; sorted mass
        0.644 < 0.7, 0.644 + 0.237 >= 0.7 -> keep {1, 2} -> the same [[0, 0.731, 0.269, 0]].
    """
    logits = np.atleast_2d(logits)  # [T, V]
    T, V = logits.shape
    penalise = params.penalised and history is not None
    if params.greedy and not penalise and not params.logit_bias:  # the float64 cast is monotonic: argmax as is
        return _one_hot(np.argmax(logits, axis=1), V)
    x = np.array(logits, dtype=np.float64)  # [T, V], a private copy
    if params.logit_bias:
        ids, bias = (np.array(c) for c in zip(*params.logit_bias))
        inside = ids < V
        x[:, ids[inside]] += bias[inside]
    if penalise:
        history = np.asarray(history).reshape(-1)
        if params.repeat_last_n > 0:
            _apply_penalties(x, history, params)
        if params.dry_multiplier > 0:
            _apply_dry(x, history, params)
    if params.greedy:
        return _one_hot(np.argmax(x, axis=1), V)
    full, ids = x, None  # with top-k the rest works on the k kept columns: x [T, k], ids [T, k]
    if 0 < params.top_k < V:
        kth = np.take_along_axis(x, top_rows(x, params.top_k)[:, -1:], axis=1)[:, 0]  # [T] k-th largest logit
        ids = np.nonzero(_keep_top_n(x, kth, np.full(T, params.top_k)))[1].reshape(T, params.top_k)
        x = np.take_along_axis(x, ids, axis=1)
    for row in x:
        _warp_row(row, params)
    if ids is None:
        return x
    full.fill(0.0)  # the private copy's buffer, not a fresh one (_warp_row says why)
    np.put_along_axis(full, ids, x, axis=1)
    return full


def _warp_row(row: np.ndarray, params: SamplingParams) -> None:
    """In place: one row of (penalised) float64 logits -> its distribution after temperature, typical-p, top-p and
    min-p, renormalised.

    The row's weights are w = exp((x - max x) * (1 / temperature)), so the most likely token weighs exactly 1.
    Top-p and min-p need no normalised row: top-p keeps the most likely tokens until their weight reaches top_p *
    sum(w), min-p the tokens of weight >= min_p, and the kept weights are then divided by their own sum. Without
    typical-p that is five passes over the row (max, shift, scale, exp, sum) and one that zeroes it; the kept tokens
    are few (gemma3-270m's row under the chat defaults: 0.94 ms -> 0.60 ms against stop 59's softmax first).

    Why in place: on these VMs a fresh array of gemma3-270m's 262,144 float64 columns costs about 1 ms of page faults
    (512 of them, 2 us each), more than every computation of this module on it; the private float64 copy of the
    logits is the only such array logits_to_probs makes."""
    row -= row.max()
    row *= 1.0 / params.temperature  # a multiply: a divide pass cost twice as long
    np.exp(row, out=row)
    total = row.sum()
    if params.typical_p < 1.0:
        row /= total
        row[~_typical_mask(row[None, :], params.typical_p)[0]] = 0.0
        row /= row.max()  # the largest weight kept is 1 again, as top-p and min-p assume
        total = row.sum()
    if params.top_p >= 1.0 and params.min_p <= 0.0:
        row /= total
        return
    if params.top_p < 1.0:
        keep = _top_p_keep(row, params.top_p * total)
        if params.min_p > 0.0:
            keep = keep[~(row[keep] < params.min_p)]  # the max weighs 1, and top-p never drops it
    else:
        keep = np.flatnonzero(~(row < params.min_p))
    vals = row[keep]
    row.fill(0.0)
    row[keep] = vals / vals.sum()


class ProbRows:
    """The rows of `logits_to_probs(logits, params, history)`, each formed when first read: the same values bit for
    bit (each row is a function of its own logits and the history before it; tests/test_sampling.py).

    A chain verifier reads the rows up to the first rejection; under sampling, with its penalties, most rounds reject
    the first drafted token, so most rows of a k+1-row verify were formed for nothing (0.1-0.6 ms each, by vocabulary).
    `rows[i]` is row i, `rows[i, j]` its column j, `np.asarray(rows)` all of them as the [T, V] array."""

    def __init__(self, logits: Logits, params: SamplingParams, history: Tokens | None = None) -> None:
        self.logits = np.atleast_2d(logits)  # [T, V]
        self.params, self.history = params, None if history is None else np.asarray(history).reshape(-1)
        self.shape: tuple[int, int] = self.logits.shape
        self.ndim = 2
        self._rows: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return self.shape[0]

    def row(self, i: int) -> np.ndarray:
        """[V] float64: row i (negative i counts from the end)."""
        T = self.shape[0]
        i = range(T)[i]
        if i not in self._rows:
            h = None if self.history is None else self.history[:len(self.history) - (T - 1 - i)]
            self._rows[i] = logits_to_probs(self.logits[i:i + 1], self.params, h)[0]
        return self._rows[i]

    def __getitem__(self, key):
        if isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], (int, np.integer)):
            return self.row(int(key[0]))[key[1]]
        if isinstance(key, (int, np.integer)):
            return self.row(int(key))
        return np.asarray(self)[key]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = np.stack([self.row(i) for i in range(self.shape[0])])
        return out if dtype is None else out.astype(dtype, copy=False)


def sample(probs_row: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from a [V] row of non-negative weights by inverse CDF with one `rng.random()`.

    The row need not be normalised (the residual max(p - q, 0) can be passed as is). Tokens with weight 0
    are never drawn. Deterministic given the Generator's state.

    Example: probs_row = [0.2, 0.0, 0.5, 0.3] -> cdf [0.2, 0.2, 0.7, 1.0];
        u = 0.1 -> 0,  u = 0.2 -> 2 (id 1 has no mass),  u = 0.95 -> 3.
    """
    row = np.asarray(probs_row)
    ids = np.flatnonzero(row != 0)  # the cdf only over the columns with mass: a running sum adds 0 to nothing
    dense = 2 * len(ids) > len(row)  # then the whole row's cdf: no gather (0.23 ms for gemma3-270m's 262,144)
    cdf = np.cumsum(row if dense else row[ids], dtype=np.float64)  # the same values at the columns with mass
    total = cdf[-1] if len(cdf) else 0.0
    if not total > 0.0:
        raise ValueError(f"cannot sample from a distribution with total mass {total!r}")
    i = int(np.searchsorted(cdf, rng.random() * total, side="right"))
    if dense:  # the first cdf value past u * total is a column with mass (a zero column repeats the one before)
        return i if i < len(row) else int(ids[-1])
    return int(ids[min(i, len(ids) - 1)])  # u * total rounded up to total: the last token with mass


def _apply_penalties(x: np.ndarray, history: np.ndarray, params: SamplingParams) -> None:
    """In place on x [T, V], as llama.cpp's penalties sampler: for each distinct token of row i's window, with c its
    count there, the repetition penalty once (CTRL style: positive logits / penalty, the rest * penalty), then
    `- c * frequency_penalty - presence_penalty`."""
    T, H, n, V = x.shape[0], len(history), params.repeat_last_n, x.shape[1]
    pen, freq, pres = params.repeat_penalty, params.frequency_penalty, params.presence_penalty
    # a window's counts in a dict: np.unique's dozen NumPy calls took 0.02-0.03 ms more a row right after a forward,
    # whose weight stream evicts NumPy's code from the caches (docs/benchmarks.md, "Stop 60")
    tokens = history.tolist()
    for i in range(T):
        end = max(0, H - (T - 1 - i))
        counts = Counter(tokens[max(0, end - n):end])  # [<= n] distinct ids of the window
        ids = np.fromiter((t for t in counts if t < V), dtype=np.int64)
        if len(ids) == 0:
            continue
        v = x[i, ids]
        if pen != 1.0:
            v = np.where(v > 0, v / pen, v * pen)
        if freq or pres:
            v = v - np.fromiter((counts[t] for t in ids.tolist()), dtype=np.float64, count=len(ids)) * freq - pres
        x[i, ids] = v


DRY_MAX_MATCH = 64  # longest repeat DRY measures (its penalty is astronomical long before)


def _apply_dry(x: np.ndarray, history: np.ndarray, params: SamplingParams) -> None:
    """In place on x [T, V], as llama.cpp's DRY sampler: for row i (its history ends with the row's input token), a
    token t that followed an earlier occurrence of the history's last n tokens (n >= dry_allowed_length, the longest
    such n per t, counted back to the last breaker token at most) loses dry_multiplier * dry_base ** (n -
    dry_allowed_length). Breaker tokens (newlines, ':', '"', '*', end of turn: assembly's choice) are never
    penalised, and no repeat spans one.

    Example (allowed length 2, multiplier 0.8, base 1.75): history "a b c x a b" -> the suffix "a b" occurred
    before, followed by "c": c loses 0.8 * 1.75 ** 0 = 0.8; after "a b c x a b c" it would lose 0.8 * 1.75."""
    T, H = x.shape[0], len(history)
    table = _breaker_table(params.dry_breakers)
    for i in range(T):
        end = max(0, H - (T - 1 - i))
        h = history[max(0, end - params.dry_last_n) if params.dry_last_n else 0:end]
        n = len(h)
        if n < 2:
            continue
        broken = np.flatnonzero(_is_breaker(h, table))
        limit = n - 1 - int(broken[-1]) if len(broken) else n  # the suffix that may repeat: after the last breaker
        if limit < params.dry_allowed_length:
            continue
        pos = np.flatnonzero(h[:-1] == h[-1])  # ends of earlier occurrences of the last token
        length = np.zeros(n, np.int64)
        length[pos] = 1
        for m in range(1, min(limit, DRY_MAX_MATCH)):  # extend each match one token further back while it holds
            pos = pos[pos >= m]
            pos = pos[h[pos - m] == h[n - 1 - m]]
            if not len(pos):
                break
            length[pos] = m + 1
        ends = np.flatnonzero(length >= params.dry_allowed_length)
        if not len(ends):
            continue
        nxt, got = h[ends + 1], length[ends]
        keep = (nxt < x.shape[1]) & ~_is_breaker(nxt, table)
        if not keep.any():
            continue
        hit, which = np.unique(nxt[keep], return_inverse=True)  # the tokens hit, and which each match hits
        worst = np.zeros(len(hit), np.int64)  # per token hit its longest match (not an array of V: see _warp_row)
        np.maximum.at(worst, which, got[keep])
        x[i, hit] -= params.dry_multiplier * params.dry_base ** (worst - params.dry_allowed_length)


@functools.lru_cache(maxsize=8)
def _breaker_table(breakers: frozenset[int]) -> np.ndarray:
    """Bool [largest id + 1]: which token ids are DRY breakers, once per set (gemma3-270m's 1,333: np.isin against
    them took 0.45 ms a row; a lookup per history token takes microseconds)."""
    table = np.zeros(max(breakers, default=-1) + 1, dtype=bool)
    table[np.fromiter(breakers, dtype=np.int64, count=len(breakers))] = True
    return table


def _is_breaker(ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    out = np.zeros(len(ids), dtype=bool)
    inside = ids < len(table)
    out[inside] = table[ids[inside]]
    return out


def greedy_ids(logits: Logits, params: SamplingParams, history: Tokens | None = None) -> np.ndarray:
    """[T] int64: argmax of each row of logits_to_probs(logits, params, history) for greedy params, without building
    the one-hot rows ([T, V] float64: 1.2 MB a row for a 152k vocabulary, zeroed and scanned again every step)."""
    logits = np.atleast_2d(logits)
    if not (params.penalised and history is not None) and not params.logit_bias:
        return np.argmax(logits, axis=1)  # what the one-hot holds (the float64 cast is monotonic)
    return np.argmax(logits_to_probs(logits, params, history), axis=1)


def _one_hot(ids: np.ndarray, V: int) -> Probs:
    out = np.zeros((len(ids), V), dtype=np.float64)
    out[np.arange(len(ids)), ids] = 1.0
    return out


def _keep_top_n(x: np.ndarray, kth: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Bool [T, V]: the n[t] largest entries of row t, kth[t] being the n[t]-th largest; ties -> lowest ids."""
    above = x > kth[:, None]
    at = x == kth[:, None]
    room = n - above.sum(axis=1)  # [T] how many tied entries still fit
    tied = at.sum(axis=1) > room  # [T] rows where a tie straddles the boundary (rare)
    if tied.any():
        at[tied] &= np.cumsum(at[tied], axis=1) <= room[tied, None]
    return above | at


def _typical_mask(p: np.ndarray, typical_p: float) -> np.ndarray:
    """Bool [T, V]: locally typical sampling (Meister et al. 2022, as llama.cpp's typical sampler): per row, order
    the tokens by |-log p - H| (H the row's entropy; ties: lowest id first) and keep them in that order until their
    mass first exceeds typical_p (at least 1).

    Example: p = [0.5, 0.3, 0.2], H = 1.03 nats; |-log p - H| = [0.34, 0.17, 0.58] -> order 1, 0, 2; cumulative
    mass 0.3, 0.8 -> with typical_p 0.6 keep {1, 0}: renormalised [0.625, 0.375, 0]."""
    with np.errstate(divide="ignore"):
        logp = np.log(p)  # -inf where p == 0
    ent = -np.where(p > 0, p * logp, 0.0).sum(axis=1, keepdims=True)  # [T, 1]
    shifted = np.where(p > 0, np.abs(-logp - ent), np.inf)  # [T, V]; impossible tokens last
    order = np.argsort(shifted, axis=1, kind="stable")  # stable: ties keep the lower id first
    cum = np.cumsum(np.take_along_axis(p, order, axis=1), axis=1)
    n_keep = np.minimum((cum <= typical_p).sum(axis=1) + 1, p.shape[1])  # [T] up to the first cum > typical_p
    keep = np.zeros(p.shape, dtype=bool)
    np.put_along_axis(keep, order, np.arange(p.shape[1])[None, :] < n_keep[:, None], axis=1)
    return keep


def _top_p_keep(row: np.ndarray, mass: float) -> np.ndarray:
    """The columns of a row of weights (its max 1) whose most likely entries first reach `mass` (at least 1), most
    likely first; ties at the boundary: lowest columns first (as `_keep_top_n`).

    Candidates are the columns above a cutoff, 1e-3 of the max first, 1e-3 times lower while they weigh less than
    `mass`: one comparison pass, usually once. Every column tied with the boundary value is among them (it is above
    the cutoff too), so the choice there is the same as over the whole row."""
    cut, want = _TOP_P_FIRST_CUT, mass * (1.0 - _TOP_P_EPS)
    while True:
        cand = np.flatnonzero(row > cut) if cut > 0.0 else np.arange(len(row))
        vals = row[cand]
        if cut <= 0.0 or vals.sum() >= want:
            break
        cut = cut * _TOP_P_FIRST_CUT if cut > 1e-30 else 0.0
    order = np.argsort(-vals, kind="stable")  # candidates ascend by column: ties keep the lowest first
    cum = np.cumsum(vals[order])
    n = min(int(np.searchsorted(cum, want, side="left")) + 1, len(cand))
    return cand[order[:n]]


def top_rows(x: np.ndarray, m: int, stride: int = 64) -> np.ndarray:
    """[T, m] the column indices of each row's m largest values, largest first (ties: any of the tied columns).

    Candidates first: column j belongs to group j % G (G = V // stride groups of `stride` columns, elementwise maxima
    of contiguous slices, which vectorise); every column among a row's m largest lies in one of the m groups with the
    largest maxima (each such group holds a distinct column >= the m-th largest value), so only those m * stride
    columns, and the V % stride left over, are ranked. On SmolLM2's 49,152 columns x 5 rows: 0.12 ms against 1.8 ms
    for an argpartition of the whole rows (the recycle drafter's update was a third of a 5-row native verify)."""
    T, V = x.shape
    G = V // stride
    if 4 * m > G:  # the groups would hold a quarter of the row or more: rank the whole row
        top = np.argpartition(x, V - m, axis=1)[:, V - m:]
    else:
        best = np.argpartition(x[:, :G * stride].reshape(T, stride, G).max(axis=1), G - m, axis=1)[:, G - m:]
        cand = (best[:, :, None] + G * np.arange(stride)).reshape(T, -1)
        if V > G * stride:
            cand = np.concatenate([cand, np.broadcast_to(np.arange(G * stride, V), (T, V - G * stride))], axis=1)
        vals = np.take_along_axis(x, cand, axis=1)
        top = np.take_along_axis(cand, np.argpartition(vals, vals.shape[1] - m, axis=1)[:, -m:], axis=1)
    order = np.argsort(-np.take_along_axis(x, top, axis=1), axis=1, kind="stable")
    return np.take_along_axis(top, order, axis=1)


def top_ids(row: np.ndarray, n: int) -> np.ndarray:
    """The n largest entries' indices of a 1-D row, largest first, ties lowest index first (every index tied with
    the n-th largest value is considered, so the choice at the boundary is the lowest ids too)."""
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    if n >= len(row):
        ids = np.arange(len(row))
    else:
        nth = row[top_rows(row[None, :], n)[0, -1]]
        ids = np.flatnonzero(row >= nth)
    return ids[np.lexsort((ids, -row[ids]))][:n]
