"""Measuring a plan's targets (assembly/plan_run.py): each target's device profile within its share of the budget,
then every target's plain decoding head to head, so that engines measured minutes apart compare on one time base.

Measurement (plan_run.PLAN_MEASURE): T(n) for n = 1..9, then each drafter decodes 6 dev prompts (one per Spec-Bench
task) x 64 tokens at fixed k = 8 and with the adaptive length. For SmolLM2-135M on 2 cores: about 15 s per target
with n-gram only, 40 s with the self-drafter hybrid. Profiles are cached per target (assembly/auto.py), keyed by the
engine's own version, so a plan re-made after an engine upgrade re-measures that engine only, and adding a target
does not re-measure the others.

Budget (PlanSettings.budget_s, counted from when planning started): each target's measurement gets an equal share
of what is left after a HEAD_TO_HEAD_SHARE reserve; a plain-only measurement, which the head-to-head rounds measure
again, half a share (_plain_only, the one place that halves).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..models.errors import ModelFileError
from ..models.progress import progress_bar
from ..runtime.backends import BackendInfo, Kernels, info
from .auto import candidate_specs, load_or_measure
from .contention import drifted
from .load import LoadedModel, load_model
from .plan import PlanRow, PlanTarget, target_rows
from .plan_targets import draft_models
from .profile_measure import MeasureSettings, dev_prompts, measure_steps, run_rounds

if TYPE_CHECKING:
    from .plan_run import PlanSettings

Log = Callable[[str], None]
HEAD_TO_HEAD_SHARE = 0.15  # of the budget, for the engines' interleaved plain runs
MIN_DRIFT_S = 0.5  # head-to-head rounds shorter than this are not compared for drift
HEAD_TO_HEAD = MeasureSettings(prompts=3, max_tokens=48, prompt_tokens=256)  # plain runs, 2 rounds
PREFILL_X = 4.0  # a prompt prefills about this many times faster per token than decoding (2 CPU cores, llama.cpp)


@dataclass
class Measured:
    """One measured target: its plan rows (plain first, then each drafter's best k) and its loaded model, kept for
    the head-to-head rounds (None once released)."""
    target: PlanTarget
    rows: list[PlanRow]
    model: LoadedModel | None

    @property
    def plain_tok_s(self) -> float:
        return self.rows[0].predicted_tok_s


@dataclass(frozen=True)
class _Planning:
    """What the measurement of every target shares."""
    settings: "PlanSettings"
    threads: int
    cache_dir: Path | None
    force: bool
    started: float  # perf_counter when planning started: the budget counts from it
    bar: object  # the progress bar
    say: Log

    def budgeted(self, n_left: int) -> MeasureSettings:
        """The next target's measurement: with a budget, an equal share of what is left of it after the
        head-to-head reserve (HEAD_TO_HEAD_SHARE), at least 5 s in all."""
        budget = self.settings.budget_s
        if budget is None:
            return self.settings.measure
        left = budget * (1 - HEAD_TO_HEAD_SHARE) - (time.perf_counter() - self.started)
        return replace(self.settings.measure, budget_s=max(left, 5.0) / n_left)

    def load(self, t: PlanTarget, engine: BackendInfo, kernels: Kernels = Kernels.EXACT) -> LoadedModel | None:
        """The target loaded on the CPU; None when it cannot be (a line says why: e.g. a file its gate refuses)."""
        try:
            return load_model(t.path, engine.kind, threads=self.threads, cache_dir=self.cache_dir, device="cpu",
                              log=self.say, kernels=kernels)
        except (ValueError, RuntimeError, ImportError, ModelFileError) as e:
            which = "" if kernels is Kernels.EXACT else f" {engine.fast_kernels}"
            self.say(f"plan: {t.label}{which} not planned: {e}")
            return None

    def profiled(self, t: PlanTarget, loaded: LoadedModel, specs: list[str], measure: MeasureSettings,
                 step: Log = lambda _: None) -> Measured:
        """Its profile, measured or read from cache (assembly/auto.py), as plan rows."""
        profile, _ = load_or_measure(loaded, t.label, specs, threads=self.threads, device="cpu",
                                     cache_dir=self.cache_dir, force=self.force, settings=measure,
                                     log=lambda m: None, step=step)
        return Measured(t, target_rows(t, profile, specs), loaded)


def _plain_only(measure: MeasureSettings) -> MeasureSettings:
    """A plain-only measurement's settings: half the budget, since the head-to-head rounds measure plain decoding
    again (the one place a budget is halved)."""
    return measure if measure.budget_s is None else replace(measure, budget_s=measure.budget_s / 2)


def measure_targets(targets: list[PlanTarget], settings: "PlanSettings", threads: int, *,
                    cache_dir: Path | None = None, force: bool = False, log: Log = lambda m: None,
                    started: float | None = None) -> tuple[list[PlanTarget], list[PlanRow], str]:
    """The targets that loaded (one that cannot: a line says why, the others go on), every one's plan rows (plain
    and the best k of each drafter), its profile measured or read from cache, and why the head-to-head rounds say
    the machine's speed changed while they ran ("" if they agree). With a budget (settings.budget_s, counted from
    `started`), each target's measurement gets its share (module docstring)."""
    bar = _bar(settings.progress)
    say = (lambda m: bar.write(m, file=sys.stderr)) if settings.progress else log
    run = _Planning(settings, threads, cache_dir, force, time.perf_counter() if started is None else started, bar,
                    say)
    measured: list[Measured] = []
    drift = ""
    try:
        for n_left, t in zip(range(len(targets), 0, -1), targets):
            measured += _measure_target(run, t, n_left)
        if len(measured) > 1:
            bar.set_description("plan: engines head to head")
            seconds = None if settings.budget_s is None else settings.budget_s * HEAD_TO_HEAD_SHARE
            measured, drift = head_to_head(measured, say, seconds)
    finally:
        for m in measured:  # the loaded models go now, also when Ctrl-C stops the planning
            m.model = None
        bar.close()
    if not measured:
        raise ValueError("no engine could run this model here (each target's reason is above)")
    for m in measured:
        best, prompt = max(m.rows, key=lambda r: r.predicted_tok_s), m.rows[0].prompt_tok_s
        say(f"plan: {m.target.label}: plain {m.plain_tok_s:.1f} tok/s{f' (prompts {prompt:.0f} tok/s)' if prompt else ''}"
            f", best {best.describe()} {best.predicted_tok_s:.1f} tok/s")
    return [m.target for m in measured], [r for m in measured for r in m.rows], drift


def _measure_target(run: _Planning, t: PlanTarget, n_left: int) -> list[Measured]:
    """One target measured ([] when it does not load), then, where its engine's plain-decoding kernels differ for
    it, those as a second, plain-only target (_fast_kernels_target). A target that is not batch-invariant at these
    threads is measured plain only, on its fast kernels where it has them."""
    engine = info(t.engine)
    loaded = run.load(t, engine)
    if loaded is None:
        return []
    specs = candidate_specs(loaded, [], run.cache_dir)
    if engine.draft_models:
        specs += draft_models(Path(t.path), run.cache_dir)
    variance = loaded.backend.caps.variance
    if variance is not None:  # the plan is lossless: speculation only where it is exact
        fast = engine.kernels(plain=True) is Kernels.FAST_PLAIN_ONLY
        run.say(f"plan: {t.label} at {run.threads} threads: {Path(t.path).name} {variance.why}: plain only"
                f"{f', on its {engine.fast_kernels} kernels' if fast else ''} ({variance.fix})")
        specs = []
        if fast:
            del loaded
            loaded = load_model(t.path, engine.kind, threads=run.threads, cache_dir=run.cache_dir, device="cpu",
                                kernels=Kernels.FAST_PLAIN_ONLY)
    run.bar.total = (run.bar.total or 0) + measure_steps(len(specs), run.settings.measure)
    run.bar.set_description(f"plan: measuring {t.label}")
    run.bar.refresh()
    measure = run.budgeted(n_left)
    if not specs and n_left > 1:  # plain only, and other targets follow: the head-to-head rounds measure it again
        measure = _plain_only(measure)
    out = [run.profiled(t, loaded, specs, measure, step=lambda _: run.bar.update(1))]
    if specs and engine.kernels(plain=True) is Kernels.FAST_PLAIN_ONLY:  # its plain row runs other kernels
        out += _fast_kernels_target(run, t, engine, _plain_only(measure))
    run.bar.n = run.bar.total
    run.bar.refresh()
    return out


def _fast_kernels_target(run: _Planning, t: PlanTarget, engine: BackendInfo, measure: MeasureSettings
                         ) -> list[Measured]:
    """A batch-invariant target's plain decoding on the engine's fast kernels (registry fast_kernels: ik_llama.cpp
    with its weights repacked), which a plain choice on that engine runs (apply_plan): measured plain only. [] where
    they are the exact kernels for this file (ik: nothing to repack, or its gate found the repacked weights
    unfaithful) or do not load."""
    loaded = run.load(t, engine, Kernels.FAST_PLAIN_ONLY)
    if loaded is None or loaded.backend.caps.batch_invariant:
        return []
    variant = PlanTarget(t.engine, t.path, f"{t.label} {engine.fast_kernels}")
    return [run.profiled(variant, loaded, [], measure)]


def head_to_head(measured: list[Measured], say: Log, seconds: float | None = None) -> tuple[list[Measured], str]:
    """Put the targets on one time base: profiles measured minutes apart (or cached from another day) see a shared
    machine at different speeds, so every target decodes the same prompts plainly, interleaved, in two rounds (the
    second in reverse order, so a drift hits all alike), and each target's rows are scaled by its head-to-head
    plain speed over its profile's. Example: llama.cpp's profile says plain 97 tok/s, ONNX int4's 76; head to head
    they run 80 and 70: llama.cpp's rows x 0.82, ONNX's x 0.92. Returns the rescaled records and, when the two
    rounds of a target disagree by more than contention.DRIFT (the machine's speed changed while they ran), why
    ('the rounds disagreed by 31% (... ran 60.1 then 41.5 tok/s)'), else "". `seconds`: about how long the rounds
    may take (the tokens per prompt shrink for slow targets). requires: every record's model loaded."""
    prompts = dev_prompts(HEAD_TO_HEAD.prompts)
    tokens = [HEAD_TO_HEAD.max_tokens] * len(measured)
    prompt_tokens = HEAD_TO_HEAD.prompt_tokens
    if seconds is not None:  # each target's share of the rounds at its profiled plain speed, its prefill counted
        prompt_tokens = min(prompt_tokens, 48)
        per = seconds / (2 * len(measured) * len(prompts))
        tokens = [int(min(HEAD_TO_HEAD.max_tokens, max(8, (per - prompt_tokens / (PREFILL_X * tok_s)) * tok_s / 1.5)))
                  for tok_s in (max(m.plain_tok_s, 1e-3) for m in measured)]
    speeds: list[list[float]] = [[] for _ in measured]
    timed: list[float] = [float("inf")] * len(measured)  # the shorter round's decode time per target
    for order in (range(len(measured)), reversed(range(len(measured)))):
        for i in order:
            run = run_rounds(measured[i].model, None, prompts, 0, tokens[i], prompt_tokens)
            speeds[i].append(float(run.tokens_per_s))
            timed[i] = min(timed[i], run.decode_s)
    out, drift = [], []
    for m, s, secs in zip(measured, speeds, timed):
        now, profiled = float(np.mean(s)), m.plain_tok_s
        scale = now / profiled if profiled > 0 and now > 0 else 1.0
        say(f"plan: {m.target.label}: plain {now:.1f} tok/s head to head (profile {profiled:.1f}; rows x {scale:.2f})")
        out.append(replace(m, rows=[replace(r, predicted_tok_s=r.predicted_tok_s * scale,  # prompts run on the
                                            prompt_tok_s=r.prompt_tok_s * scale if r.prompt_tok_s else None)  # same
                                    for r in m.rows]))  # machine: the same factor
        if secs >= MIN_DRIFT_S and drifted(*s):  # rounds of a few ms (tiny models) are all noise
            drift.append((abs(s[0] - s[1]) / max(s), f"{m.target.label} ran {s[0]:.1f} then {s[1]:.1f} tok/s"))
    return out, disagreement(drift)


def disagreement(drift: list[tuple[float, str]]) -> str:
    """'the rounds disagreed by 31% (a ran 60.1 then 41.5 tok/s; b ...)' from (relative gap, what) pairs; "" for
    none."""
    if not drift:
        return ""
    return f"the rounds disagreed by {100 * max(g for g, _ in drift):.0f}% ({'; '.join(w for _, w in drift)})"


def _bar(enabled: bool):
    """The plan's progress bar, shown only once planning has run a second (an error before that, such as an
    unfinished export, comes without a stray "plan 0%" line); plain lines where stderr is not a terminal."""
    return progress_bar(0, file=sys.stderr, enabled=enabled, unit="step", dynamic_ncols=True, desc="plan", delay=1.0,
                        bar_format="{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}]")
