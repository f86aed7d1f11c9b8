"""Making a plan (assembly/plan.py) for a model on this machine, and running its choice:

    plan_for    the cached plan (assembly/measured.py PLANS), else: the candidate targets
                (assembly/plan_targets.py: engines, ONNX exports on demand, draft models), each measured within a
                bounded budget and all head to head (assembly/plan_measure.py), the choice, cached unless the machine
                was busy or the rounds disagreed
    planned     what generate/chat/serve and Engine.open(MODEL) run by default; apply_plan: the settings that run a
                plan's choice

A run at a thread count with no plan reuses the plan of the nearest other thread count (plan_for reuse=True) rather
than measuring.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..models.catalog import model_cache_dir, resolve_model
from ..models.gguf_scan import scan_gguf
from ..models.manifest import read_manifest
from ..models.ref import RefKind, model_ref
from ..runtime.backends import info
from ..runtime.cores import default_threads
from .environment import environment
from .measured import recorded, watch
from .notice import Measuring
from .plan import (PLANS, Plan, load_plan, nearest_plan, new_plan, plan_basis, plan_key, plan_path, what_changed)
from .plan_measure import measure_targets
from .plan_targets import discover_targets
from .profile import model_fingerprint
from .profile_measure import MeasureSettings, warm_page_cache

if TYPE_CHECKING:
    from .decoder import DecodeSettings, ModelSettings

Log = Callable[[str], None]
PLAN_MEASURE = MeasureSettings(k_max=8, reps=5, prompts=6, max_tokens=64, prompt_tokens=256)
PLAN_WEIGHTS = ("int4", "int8")  # ONNX weight formats exported on demand for a GGUF model
PLAN_BUDGET_S = 70.0  # a plan made on first use takes about this long whatever the model's size (exports, gates and
#                       loading included), so that a first `generate` answers within 90 s (Qwen2.5-Coder-1.5B: 114 s
#                       at a 90 s budget, which its measurements overran by 18 s)


@dataclass(frozen=True)
class PlanSettings:
    threads: int | None = None  # None: the backends' default, min(cpu count, 8)
    weights: tuple[str, ...] = field(default_factory=lambda: PLAN_WEIGHTS)  # ONNX formats exported on demand
    export: bool = True  # export missing artifacts (False: plan over what is cached)
    measure: MeasureSettings = field(default_factory=lambda: PLAN_MEASURE)
    progress: bool = True  # a progress bar on stderr
    budget_s: float | None = PLAN_BUDGET_S  # None: export and measure fully (`specedge plan --full`)


def resolved_threads(threads: int | None) -> int:
    return default_threads(threads)


def plan_for(model: str, settings: PlanSettings = PlanSettings(), *, cache_dir: Path | None = None,
             refresh: bool = False, reuse: bool = False, log: Log = lambda m: None) -> tuple[Plan, bool]:
    """The cached plan for `model` on this machine, or a new one (measured now; `refresh` always re-measures).
    reuse=True (what runs a model, not `specedge plan`): with no plan at these threads, the plan measured at the
    nearest other thread count, said in one line, instead of measuring. Returns (plan, made_now). Raises
    ValueError/ModelFileError naming the problem (no engine can run the model)."""
    threads = resolved_threads(settings.threads)
    ref = model_ref(model, cache_dir)
    artifact = ref.kind is RefKind.ARTIFACT
    source = ref.path if artifact else resolve_model(model, cache_dir)
    fingerprint, weights = model_fingerprint(source), () if artifact else settings.weights
    basis, key = plan_basis(fingerprint, weights), plan_key(fingerprint, threads, weights)
    path = plan_path(model_cache_dir(cache_dir), key)
    if not refresh:
        plan, why = load_plan(path, key)
        if plan is not None:
            return plan, False
        other = nearest_plan(model_cache_dir(cache_dir), basis, threads) if reuse else None
        if other is not None:
            log(f"plan: none measured at {threads} thread{'s' if threads > 1 else ''}; running the choice of the plan "
                f"measured at {other.threads} ({other.choice.describe()}) at {threads} (`specedge plan {model} "
                f"--threads {threads}` measures one for {threads})")
            return other, False
        changed = what_changed(model_cache_dir(cache_dir), basis)
        why = f"the engines or the machine changed since the last plan ({changed})" if changed else why
    _check_source(source, artifact)  # a damaged file fails now, before a measurement is announced
    if not refresh:
        budget = f"within about {settings.budget_s:.0f} s" if settings.budget_s is not None else "fully"
        skip = "Ctrl-C skips, " if settings.progress else ""
        log(Measuring(f"plan: {why}; measuring this machine {budget} to choose the fastest engine and drafter "
                      f"(once; {skip}`--no-plan` or Engine.open(..., plan=False) never plans)"))
    t0 = time.perf_counter()
    with watch(threads) as w:  # other processes' CPU use over the whole planning
        targets = discover_targets(model, settings, cache_dir=cache_dir, log=log)
        for t in dict.fromkeys(t.path for t in targets):  # a model just pulled is read from disk once, before
            warm_page_cache(Path(t))  # anything is timed
        targets, rows, drift = measure_targets(targets, settings, threads, cache_dir=cache_dir, force=refresh,
                                               log=log, started=t0)
    plan = new_plan(key, model, targets, rows, threads, environment(threads), time.perf_counter() - t0,
                    load=recorded(w.load, drift), budget_s=settings.budget_s, basis=basis)
    PLANS.keep(plan.to_dict(), path, w.load, drift=drift, log=log,
               again=f"`specedge plan {model} --refresh` measures again")
    return plan, True


def _check_source(source: Path, artifact: bool) -> None:
    """Raise ModelFileError for a damaged model: the artifact's manifest, or the GGUF's bounded header walk (every
    count and tensor extent checked against the file's size; 0.1 s for SmolLM2-135M)."""
    if artifact:
        read_manifest(source, verify=False)
    else:
        scan_gguf(source)


def planned(model: "ModelSettings", decode: "DecodeSettings", *, progress: bool = True, log: Log = lambda m: None
            ) -> tuple[Plan, "ModelSettings", "DecodeSettings"]:
    """The plan for model.model at model.threads (cached; else one cached at another thread count; else measured
    now) and the settings that run its choice: what generate/chat/serve and Engine.open(MODEL) do by default
    (assembly/open.py)."""
    plan, _ = plan_for(model.model, PlanSettings(threads=model.threads, progress=progress),
                       cache_dir=model.cache_dir, reuse=True, log=log)
    return (plan, *apply_plan(plan, model, decode))


def apply_plan(plan: Plan, model: "ModelSettings", decode: "DecodeSettings"
               ) -> tuple["ModelSettings", "DecodeSettings"]:
    """The settings that run the plan's choice: its engine and artifact (ONNX on the CPU: the plan measured the
    CPU), its drafter, k and length policy; the caller's ctx, threads, cache and verifier are kept."""
    from ..runtime.drafters import parse_drafter
    row, engine = plan.choice, info(plan.choice.engine)
    model = replace(model, model=row.path, backend=engine.kind, device="cpu" if engine.devices else model.device,
                    kernels=engine.kernels(row.plain))
    decode = replace(decode, drafter=parse_drafter(row.drafter), k=max(row.k, 1), adaptive_k=row.adaptive)
    return model, decode
