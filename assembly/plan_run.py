"""Making a plan (assembly/plan.py) for a model on this machine: find the candidate targets, export the ONNX ones on
demand, measure each target's device profile with a bounded budget, choose, cache.

    GGUF model (catalogue name or path)
        llama.cpp on the GGUF                                   drafters: ngram, catalogue draft models (pulled,
                                                                same tokenizer, smaller file); at 1 thread only:
                                                                with more, llama.cpp is not batch-invariant, so
                                                                its speculation is not lossless (plain only)
        ONNX Runtime on <model>-onnx-<w>, w in PlanSettings.weights (default int4, int8): exported into the cache
                                                                on first use (parity-gated) where memory allows;
                                                                drafters: ngram
        every other CPU artifact in the cache exported from the same GGUF (SHA-256 of the source): fp32 with the
                                                                quantized self-drafter + lookup hybrid, a layered
                                                                artifact with layer skip
        a GGUF our code cannot read (no family module, a tokenizer we do not build): llama.cpp only; the ONNX
                                                                export is skipped with the family message
    exported artifact (directory or cache name): that artifact only (its manifest names the engine)

Measurement (PLAN_MEASURE): T(n) for n = 1..9, then each drafter decodes 6 dev prompts (one per Spec-Bench task) x
64 tokens at fixed k = 8 and with the adaptive length. For SmolLM2-135M on 2 cores: about 15 s per target with
n-gram only, 40 s with the self-drafter hybrid; an int4/int8 export about 15 s each. Profiles are cached per
target (assembly/auto.py), keyed by the engine's own version, so a plan re-made after an engine upgrade re-measures
that engine only, and adding a target does not re-measure the others. A run at a thread count with no plan reuses
the plan of the nearest other thread count (plan_for reuse=True) rather than measuring.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..models.catalog import CATALOG, cached_path, file_sha256, model_cache_dir, resolve_model
from ..models.gguf_in import open_gguf
from ..models.errors import ModelFileError, UnsupportedModelError
from ..models.gguf_any import open_any_gguf
from ..models.gguf_scan import scan_gguf
from ..models.progress import progress_bar
from ..models.manifest import FORMAT, MANIFEST, PAD_ROW_NONE, Manifest, Profile, read_manifest
from ..models.ref import RefKind, model_ref
from ..runtime.backends import artifact_engine, gguf_engines, info
from .auto import candidate_specs, load_or_measure
from .contention import drifted
from .environment import environment
from .load import LoadedModel, artifact_name, load_model
from .measured import recorded, watch
from .notice import Measuring
from .plan import (PLANS, Plan, PlanRow, PlanTarget, load_plan, nearest_plan, new_plan, plan_basis, plan_key,
                   plan_path, target_rows, what_changed)
from .profile import model_fingerprint
from .profile_measure import MeasureSettings, measure_steps, warm_page_cache

if TYPE_CHECKING:
    from .decoder import DecodeSettings, ModelSettings

Log = Callable[[str], None]
PLAN_MEASURE = MeasureSettings(k_max=8, reps=5, prompts=6, max_tokens=64, prompt_tokens=256)
PLAN_WEIGHTS = ("int4", "int8")  # ONNX weight formats exported on demand for a GGUF model
PLAN_BUDGET_S = 70.0  # a plan made on first use takes about this long whatever the model's size (exports, gates and
#                       loading included), so that a first `generate` answers within 90 s (Qwen2.5-Coder-1.5B: 114 s
#                       at a 90 s budget, which its measurements overran by 18 s)
EXPORT_S_PER_MPARAM = 0.12  # an ONNX export with its parity gate, seconds per million parameters (2 cores: SmolLM2
#                             135M about 15 s); an export estimated over a quarter of the budget is not made
HEAD_TO_HEAD_SHARE = 0.15  # of the budget, for the engines' interleaved plain runs
MIN_DRIFT_S = 0.5  # head-to-head rounds shorter than this are not compared for drift
_BYTES_PER_WEIGHT = {"int4": 0.6, "int8": 1.1, "fp16": 2.0, "fp32": 4.0}  # artifact bytes per parameter, about


@dataclass(frozen=True)
class PlanSettings:
    threads: int | None = None  # None: the backends' default, min(cpu count, 8)
    weights: tuple[str, ...] = field(default_factory=lambda: PLAN_WEIGHTS)  # ONNX formats exported on demand
    export: bool = True  # export missing artifacts (False: plan over what is cached)
    measure: MeasureSettings = field(default_factory=lambda: PLAN_MEASURE)
    progress: bool = True  # a progress bar on stderr
    budget_s: float | None = PLAN_BUDGET_S  # None: export and measure fully (`specedge plan --full`)


def resolved_threads(threads: int | None) -> int:
    return threads or min(os.cpu_count() or 1, 8)


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


def discover_targets(model: str, settings: PlanSettings, *, cache_dir: Path | None = None,
                     log: Log = lambda m: None) -> list[PlanTarget]:
    """The targets worth measuring for `model` (module docstring); each engine only where its package is
    installed. Raises ValueError when none is."""
    ref = model_ref(model, cache_dir)
    onnx = artifact_engine()
    if ref.kind is RefKind.ARTIFACT:
        return [PlanTarget(onnx.value, str(ref.path), _artifact_label(read_manifest(ref.path, verify=False)))]
    gguf = resolve_model(model, cache_dir)
    targets = []
    for engine in (e for e in gguf_engines(installed=False) if e.planned):
        if engine.installed():
            where = " GPU" if engine.offloads() else ""  # a build that offloads runs all layers there
            targets.append(PlanTarget(engine.value, str(gguf), f"{engine.name} {_gguf_type(gguf)}{where}"))
        else:
            log(f"plan: {engine.missing()}: {engine.name} not planned")
    if not (onnx.installed() and importlib.util.find_spec("onnx") is not None):
        log(f"plan: {onnx.missing()} and onnx: ONNX Runtime not planned")
    else:
        targets += _onnx_targets(model, gguf, settings, cache_dir, log)
    if not targets:
        raise ValueError("no engine to plan: install llama-cpp-python or onnxruntime (pip install "
                         "'specedge[llama,onnx]')")
    return targets


def _onnx_targets(model: str, gguf: Path, settings: PlanSettings, cache_dir: Path | None, log: Log
                  ) -> list[PlanTarget]:
    sha = file_sha256(gguf)
    found: dict[Path, PlanTarget] = {}
    for w in settings.weights:
        out = model_cache_dir(cache_dir) / artifact_name(model, w)
        if _plannable(out, sha, (Profile.DYNAMIC,)) is None and settings.export:
            why = _cannot_export(gguf, w, settings.budget_s, cache_dir)
            if why:
                log(f"plan: not exporting {out.name}: {why}")
                continue
            try:
                export_onnx(gguf, out, w, settings.threads, log, cache_dir)
            except (ValueError, ImportError, RuntimeError) as e:
                log(f"plan: the {w} export failed, ONNX {w} not planned: {e}")
                continue
        if _plannable(out, sha, (Profile.DYNAMIC,)) is not None:
            found[out.resolve()] = PlanTarget(artifact_engine().value, str(out), f"onnx {w}")
    for root in sorted(m.parent for m in model_cache_dir(cache_dir).glob(f"*/{MANIFEST}")):  # other exports of it
        manifest = None if root.resolve() in found else _plannable(root, sha, (Profile.DYNAMIC, Profile.LAYERED))
        if manifest is not None:
            found[root.resolve()] = PlanTarget(artifact_engine().value, str(root), _artifact_label(manifest))
    return list(found.values())


def _artifact_label(manifest: Manifest) -> str:
    profile = "" if manifest.profile is Profile.DYNAMIC else f"{manifest.profile.value}-"
    return f"onnx {profile}{manifest.weight_format}"


def _gguf_type(path: Path) -> str:
    """The file's quantisation as its metadata states it (general.file_type: 'q4_1', 'q4_k_m'), else the file
    name's last dotted part, else 'gguf' (a name like Qwen2.5-Coder-1.5B...-q4_k_m.gguf is not cut at its dots)."""
    import gguf as gguf_lib
    try:
        kind = open_any_gguf(path).metadata.get("general.file_type")
        return gguf_lib.LlamaFileType(int(kind)).name.removeprefix("MOSTLY_").lower()
    except (ValueError, TypeError, OSError, ModelFileError, UnsupportedModelError):
        stem = Path(path).stem
        return stem.rpartition(".")[2].lower() if "." in stem else "gguf"


def _plannable(root: Path, sha: str, profiles: tuple[Profile, ...]) -> Manifest | None:
    """The manifest of a finished, parity-passed CPU artifact of our format in one of `profiles`, exported from the
    GGUF with this SHA-256; None otherwise (missing, unreadable, another source, failed gate, the GPU graph)."""
    try:
        m = read_manifest(root, verify=False)  # the files are hashed when the target loads
    except (ModelFileError, OSError):
        return None
    parity, prov = m.raw.get("parity"), m.raw.get("provenance")
    ok = (m.format == FORMAT and m.profile in profiles and m.pad_row != PAD_ROW_NONE
          and isinstance(prov, dict) and prov.get("source_sha256") == sha
          and isinstance(parity, dict) and bool(parity.get("passed")))
    return m if ok else None


def _cannot_export(gguf: Path, weights: str, budget_s: float | None = None, cache_dir: Path | None = None
                   ) -> str | None:
    """Why `weights` should not be exported here (None: go): an architecture our builder does not emit, an artifact
    that would take more than half the memory available now, or an export estimated over a quarter of the plan's
    budget (EXPORT_S_PER_MPARAM)."""
    from ..models.families import SUPPORTED_ARCHS
    try:
        model = open_gguf(gguf, cache_dir)
        model.tokenizer_spec()  # the artifact carries our tokenizer
    except UnsupportedModelError as e:  # no family module, or a tokenizer we do not build: llama.cpp only
        return str(e)
    if model.config.arch not in SUPPORTED_ARCHS:
        return f"our ONNX builder does not emit the {model.config.arch} architecture"
    n_params = sum(int(np.prod(shape)) for shape in model.config.tensor_names().values())
    need = n_params * _BYTES_PER_WEIGHT.get(weights, 4.0)
    avail = _available_memory()
    if avail is not None and need > avail / 2:
        return f"it needs about {need / 1e9:.1f} GB, half the available memory is {avail / 2e9:.1f} GB"
    seconds = n_params / 1e6 * EXPORT_S_PER_MPARAM
    if budget_s is not None and seconds > budget_s / 4:
        return (f"about {seconds:.0f} s for {n_params / 1e9:.2f}B parameters, beyond this plan's budget of "
                f"{budget_s:.0f} s (`specedge plan MODEL --full` exports and measures every format)")
    return None


def _export_seconds(gguf: Path, weights: str) -> float | None:
    """The estimated seconds of an export (EXPORT_S_PER_MPARAM; None when the file cannot be read)."""
    try:
        n_params = sum(int(np.prod(shape)) for shape in open_gguf(gguf).config.tensor_names().values())
    except Exception:  # noqa: BLE001 - only an estimate for a message
        return None
    return n_params / 1e6 * EXPORT_S_PER_MPARAM


def _available_memory() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def export_onnx(gguf: Path, out: Path, weights: str, threads: int | None, log: Log, cache_dir: Path | None = None
                ) -> Path:
    """Export the GGUF to a parity-gated ONNX artifact at `out` (staged, then published atomically)."""
    from ..export.onnx_export import WeightFormat, export_gguf_to_onnx
    from ..export.publish import publish, stage_dir
    seconds = _export_seconds(gguf, weights)
    log(f"plan: exporting {out.name} (ONNX {weights}, parity-gated; once"
        + (f"; about {seconds:.0f} s)" if seconds is not None else ")"))
    t0 = time.perf_counter()
    stage = stage_dir(out)
    try:
        export_gguf_to_onnx(open_gguf(gguf, cache_dir), stage, WeightFormat(weights), threads=threads)
        publish(stage, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    log(f"plan: exported {out.name} ({time.perf_counter() - t0:.0f} s)")
    return out


def _vocab_fingerprint(path: Path) -> str:
    """runtime.tokenizer.vocab_fingerprint of a GGUF's vocabulary and merges, read from its metadata: what our
    Tokenizer and llama.cpp's give for a byte-level BPE vocabulary, and defined for files either cannot read."""
    from ..runtime.tokenizer import vocab_fingerprint
    fields = open_any_gguf(path).fields("tokenizer.ggml.")
    tokens = fields.get("tokenizer.ggml.tokens") or []
    return vocab_fingerprint({str(t): i for i, t in enumerate(tokens)},
                             [str(m) for m in fields.get("tokenizer.ggml.merges") or []])


def draft_models(target_gguf: Path, cache_dir: Path | None) -> list[str]:
    """`model:<name>` for every pulled catalogue model smaller than the target whose tokenizer is the target's."""
    size = Path(target_gguf).stat().st_size
    mine = None
    out = []
    for entry in CATALOG.values():
        if entry.kind != "generation":
            continue
        path = cached_path(entry, cache_dir)
        if path is None or path.stat().st_size >= size:
            continue
        try:
            mine = mine or _vocab_fingerprint(target_gguf)
            if _vocab_fingerprint(path) == mine:
                out.append(f"model:{entry.name}")
        except (ValueError, OSError):
            continue
    return out


def plain_kernels(engine: str, plain_only: bool) -> bool:
    """Whether plain decoding on this engine runs its faster non-batch-invariant kernels (registry plain_kernels:
    llama.cpp without flash attention, 8% faster one-token steps measured on 2 AVX2 cores), where no drafter will
    verify batches."""
    return plain_only and info(engine).plain_kernels


def measure_targets(targets: list[PlanTarget], settings: PlanSettings, threads: int, *,
                    cache_dir: Path | None = None, force: bool = False, log: Log = lambda m: None,
                    started: float | None = None) -> tuple[list[PlanTarget], list[PlanRow], str]:
    """The targets that loaded (one that cannot: a line says why, the others go on), every one's plan rows (plain
    and the best k of each drafter), its profile measured or read from cache, and why the head-to-head rounds say
    the machine's speed changed while they ran ("" if they agree). With a budget (settings.budget_s, counted from
    `started`), each target's measurement gets an equal share of what is left after a HEAD_TO_HEAD_SHARE reserve."""
    started = time.perf_counter() if started is None else started
    budget = settings.budget_s
    bar = _bar(settings.progress)
    say = (lambda m: bar.write(m, file=sys.stderr)) if settings.progress else log
    per_target: list[list[PlanRow]] = []
    models: list[LoadedModel] = []  # kept for the head-to-head runs
    kept: list[PlanTarget] = []
    try:
        for n_left, t in zip(range(len(targets), 0, -1), targets):
            engine = info(t.engine)
            try:
                loaded = load_model(t.path, engine.kind, threads=threads, cache_dir=cache_dir, device="cpu",
                                    log=say)
            except (ValueError, RuntimeError, ImportError, ModelFileError) as e:  # e.g. a file its gate refuses
                say(f"plan: {t.label} not planned: {e}")
                continue
            specs = candidate_specs(loaded, [])
            if engine.draft_models:
                specs += draft_models(Path(t.path), cache_dir)
            if not loaded.backend.caps.batch_invariant:  # the plan is lossless: speculation only where it is exact
                say(f"plan: {t.label} at {threads} threads is not batch-invariant (speculation would not be "
                    "token-identical to plain greedy): plain only, with its plain-decoding kernels; --threads 1 "
                    "makes its speculation exact")
                specs = []
                if plain_kernels(t.engine, True):
                    del loaded
                    loaded = load_model(t.path, engine.kind, threads=threads, cache_dir=cache_dir,
                                        device="cpu", exact_batches=False)
            bar.total = (bar.total or 0) + measure_steps(len(specs), settings.measure)
            bar.set_description(f"plan: measuring {t.label}")
            bar.refresh()
            measure = settings.measure
            if budget is not None:
                left = budget * (1 - HEAD_TO_HEAD_SHARE) - (time.perf_counter() - started)
                share = max(left, 5.0) / n_left
                if not specs and n_left > 1:  # plain only: the head-to-head rounds measure it again
                    share /= 2
                measure = replace(measure, budget_s=share)
            profile, _ = load_or_measure(loaded, t.label, specs, threads=threads, device="cpu", cache_dir=cache_dir,
                                         force=force, settings=measure, log=lambda m: None,
                                         step=lambda _: bar.update(1))
            models.append(loaded)
            kept.append(t)
            per_target.append(target_rows(t, profile, specs))
            if specs and plain_kernels(t.engine, True):  # its plain row runs other kernels: measured as a target
                variant = _plain_kernels_target(t, engine, threads, cache_dir, force, measure, say)
                if variant is not None:
                    kept.append(variant[0])
                    models.append(variant[1])
                    per_target.append(variant[2])
            bar.n = bar.total
            bar.refresh()
        drift = ""
        if len(kept) > 1:
            bar.set_description("plan: engines head to head")
            seconds = None if budget is None else budget * HEAD_TO_HEAD_SHARE
            per_target, drift = head_to_head(kept, models, per_target, say, seconds)
    finally:
        models.clear()
        bar.close()
    if not kept:
        raise ValueError("no engine could run this model here (each target's reason is above)")
    for t, target_rows_ in zip(kept, per_target):
        best = max(target_rows_, key=lambda r: r.predicted_tok_s)
        say(f"plan: {t.label}: plain {target_rows_[0].predicted_tok_s:.1f} tok/s, best {best.describe()} "
            f"{best.predicted_tok_s:.1f} tok/s")
    return kept, [r for target_rows_ in per_target for r in target_rows_], drift


def _plain_kernels_target(t: PlanTarget, engine, threads: int, cache_dir: Path | None, force: bool,
                          measure: MeasureSettings, say: Log) -> tuple[PlanTarget, LoadedModel, list[PlanRow]] | None:
    """A batch-invariant target's plain decoding on the engine's plain kernels (registry plain_kernels: ik_llama.cpp
    with its weights repacked), which a plain choice on that engine runs (apply_plan): measured plain only, on a
    budget half the target's. None where they are the exact kernels for this file (ik: nothing to repack, or its
    gate found the repacked weights unfaithful)."""
    try:
        loaded = load_model(t.path, engine.kind, threads=threads, cache_dir=cache_dir, device="cpu",
                            exact_batches=False)
    except (ValueError, RuntimeError, ImportError, ModelFileError) as e:
        say(f"plan: {t.label} {engine.plain_kernels} not planned: {e}")
        return None
    if loaded.backend.caps.batch_invariant:
        return None
    variant = PlanTarget(t.engine, t.path, f"{t.label} {engine.plain_kernels}")
    if measure.budget_s is not None:
        measure = replace(measure, budget_s=measure.budget_s / 2)
    profile, _ = load_or_measure(loaded, variant.label, [], threads=threads, device="cpu", cache_dir=cache_dir,
                                 force=force, settings=measure, log=lambda m: None)
    return variant, loaded, target_rows(variant, profile, [])


HEAD_TO_HEAD = MeasureSettings(prompts=3, max_tokens=48, prompt_tokens=256)  # plain runs, 2 rounds
PREFILL_X = 4.0  # a prompt prefills about this many times faster per token than decoding (2 CPU cores, llama.cpp)


def head_to_head(targets: list[PlanTarget], models: list[LoadedModel], per_target: list[list[PlanRow]], say: Log,
                 seconds: float | None = None) -> tuple[list[list[PlanRow]], str]:
    """Put the targets on one time base: profiles measured minutes apart (or cached from another day) see a shared
    machine at different speeds, so every target decodes the same prompts plainly, interleaved, in two rounds (the
    second in reverse order, so a drift hits all alike), and each target's rows are scaled by its head-to-head
    plain speed over its profile's. Example: llama.cpp's profile says plain 97 tok/s, ONNX int4's 76; head to head
    they run 80 and 70: llama.cpp's rows x 0.82, ONNX's x 0.92. The two rounds of a target disagreeing by more than
    contention.DRIFT means the machine's speed changed while they ran: returned as the second value ('the rounds
    disagreed by 31% (... ran 60.1 then 41.5 tok/s)'), "" if none did. `seconds`: about how long the rounds may take (the tokens per prompt shrink for slow targets)."""
    from .profile_measure import dev_prompts, run_rounds
    prompts = dev_prompts(HEAD_TO_HEAD.prompts)
    tokens = [HEAD_TO_HEAD.max_tokens] * len(targets)
    prompt_tokens = HEAD_TO_HEAD.prompt_tokens
    if seconds is not None:  # each target's share of the rounds at its profiled plain speed, its prefill counted
        prompt_tokens = min(prompt_tokens, 48)
        per = seconds / (2 * len(targets) * len(prompts))
        tokens = [int(min(HEAD_TO_HEAD.max_tokens, max(8, (per - prompt_tokens / (PREFILL_X * tok_s)) * tok_s / 1.5)))
                  for tok_s in (max(rows[0].predicted_tok_s, 1e-3) for rows in per_target)]
    speeds: list[list[float]] = [[] for _ in targets]
    timed: list[float] = [float("inf")] * len(targets)  # the shorter round's decode time per target
    for order in (range(len(targets)), reversed(range(len(targets)))):
        for i in order:
            run = run_rounds(models[i], None, prompts, 0, tokens[i], prompt_tokens)
            speeds[i].append(float(run.tokens_per_s))
            timed[i] = min(timed[i], run.decode_s)
    out, drift = [], []
    for t, rows, s, secs in zip(targets, per_target, speeds, timed):
        now, profiled = float(np.mean(s)), rows[0].predicted_tok_s
        scale = now / profiled if profiled > 0 and now > 0 else 1.0
        say(f"plan: {t.label}: plain {now:.1f} tok/s head to head (profile {profiled:.1f}; rows x {scale:.2f})")
        out.append([replace(r, predicted_tok_s=r.predicted_tok_s * scale) for r in rows])
        if secs >= MIN_DRIFT_S and drifted(*s):  # rounds of a few ms (tiny models) are all noise
            drift.append((abs(s[0] - s[1]) / max(s), f"{t.label} ran {s[0]:.1f} then {s[1]:.1f} tok/s"))
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
                    exact_batches=not plain_kernels(row.engine, row.plain))
    decode = replace(decode, drafter=parse_drafter(row.drafter), k=max(row.k, 1), adaptive_k=row.adaptive)
    return model, decode
