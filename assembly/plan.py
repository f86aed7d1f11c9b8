"""The plan: which engine, weight format, drafter and draft length decode a model fastest on this machine.

The planner (assembly/plan_run.py) measures one device profile (assembly/profile.py) per candidate *target* (an
engine running one artifact of the model: llama.cpp on the GGUF, ONNX Runtime on each int4/int8/fp32 artifact, a
layered artifact for self-speculation) and this module turns the profiles into a Plan:

    per target: choose(profile) predicts tokens/s of plain decoding and of every drafter at every k (fixed or
                adaptive) from its verify-cost curve T(n) and acceptance (docs/algorithms.md 5)
    calibrate:  every row is put on the measured scale: plain and the adaptive draft length are their measured
                tokens/s; a fixed k is predicted and scaled by the drafter's measured / predicted tokens/s at the k
                it was measured at, so engines compare on what was measured, not on how well the cost model fits
                each engine
    time base:  the targets' plain speeds measured head to head, interleaved (assembly/plan_run.py head_to_head),
                rescale each target's rows: profiles measured minutes apart see a shared machine at different speeds
    end to end: each row also carries its target's prompt-processing rate (the plain runs' prefill; a draft
                model's own prefill counted), and is scored by what a user waits for over REQUESTS, the prompt
                lengths people send: a chat turn (64 new tokens: the session's cache holds the rest) and a first
                request with a document (700 tokens, nothing cached), each answered with 128 tokens
    choose:     the fastest candidate end to end over all targets; a speculative one must beat the fastest PLAIN
                candidate (any engine) by `margin` (3%), else that plain engine is chosen: the plan is never slower
                than the fastest plain engine beyond noise.

Example: llama.cpp plain measured 105 tok/s; ONNX int4 plain measured 86; its ngram measured 120 tok/s at fixed
k = 8 where the cost model predicted 125 (scale 0.96), and the model predicts 130 at k = 4 -> 124.8 -> chosen (1.19x
over llama.cpp plain; end to end as well when both process prompts alike). Had it come to 107 (< 105 x 1.03),
llama.cpp plain would be chosen. An engine that decodes 10% faster but processes prompts at half the rate loses end
to end: 64/300 + 128/110 = 1.38 s a chat turn and 700/300 + 1.16 = 3.50 s a document request against 64/600 +
128/100 = 1.39 s and 2.45 s.

Plans are cached at <model cache>/plans/<key>.json; the key covers what changes the answer: the source model's
fingerprint, the weight formats planned, the threads, the CPU (model name and SIMD flags) and the versions of the
engines planned (llama.cpp, ik_llama.cpp, ONNX Runtime), so a new machine, engine or model file re-plans, and any
other package (tokenizers, numpy, specedge itself: PLAN_VERSION says when planning changed) does not. Each plan
records that basis (plan_basis), so a run at a thread count nobody planned for can reuse the plan of another
(nearest_plan), and a re-plan can say what changed (what_changed). A plan whose measured artifacts are gone
(`specedge rm`) is re-made.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from ..runtime.backends import REGISTRY, info
from .environment import SIMD, cpu_info
from .measured import Store, described
from .profile import PLAIN, DeviceProfile, choose, k_label, predict

PLAN_VERSION = 10  # 2: rows on the measured scale per drafter; 3: llama.cpp speculation only at 1 thread; 4: its
#                   plain-decoding kernels; 5: targets put on one time base head to head (plan_run.head_to_head);
#                   6: the ik_llama.cpp engine, a time budget, the machine's load while measuring; 7: prompts fed
#                   without their logits (FeedingBackend), which made ik 1.4x faster per token after long prompts
#                   8: ik_llama.cpp's repacked weights measured as a plain-only target (its plain kernels)
#                   9: prompt processing measured; rows scored end to end over REQUESTS
#                   10: n-gram and suffix acceptance replayed over plain decoding's answers (profile version 6)
PLAN_MARGIN = 0.03  # a speculative configuration must be predicted this much faster than the fastest plain engine
_ENGINES = tuple(e for e in REGISTRY.values() if e.planned)  # their versions key plans
PLANS = Store("plans", "plan", PLAN_VERSION, covers="model, machine, threads and engine versions")


@dataclass(frozen=True)
class RequestShape:
    """A kind of request the plan weighs: how many prompt tokens the engine processes (a chat turn only the new
    ones: its session's cache holds the conversation so far), how many answer tokens, and how often it comes."""
    name: str
    prompt_tokens: int
    answer_tokens: int
    weight: float


REQUESTS = (RequestShape("chat turn", 64, 128, 2.0),
            RequestShape("first request with a document", 700, 128, 1.0))


@dataclass(frozen=True)
class PlanTarget:
    """One engine running one artifact of the model."""
    engine: str  # BackendKind value
    path: str  # the GGUF file or the artifact directory
    label: str  # what the table shows: "llama.cpp q4_1", "onnx int4", "onnx layered-int4"


@dataclass(frozen=True)
class PlanRow:
    """One candidate configuration on one target: predicted (calibrated) tokens/s and what was measured."""
    target: str  # PlanTarget.label
    engine: str
    path: str
    drafter: str  # PLAIN or a DrafterSpec string
    k: int
    adaptive: bool
    predicted_tok_s: float  # decoding, calibrated to the target's measured plain speed
    measured_tok_s: float | None  # plain: measured plain; a drafter: its measured run at this k policy, if any
    prompt_tok_s: float | None = None  # prompt tokens processed per second (None: not measured)

    @property
    def plain(self) -> bool:
        return self.drafter == PLAIN

    def seconds(self, shape: RequestShape) -> float:
        """Wall time of one request of this shape: its prompt's processing, then its answer's decoding."""
        prompt = shape.prompt_tokens / self.prompt_tok_s if self.prompt_tok_s else 0.0
        return prompt + shape.answer_tokens / max(self.predicted_tok_s, 1e-9)

    def first_token_s(self, prompt_tokens: int) -> float:
        """Seconds to the first answer token after a prompt of `prompt_tokens` new tokens."""
        prompt = prompt_tokens / self.prompt_tok_s if self.prompt_tok_s else 0.0
        return prompt + 1.0 / max(self.predicted_tok_s, 1e-9)

    @property
    def end_to_end_tok_s(self) -> float:
        """Answer tokens per second of wall time over REQUESTS, the prompts' processing included: what the plan
        compares. Without a measured prompt rate, the decoding rate."""
        tokens = sum(s.weight * s.answer_tokens for s in REQUESTS)
        return tokens / sum(s.weight * self.seconds(s) for s in REQUESTS)

    def describe(self) -> str:
        """'onnx int4 + ngram k<=8' | 'llama.cpp q4_1 plain'"""
        return f"{self.target} plain" if self.plain else f"{self.target} + {self.drafter} {k_label(self.k, self.adaptive)}"


@dataclass
class Plan:
    """The rows of every target, which one is chosen, and the reference it is compared with."""
    key: str
    model: str  # the name the user gave
    sources: list[str]  # every GGUF / artifact measured (`specedge rm` deletes plans that name a removed one)
    rows: list[PlanRow]
    chosen: int  # index into rows
    reference: int  # the row the speedup is stated against: llama.cpp plain where measured, else the fastest plain
    threads: int
    machine: dict = field(default_factory=dict)
    created: str = ""
    seconds: float = 0.0  # wall time the planning took (exports + measurements)
    load: dict = field(default_factory=dict)  # contention.Load while measuring (other_cores, loadavg), busy, drift
    budget_s: float | None = None  # the time budget it was measured within (None: measured fully)
    version: int = PLAN_VERSION
    basis: dict = field(default_factory=dict)  # plan_basis: what the plan holds for besides the threads

    @property
    def choice(self) -> PlanRow:
        return self.rows[self.chosen]

    def measured(self) -> str:
        """When and under what load: 'measured 2026-11-25 08:12:24 in 64 s (budget 70 s), quiet (other processes
        0.02 cores; load average 1.1 on 2 cores)' (assembly/contention.py Load.describe)."""
        how = ", " + described(self.load) if self.load else ""
        budget = "measured fully" if self.budget_s is None else f"budget {self.budget_s:.0f} s"
        return f"measured {self.created} in {self.seconds:.0f} s ({budget}){how}"

    @property
    def scored_end_to_end(self) -> bool:
        """Whether every row has a measured prompt rate (then rows are compared end to end, else by decoding)."""
        return all(r.prompt_tok_s for r in self.rows)

    def score(self, row: PlanRow) -> float:
        """What the choice compares for `row` (scores)."""
        return scores(self.rows)[self.rows.index(row)]

    @property
    def speedup(self) -> float:
        """The choice's decoding speed over the reference's."""
        return self.choice.predicted_tok_s / max(self.rows[self.reference].predicted_tok_s, 1e-9)

    @property
    def end_to_end_speedup(self) -> float:
        """The choice's end-to-end speed over REQUESTS over the reference's."""
        return self.choice.end_to_end_tok_s / max(self.rows[self.reference].end_to_end_tok_s, 1e-9)

    def summary(self) -> str:
        """One line: 'native q4_1 + ngram k=2, predicted 2.41x over llama.cpp q4_1 plain decoding (261.3 vs 108.4
        tok/s), 2.30x end to end'."""
        ref, choice = self.rows[self.reference], self.choice
        e2e = (f", {choice.end_to_end_tok_s:.1f} tok/s end to end" if self.chosen == self.reference else
               f", {self.end_to_end_speedup:.2f}x end to end") if self.scored_end_to_end else ""
        if self.chosen == self.reference:
            others = max((self.score(r) for r in self.rows if r is not ref), default=0.0)
            what = "end to end" if self.scored_end_to_end else "tok/s"
            return (f"{ref.describe()}, predicted {ref.predicted_tok_s:.1f} tok/s{e2e} (fastest of {len(self.rows)} "
                    f"candidates; next best {others:.1f} {what})")
        return (f"{choice.describe()}, predicted {self.speedup:.2f}x over {ref.describe()} decoding "
                f"({choice.predicted_tok_s:.1f} vs {ref.predicted_tok_s:.1f} tok/s){e2e}")

    TABLE_KEY = ("decode tok/s: each configuration's own measurement scaled by its engine's plain runs head to head "
                 "with the other engines; alone: that configuration's own measurement, taken at another moment (not "
                 "comparable across engines); both on dev prompts of up to 256 tokens, so a run on a shorter prompt "
                 "decodes faster and one deep into a long chat slower. prompt tok/s: the prompts' processing. first "
                 "token and end to end: predicted for " + " and ".join(
                     f"a {s.name} ({s.prompt_tokens} prompt tokens, {s.answer_tokens} answer tokens)"
                     for s in REQUESTS) + f", {REQUESTS[0].weight / REQUESTS[1].weight:g} to 1; the choice "
                 "compares end to end")

    def table(self) -> str:
        """Markdown: every candidate with its decoding (head-to-head and alone), prompt and end-to-end speeds, the
        chosen one marked, then one line saying what the columns mean."""
        short, long = REQUESTS[0].prompt_tokens, REQUESTS[1].prompt_tokens
        lines = ["| | target | drafter | k | decode tok/s (head to head) | tok/s alone (profile) | prompt tok/s | "
                 f"first token ms ({short} / {long} tokens) | end to end tok/s | vs reference (end to end) |",
                 "|---|---|---|---|---|---|---|---|---|---|"]
        ref = self.score(self.rows[self.reference])
        for r in sorted(self.rows, key=lambda r: -self.score(r)):
            mark = "**chosen**" if r is self.choice else "reference" if r is self.rows[self.reference] else ""
            k = "-" if r.plain else k_label(r.k, r.adaptive)
            measured = "-" if r.measured_tok_s is None else f"{r.measured_tok_s:.1f}"
            prompt = f"{r.prompt_tok_s:.0f}" if r.prompt_tok_s else "-"
            first = (f"{1e3 * r.first_token_s(short):.0f} / {1e3 * r.first_token_s(long):.0f}"
                     if r.prompt_tok_s else "-")
            e2e = f"{r.end_to_end_tok_s:.1f}" if r.prompt_tok_s else "-"
            lines.append(f"| {mark} | {r.target} | {r.drafter} | {k} | {r.predicted_tok_s:.1f} | {measured} | "
                         f"{prompt} | {first} | {e2e} | {self.score(r) / max(ref, 1e-9):.2f}x |")
        return "\n".join(lines) + "\n\n" + self.TABLE_KEY + "\n"

    def to_dict(self) -> dict:
        out = asdict(self)
        out["choice"] = {**asdict(self.choice), "summary": self.summary()}  # what `specedge models` shows
        return out

    @classmethod
    def from_dict(cls, obj: dict) -> "Plan":
        """Raises ValueError/TypeError/KeyError on a plan of another shape (the caller re-plans; PLANS.load has
        checked its version)."""
        fields = {k: v for k, v in obj.items() if k != "choice"}
        fields["rows"] = [PlanRow(**r) for r in obj["rows"]]
        plan = cls(**fields)
        if not (0 <= plan.chosen < len(plan.rows) and 0 <= plan.reference < len(plan.rows)):
            raise ValueError("plan indices out of range")
        return plan


def target_rows(target: PlanTarget, profile: DeviceProfile, drafters: Sequence[str]) -> list[PlanRow]:
    """Plain decoding and, per drafter, its best k (fixed or adaptive) on one target, on the measured scale (module
    docstring): plain and the adaptive length are their measured tokens/s; a fixed k is the cost model's prediction
    scaled by the drafter's measured / predicted tokens/s at the k it was measured at (k_max), which carries the
    model's bias for this drafter and engine over to the other k. A drafter without measured speeds falls back to
    the plain scale."""
    choice = choose(profile, list(drafters))
    plain_scale = (profile.plain_tok_s_measured / choice.plain_tok_s
                   if profile.plain_tok_s_measured and choice.plain_tok_s > 0 else 1.0)
    best: dict[str, PlanRow] = {}
    for c in choice.candidates:
        if c.drafter == PLAIN:
            tok_s, measured = c.tok_s * plain_scale, profile.plain_tok_s_measured
        else:
            d = profile.drafters[c.drafter]
            at_kmax = predict(profile, c.drafter, d.k_max).tok_s if d.k_max + 1 <= len(profile.verify_s) else 0.0
            scale = d.tok_s_measured / at_kmax if d.tok_s_measured > 0 and at_kmax > 0 else plain_scale
            if c.adaptive:
                tok_s, measured = d.tok_s_adaptive, d.tok_s_adaptive
            else:
                tok_s, measured = c.tok_s * scale, d.tok_s_measured if c.k == d.k_max else None
        prompt = profile.prompt_tok_s_measured
        own = profile.drafters[c.drafter].prompt_tok_s if c.drafter != PLAIN else 0.0
        if prompt and own:  # a draft model processes the prompt too: its run's rate, never above plain's
            prompt = min(prompt, own)
        row = PlanRow(target.label, target.engine, target.path, c.drafter, c.k, c.adaptive, float(tok_s),
                      float(measured) if measured else None, float(prompt) if prompt else None)
        if c.drafter not in best or row.predicted_tok_s > best[c.drafter].predicted_tok_s * (1 + 1e-9):
            best[c.drafter] = row
    return list(best.values())


def scores(rows: Sequence[PlanRow]) -> list[float]:
    """What the choice compares per row: end-to-end tok/s over REQUESTS where every row has a measured prompt
    rate, else decoding tok/s."""
    e2e = all(r.prompt_tok_s for r in rows)
    return [r.end_to_end_tok_s if e2e else r.predicted_tok_s for r in rows]


def select(rows: Sequence[PlanRow], margin: float = PLAN_MARGIN) -> tuple[int, int]:
    """(chosen, reference) indices: the fastest row end to end (by decoding where a row has no prompt rate),
    unless it is speculative and not `margin` faster than the fastest plain row (then that one); the reference is
    llama.cpp plain where present, else the fastest plain row. Ties go to the earlier row.
    requires: at least one plain row."""
    plains = [i for i, r in enumerate(rows) if r.plain]
    if not plains:
        raise ValueError("a plan needs plain decoding on at least one engine")
    score = scores(rows)
    best_plain = max(plains, key=lambda i: (score[i], -i))
    best = max(range(len(rows)), key=lambda i: (score[i], -i))
    if not rows[best].plain and score[best] < score[best_plain] * (1 + margin):
        best = best_plain
    ref = [i for i in plains if info(rows[i].engine).reference]
    reference = max(ref, key=lambda i: score[i]) if ref else best_plain
    return best, reference


# -- key and cache ------------------------------------------------------------------------------------------------

def device_fingerprint() -> dict:
    """What the plan depends on besides the model: the CPU, the versions of the engines it plans, and which engines
    offload layers to a GPU by default. Not other packages: they do not change which engine is fastest."""
    model, flags = cpu_info()
    versions = {e.distribution: e.version() for e in _ENGINES}  # the native engine's with its build's digest
    device = {"cpu_model": model, "simd": sorted(f for f in flags if f in SIMD), "engines": versions}
    offload = [e.value for e in REGISTRY.values() if e.offloads()]
    if offload:  # engines whose build puts layers on a GPU by default (a CPU build's key is unchanged)
        device["gpu_offload"] = offload
    return device


def plan_basis(model_fingerprint: str, weights: Sequence[str], device: dict | None = None) -> dict:
    """What a plan holds for besides the thread count: the source model, the weight formats planned, the device."""
    return {"model": model_fingerprint, "weights": sorted(weights),
            "device": device if device is not None else device_fingerprint()}


def plan_key(model_fingerprint: str, threads: int, weights: Sequence[str], device: dict | None = None) -> str:
    """16 hex digits over the source model's fingerprint, threads, the weight formats planned, the device."""
    device = device if device is not None else device_fingerprint()
    return PLANS.key(model_fingerprint, threads, sorted(weights), device)


def cached_plans(cache_root: Path) -> list[Plan]:
    """Every readable plan of this version under <cache_root>/plans whose measured artifacts all exist."""
    out = []
    for path in sorted((Path(cache_root) / PLANS.folder).glob("*.json")):
        plan, _ = PLANS.load(path, None, Plan.from_dict)
        if plan is not None and all(Path(s).exists() for s in plan.sources):
            out.append(plan)
    return out


def nearest_plan(cache_root: Path, basis: dict, threads: int) -> Plan | None:
    """A cached plan of the same model, weight formats and device measured at another thread count (the nearest;
    ties: the fewer threads), or None. Its choice tells which engine, artifact and drafter to run; the caller keeps
    its own thread count, and a speculative choice that is not lossless at it is run plain (assembly/open.py)."""
    same = [p for p in cached_plans(cache_root) if p.basis == basis and p.threads != threads]
    return min(same, key=lambda p: (abs(p.threads - threads), p.threads), default=None)


def what_changed(cache_root: Path, basis: dict) -> str | None:
    """Why a plan of this model and weight formats no longer holds, from the newest cached one made on another
    device: 'llama_cpp_python 0.3.8 -> 0.3.9', 'another CPU (...)'; None when there is none."""
    same = [p for p in cached_plans(cache_root) if p.basis.get("model") == basis["model"]
            and p.basis.get("weights") == basis["weights"] and p.basis.get("device") != basis["device"]]
    if not same:
        return None
    old, new = max(same, key=lambda p: p.created).basis["device"], basis["device"]
    changes = [f"{name} {old.get('engines', {}).get(name)} -> {v}" for name, v in new.get("engines", {}).items()
               if old.get("engines", {}).get(name) != v]
    if (old.get("cpu_model"), old.get("simd")) != (new.get("cpu_model"), new.get("simd")):
        changes.insert(0, f"another CPU ({new.get('cpu_model')})")
    if old.get("gpu_offload") != new.get("gpu_offload"):
        changes.append("another GPU offload")
    return ", ".join(changes) or None


def plan_path(cache_root: Path, key: str) -> Path:
    """<model cache>/plans/<key>.json"""
    return PLANS.path(cache_root, key)


def save_plan(plan: Plan, path: Path) -> Path:
    return PLANS.save(plan.to_dict(), path)


def load_plan(path: Path, key: str) -> tuple[Plan | None, str]:
    """(plan, "") when `path` holds a valid plan with this key whose artifacts all still exist; else (None, why)."""
    plan, why = PLANS.load(path, key, Plan.from_dict)
    if plan is None:
        return None, why
    gone = [s for s in plan.sources if not Path(s).exists()]
    if gone:
        return None, f"the cached plan measured {gone[0]}, which is gone"
    return plan, ""


def new_plan(key: str, model: str, targets: Sequence[PlanTarget], rows: Sequence[PlanRow], threads: int,
             machine: dict, seconds: float, margin: float = PLAN_MARGIN, load: dict | None = None,
             budget_s: float | None = None, basis: dict | None = None) -> Plan:
    chosen, reference = select(rows, margin)
    return Plan(key, model, [t.path for t in targets], list(rows), chosen, reference, threads, machine,
                time.strftime("%Y-%m-%d %H:%M:%S"), seconds, dict(load or {}), budget_s, basis=dict(basis or {}))
