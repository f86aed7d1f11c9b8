"""Measure a DeviceProfile (perf/profile.py) on a loaded target: the verify-cost curve T(n), the runtime's per-round
overhead, and each drafter's acceptance by position and drafting cost on a few short dev prompts.

T(n) reuses perf/verify_cost.py's `time_forward` (n random tokens appended at a fixed cache length, rolled back
after each call as a rejected draft is); the statistic is the median of `reps` calls after warm-up. Drafters are
measured greedily at fixed k = k_max (no adaptive truncation), so every position's acceptance is observed, then
once more with the adaptive draft length (k <= k_max), whose tokens/s is the adaptive candidate (perf/profile.py).

A drafter whose drafts depend only on the committed tokens (n-gram, a memory of past answers: `replayable`) is not
decoded with at all for its acceptance: greedy speculation emits plain decoding's tokens, so the rounds a decode at
k_max would run are replayed over the plain run's own answers (`replay_rounds`), exactly and with the drafter's
real drafting time, for no target forward. The budget then goes to longer answers, which such drafters need (their
matches grow with the answer): a 1.5B model's budgeted plan measured n-gram on 2 answers of 16 tokens before.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..runtime.backends.base import feed
from ..runtime.decode import decode
from ..runtime.request import Request, Speculation
from ..runtime.stats import DecodeStats
from ..runtime.types import SamplingParams, StepStats
from .devset import Prompt, load_prompts
from .profile import DrafterProfile
from .timing import time_forward


@dataclass(frozen=True)
class MeasureSettings:
    """How much to measure: for a 135M model on 2 cores with the defaults, about 20 s plus 10 s per n-gram drafter and
    25 s per draft model (each decodes the prompts twice)."""

    k_max: int = 8  # drafters run at this k; T(n) for n = 1..k_max + 1
    ctx: int = 256  # cache length the T(n) calls append at (clipped to half the target's context)
    reps: int = 7  # T(n) calls per width (median)
    prompts: int = 6  # dev prompts (round-robin over tasks: one per Spec-Bench task)
    max_tokens: int = 128  # generated per prompt and drafter (as the benchmark; n-gram matches grow with length)
    prompt_tokens: int = 384  # a longer prompt keeps its last this many tokens (bounds the prefill time)
    adaptive: bool = True  # also run each drafter with the adaptive draft length (doubles the drafters' time)
    budget_s: float | None = None  # about this many seconds for the whole measurement (fit_budget); None: as set


# The least a budgeted measurement keeps (fit_budget shrinks towards these, in this order: the adaptive runs go
# before the answers shorten, since acceptance is read off the answers)
FLOOR = {"prompt_tokens": 64, "reps": 2, "ctx": 32, "adaptive": False, "max_tokens": 16, "prompts": 2}


def estimate_s(s: MeasureSettings, t1: float, n_drafters: float, n_replayed: int = 0) -> float:
    """Seconds `measure` takes with one-token calls of t1 s: the T(n) curve (a prefill of ctx, reps calls of every
    width at about 2.5 t1 each) and the decode runs (plain, each decoded drafter once or twice, each replayed one
    only for its adaptive run: a prefill of prompt_tokens at about 0.4 t1 a token, then max_tokens at about 1.2 t1).
    Rough, but it scales with the model: a 10x slower model is predicted 10x longer. Example: t1 10 ms,
    PLAN_MEASURE, one decoded drafter: 0.4*256*0.01 + 5*9*2.5*0.01 = 2.1 s, runs 3 * 6 * (256*0.4 + 64*1.2) * 0.01
    = 32 s; replayed instead, 2 runs: 21 s."""
    runs = 1 + n_drafters * (2 if s.adaptive else 1) + (n_replayed if s.adaptive else 0)
    curve = 0.4 * s.ctx * t1 + s.reps * (s.k_max + 1) * 2.5 * t1
    return curve + runs * s.prompts * (0.4 * s.prompt_tokens + 1.2 * s.max_tokens) * t1


def fit_budget(s: MeasureSettings, t1: float, n_drafters: float, n_replayed: int = 0) -> MeasureSettings:
    """The settings shrunk, field by field towards FLOOR (shorter prompts, fewer T(n) reps, a shorter curve prefix,
    no adaptive-length runs, fewer generated tokens, fewer prompts), until estimate_s fits s.budget_s; as given
    without a budget or when they fit. Example: t1 90 ms (a 1.5B model on 2 cores), PLAN_MEASURE with n-gram
    decoded, budget 25 s -> prompt_tokens 64, reps 2, ctx 32, fixed k only, max_tokens 16, 2 prompts (about 21 s,
    where the full settings take 310 s)."""
    if s.budget_s is None:
        return s
    est = lambda s: estimate_s(s, t1, n_drafters, n_replayed)  # noqa: E731
    for name, low in FLOOR.items():
        if est(s) <= s.budget_s:
            break
        value = getattr(s, name)
        if isinstance(low, bool):  # a switch: off is the cheaper
            s = replace(s, **{name: low})
            continue
        if value <= low:
            continue
        # the value that would fit, everything else kept (estimate_s is linear in each field), not below the floor
        per_unit = (est(s) - est(replace(s, **{name: 0}))) / value
        fit = int((s.budget_s - est(replace(s, **{name: 0}))) / max(per_unit, 1e-12))
        s = replace(s, **{name: max(low, min(value, fit))})
    return s


class RoundLog(DecodeStats):
    """DecodeStats that also keeps every round's StepStats (the decode loop records one per target forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.rounds: list[StepStats] = []

    def record(self, step: StepStats) -> None:
        super().record(step)
        self.rounds.append(step)


def verify_curve(backend, max_width: int, ctx: int, reps: int, rng: np.random.Generator) -> list[float]:
    """[max_width] median seconds of one chain forward of n = 1..max_width tokens at cache length ctx.
    requires: ctx + max_width <= the backend's context."""
    cache = backend.new_cache(ctx + max_width + 1)
    feed(backend, rng.integers(0, backend.config.vocab_size, ctx).astype(np.int32), cache)
    for n in range(1, max_width + 1):  # warm-up: every width once (first calls allocate)
        time_forward(backend, cache, n, rng)
    times: dict[int, list[float]] = {n: [] for n in range(1, max_width + 1)}
    for _ in range(reps):  # widths interleaved so drift of a shared machine hits them alike
        for n in times:
            times[n].append(time_forward(backend, cache, n, rng))
    curve = np.array([float(np.median(times[n])) for n in times])
    return [float(x) for x in np.maximum.accumulate(curve)]  # noise must not make a wider call look cheaper


def fit_line(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least-squares (a, b) of y = a + b x, both clipped at 0; (mean y, 0) when x has one distinct value.
    Example: x [0, 2, 4], y [1, 2, 3] -> (1.0, 0.5)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) == 0:
        return 0.0, 0.0
    if len(np.unique(x)) < 2:
        return max(float(y.mean()), 0.0), 0.0
    b, a = np.polyfit(x, y, 1)
    if b < 0:
        return max(float(y.mean()), 0.0), 0.0
    if a < 0:
        return 0.0, float(np.dot(x, y) / np.dot(x, x))
    return float(a), float(b)


def draft_cost(rounds: Sequence[StepStats], per_token_drafter: bool) -> tuple[float, float]:
    """(fixed s per round, s per drafted token) of drafting, fitted on the rounds. Rounds run at one k cannot separate
    the two: a drafter that reads weights per token (a draft model, a layer plan) is then charged per token, so a
    smaller k is predicted cheaper; a free one (n-gram) per round. Example: a model drafter, rounds at k=8 taking
    80 ms -> (0, 0.01)."""
    ks, ys = [r.k for r in rounds], [r.draft_s for r in rounds]
    fixed, per_token = fit_line(ks, ys)
    if per_token == 0.0 and per_token_drafter and sum(ks) > 0:
        return 0.0, float(sum(ys) / sum(ks))
    return fixed, per_token


def acceptance(rounds: Sequence[StepStats], k_max: int) -> tuple[list[float], list[float]]:
    """(alpha [k_max], length_dist [k_max + 1]) from rounds run at k = k_max. alpha_i = rounds accepting >= i over
    rounds accepting >= i - 1 (a position not proposed counts as rejected), with a Beta(1, 1) prior so a position
    never reached reads 0.5 rather than 0/0. Example: accepted counts [2, 0, 1] -> alpha_1 = (2+1)/(3+2) = 0.6,
    alpha_2 = (1+1)/(2+2) = 0.5 (two rounds reached position 2, one passed it), alpha_3 = (0+1)/(1+2) = 1/3."""
    acc = np.array([r.n_accepted for r in rounds], dtype=int)
    lens = np.array([r.k for r in rounds], dtype=int)
    alpha = [float((np.sum(acc >= i) + 1) / (np.sum(acc >= i - 1) + 2)) for i in range(1, k_max + 1)]
    dist = np.bincount(np.minimum(lens, k_max), minlength=k_max + 1) / max(len(rounds), 1)
    return alpha, [float(x) for x in dist]


def context_of(backend) -> int:
    """Positions a cache of this backend may hold (llama.cpp: its n_ctx)."""
    return backend.caps.max_context or backend.config.context_length


def dev_prompts(n: int) -> list[Prompt]:
    return load_prompts(limit=n, by="task")


def run_rounds(target, drafter, prompts: Sequence[Prompt], k: int, max_tokens: int, prompt_tokens: int = 384,
               adaptive: bool = False, answers: list | None = None) -> RoundLog:
    """Greedy decode of every prompt (chat-formatted, its last `prompt_tokens` tokens) with `drafter` (None: plain)
    at fixed k (adaptive: k is the maximum of the adaptive draft length); the merged log. `answers`, when given,
    receives (prompt ids, answer ids) per prompt."""
    log, tok, params = RoundLog(), target.tokenizer, SamplingParams()
    for p in prompts:
        ids = tok.chat_ids(p.text)
        room = min(prompt_tokens, context_of(target.backend) - max_tokens - k - 2)
        ids = ids[-room:]  # a small-context model sees the end of a long prompt (the chat template's tail)
        spec = Speculation(drafter, k=max(k, 1), adaptive_k=adaptive)
        req = Request(params, max_tokens=max_tokens, eos_ids=tok.eos_ids, seed=0)
        answer = [ev.token for ev in decode(target.backend, ids, spec, req, stats=log)]
        if answers is not None:
            answers.append((np.asarray(ids, dtype=np.int32), answer))
    return log


def replayable(drafter) -> bool:
    """Whether a drafter's drafts depend on the committed tokens alone (n-gram, a memory of past answers): no target
    logits, taps or bound weights, no tree, no per-token cost. Its greedy rounds can then be replayed over plain
    decoding's answers (`replay_rounds`) instead of decoded."""
    c = drafter.caps
    return not (c.observes_logits or c.binds_target or c.reads_taps or c.tree or c.pays_per_token)


def replay_rounds(drafter, answers: Sequence[tuple[np.ndarray, list[int]]], k: int) -> RoundLog:
    """The rounds greedy speculation at fixed k would run with a `replayable` drafter, over plain decoding's own
    answers: greedy speculation emits exactly plain decoding's tokens, so each round drafts from the same committed
    tokens a real decode has, accepts the draft's prefix that equals the answer there, and commits that plus one
    token. Each round's StepStats has the drafter's measured propose time (no verify: no target forward runs).
    Example: answer [5, 6, 7, 8], drafts [5, 6, 9] then [8] -> rounds (k 3, accepted 2), (k 1, accepted 1)."""
    log, params, rng = RoundLog(), SamplingParams(), np.random.default_rng(0)
    for prompt, answer in answers:
        drafter.begin(prompt)
        tokens = np.concatenate([prompt, answer]).astype(np.int32)
        n0, p = len(prompt), 0
        while p < len(answer):
            t0 = time.perf_counter()
            draft = drafter.propose(tokens[:n0 + p], k, params, rng)
            draft_s = time.perf_counter() - t0
            proposed = [int(t) for t in draft.tokens[:k]]
            a = 0
            while a < len(proposed) and p + a < len(answer) and proposed[a] == answer[p + a]:
                a += 1
            if p + a < len(answer):
                drafter.accept(a, answer[p + a])
            log.record(StepStats(len(proposed), a, draft_s=draft_s))
            log.n_generated += min(a + 1, len(answer) - p)
            p += a + 1
        drafter.finish(tokens)
    return log


def measure_steps(n_drafters: int, settings: MeasureSettings) -> int:
    """How many times `measure` calls `step`: the curve, plain decoding, and each drafter once or twice."""
    return 2 + n_drafters * (2 if settings.adaptive else 1)


def measure(target, drafters: dict[str, object], settings: MeasureSettings = MeasureSettings(),
            log: Callable[[str], None] = lambda m: None, step: Callable[[str], None] = lambda m: None) -> dict:
    """The measured fields of a DeviceProfile: verify_s, overhead_s, plain_tok_s_measured, drafters, ctx.
    target: an assembly.load.LoadedModel; drafters: spec string -> built drafter (tree drafters are not tuned here).
    `step` is called after each of the measure_steps(...) parts (a progress bar)."""
    backend = target.backend
    rng = np.random.default_rng(0)
    replayed = {spec for spec, d in drafters.items() if d is not None and replayable(d)}
    if settings.budget_s is not None:  # one call of one token tells how slow this target is, then fit the budget
        t1 = verify_curve(backend, 1, 8, 1, rng)[0]
        settings = fit_budget(settings, t1, sum(1.5 if d is not None and d.caps.pays_per_token else 1.0
                                                for spec, d in drafters.items() if spec not in replayed),
                              len(replayed))
        log(f"budget {settings.budget_s:.0f} s at {1e3 * t1:.1f} ms a token: {settings.prompts} prompts x "
            f"{settings.max_tokens} tokens (prompts cut to {settings.prompt_tokens}), T(n) x {settings.reps}")
    ctx = max(8, min(settings.ctx, context_of(backend) // 2))
    t0 = time.perf_counter()
    verify_s = verify_curve(backend, settings.k_max + 1, ctx, settings.reps, rng)
    log(f"T(n) for n = 1..{settings.k_max + 1} at cache length {ctx}: "
        + " ".join(f"{1e3 * t:.1f}" for t in verify_s) + f" ms ({time.perf_counter() - t0:.1f} s)")
    step("T(n)")
    prompts = dev_prompts(settings.prompts)
    answers: list = []
    plain = run_rounds(target, None, prompts, 0, settings.max_tokens, settings.prompt_tokens, answers=answers)
    step("plain")
    over_x, over_y = [], []
    logs, adaptive = {}, {}
    for spec, drafter in drafters.items():
        if spec in replayed:
            logs[spec] = _replayed(spec, drafter, answers, settings.k_max, log)
        else:
            logs[spec] = _decoded(target, spec, drafter, prompts, settings, False, log)
        step(spec)
        if settings.adaptive:
            adaptive[spec] = _decoded(target, spec, drafter, prompts, settings, True, log)
            step(f"{spec} adaptive")
    for r in plain.rounds + [r for spec, lg in logs.items() if spec not in replayed for r in lg.rounds]:
        over_x.append(r.k + 1)
        over_y.append(max(r.verify_s - r.forward_s, 0.0))
    out = {}
    for spec, lg in logs.items():
        alpha, dist = acceptance(lg.rounds, settings.k_max)
        fixed, per_token = draft_cost(lg.rounds, drafters[spec] is not None and drafters[spec].caps.pays_per_token)
        ad = adaptive.get(spec)
        own_prefill = drafters[spec] is not None and drafters[spec].caps.pays_per_token  # a draft model's prompt
        measured = 0.0 if spec in replayed else float(lg.tokens_per_s)  # a replay decoded nothing: the plain scale
        out[spec] = DrafterProfile(spec, settings.k_max, alpha, dist, fixed, per_token, len(lg.rounds),
                                   measured, float(ad.tokens_per_s) if ad else 0.0,
                                   float(ad.mean_accepted_length) if ad else 0.0,
                                   float(lg.prompt_tokens_per_s) if own_prefill else 0.0)
    return {"verify_s": verify_s, "overhead_s": list(fit_line(over_x, over_y)), "drafters": out, "ctx": ctx,
            "plain_tok_s_measured": float(plain.tokens_per_s),
            "prompt_tok_s_measured": float(plain.prompt_tokens_per_s) or None}


def _replayed(spec: str, drafter, answers: list, k: int, log: Callable[[str], None]) -> RoundLog:
    t0 = time.perf_counter()
    lg = replay_rounds(drafter, answers, k)
    log(f"drafter {spec}: replayed over plain decoding's {sum(len(a) for _, a in answers)} answer tokens: "
        f"{len(lg.rounds)} rounds at k={k}, {lg.n_accepted / max(len(lg.rounds), 1):.2f} accepted a round "
        f"({time.perf_counter() - t0:.1f} s)")
    return lg


def _decoded(target, spec: str, drafter, prompts: Sequence[Prompt], settings: MeasureSettings, adaptive: bool,
             log: Callable[[str], None]) -> RoundLog:
    t0 = time.perf_counter()
    lg = run_rounds(target, drafter, prompts, settings.k_max, settings.max_tokens, settings.prompt_tokens,
                    adaptive=adaptive)
    label = f"drafter {spec}, adaptive k<={settings.k_max}" if adaptive else f"drafter {spec}"
    log(f"{label}: {lg.summary()} ({time.perf_counter() - t0:.1f} s)")
    return lg


def warm_page_cache(path: Path, chunk: int = 8 << 20) -> None:
    """Read a model's files once (a GGUF, or an artifact directory's files), so that the first measured round
    does not read the weights from disk while the second finds them in memory (the two then disagree, and a plan
    just pulled was never cached). Reads what the OS already caches at memory speed."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []
    buf = bytearray(chunk)
    for f in files:
        try:
            with open(f, "rb", buffering=0) as fh:
                while fh.readinto(buf):
                    pass
        except OSError:  # unreadable here: loading the model reports it
            continue
