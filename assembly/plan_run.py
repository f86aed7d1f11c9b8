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
target (assembly/auto.py), so a plan re-made after a package upgrade re-measures, but adding a target does not
re-measure the others.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..models.catalog import CATALOG, cached_path, file_sha256, model_cache_dir, resolve_model
from ..models.gguf_in import open_gguf
from ..models.errors import ModelFileError, UnsupportedModelError
from ..models.gguf_any import open_any_gguf
from ..models.manifest import FORMAT, MANIFEST, PAD_ROW_NONE, Manifest, Profile, read_manifest
from ..runtime.backends import BackendKind
from .auto import candidate_specs, load_or_measure
from .environment import environment
from .load import LoadedModel, artifact_name, engine_for, load_model, resolve_artifact
from .plan import Plan, PlanRow, PlanTarget, load_plan, new_plan, plan_key, plan_path, save_plan, target_rows
from .profile import model_fingerprint
from .profile_measure import MeasureSettings, measure_steps

if TYPE_CHECKING:
    from .decoder import DecodeSettings, ModelSettings

Log = Callable[[str], None]
PLAN_MEASURE = MeasureSettings(k_max=8, reps=5, prompts=6, max_tokens=64, prompt_tokens=256)
PLAN_WEIGHTS = ("int4", "int8")  # ONNX weight formats exported on demand for a GGUF model
_BYTES_PER_WEIGHT = {"int4": 0.6, "int8": 1.1, "fp16": 2.0, "fp32": 4.0}  # artifact bytes per parameter, about


@dataclass(frozen=True)
class PlanSettings:
    threads: int | None = None  # None: the backends' default, min(cpu count, 8)
    weights: tuple[str, ...] = field(default_factory=lambda: PLAN_WEIGHTS)  # ONNX formats exported on demand
    export: bool = True  # export missing artifacts (False: plan over what is cached)
    measure: MeasureSettings = field(default_factory=lambda: PLAN_MEASURE)
    progress: bool = True  # a progress bar on stderr


def resolved_threads(threads: int | None) -> int:
    return threads or min(os.cpu_count() or 1, 8)


def plan_for(model: str, settings: PlanSettings = PlanSettings(), *, cache_dir: Path | None = None,
             refresh: bool = False, log: Log = lambda m: None) -> tuple[Plan, bool]:
    """The cached plan for `model` on this machine, or a new one (measured now; `refresh` always re-measures).
    Returns (plan, made_now). Raises ValueError/ModelFileError naming the problem (no engine can run the model)."""
    threads = resolved_threads(settings.threads)
    artifact = engine_for(model, cache_dir) is BackendKind.ONNX
    source = resolve_artifact(model, cache_dir) if artifact else resolve_model(model, cache_dir)
    key = plan_key(model_fingerprint(source), threads, () if artifact else settings.weights)
    path = plan_path(model_cache_dir(cache_dir), key)
    if not refresh:
        plan, why = load_plan(path, key)
        if plan is not None:
            return plan, False
        log(f"plan: {why}; measuring this machine (first use; Ctrl-C skips, `--no-plan` never plans)")
    t0 = time.perf_counter()
    targets = discover_targets(model, settings, cache_dir=cache_dir, log=log)
    rows = measure_targets(targets, settings, threads, cache_dir=cache_dir, force=refresh, log=log)
    plan = new_plan(key, model, targets, rows, threads, environment(threads), time.perf_counter() - t0)
    save_plan(plan, path)
    log(f"plan saved to {path} ({plan.seconds:.0f} s)")
    return plan, True


def discover_targets(model: str, settings: PlanSettings, *, cache_dir: Path | None = None,
                     log: Log = lambda m: None) -> list[PlanTarget]:
    """The targets worth measuring for `model` (module docstring); each engine only where its package is
    installed. Raises ValueError when none is."""
    if engine_for(model, cache_dir) is BackendKind.ONNX:
        root = resolve_artifact(model, cache_dir)
        return [PlanTarget(BackendKind.ONNX.value, str(root), _artifact_label(read_manifest(root, verify=False)))]
    gguf = resolve_model(model, cache_dir)
    targets = []
    if importlib.util.find_spec("llama_cpp") is not None:
        targets.append(PlanTarget(BackendKind.LLAMACPP.value, str(gguf), f"llama.cpp {_gguf_type(gguf)}"))
    else:
        log("plan: llama-cpp-python is not installed (pip install 'specedge[llama]'): llama.cpp not planned")
    if importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnx") is None:
        log("plan: onnxruntime is not installed (pip install 'specedge[onnx]'): ONNX Runtime not planned")
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
            why = _cannot_export(gguf, w)
            if why:
                log(f"plan: not exporting {out.name}: {why}")
                continue
            try:
                export_onnx(gguf, out, w, settings.threads, log)
            except (ValueError, ImportError, RuntimeError) as e:
                log(f"plan: the {w} export failed, ONNX {w} not planned: {e}")
                continue
        if _plannable(out, sha, (Profile.DYNAMIC,)) is not None:
            found[out.resolve()] = PlanTarget(BackendKind.ONNX.value, str(out), f"onnx {w}")
    for root in sorted(m.parent for m in model_cache_dir(cache_dir).glob(f"*/{MANIFEST}")):  # other exports of it
        manifest = None if root.resolve() in found else _plannable(root, sha, (Profile.DYNAMIC, Profile.LAYERED))
        if manifest is not None:
            found[root.resolve()] = PlanTarget(BackendKind.ONNX.value, str(root), _artifact_label(manifest))
    return list(found.values())


def _artifact_label(manifest: Manifest) -> str:
    profile = "" if manifest.profile is Profile.DYNAMIC else f"{manifest.profile.value}-"
    return f"onnx {profile}{manifest.weight_format}"


def _gguf_type(path: Path) -> str:
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


def _cannot_export(gguf: Path, weights: str) -> str | None:
    """Why `weights` should not be exported here (None: go): an architecture our builder does not emit, or an
    artifact that would take more than half the memory available now."""
    from ..models.families import SUPPORTED_ARCHS
    try:
        model = open_gguf(gguf)
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
    return None


def _available_memory() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def export_onnx(gguf: Path, out: Path, weights: str, threads: int | None, log: Log) -> Path:
    """Export the GGUF to a parity-gated ONNX artifact at `out` (staged, then published atomically)."""
    from ..export.onnx_export import WeightFormat, export_gguf_to_onnx
    from ..export.publish import publish, stage_dir
    log(f"plan: exporting {out.name} (ONNX {weights}, parity-gated; once)")
    t0 = time.perf_counter()
    stage = stage_dir(out)
    try:
        export_gguf_to_onnx(open_gguf(gguf), stage, WeightFormat(weights), threads=threads)
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
    """Whether plain decoding on this engine runs its faster non-batch-invariant kernels: llama.cpp without flash
    attention (8% faster one-token steps measured on 2 AVX2 cores), where no drafter will verify batches."""
    return plain_only and engine == BackendKind.LLAMACPP.value


def measure_targets(targets: list[PlanTarget], settings: PlanSettings, threads: int, *,
                    cache_dir: Path | None = None, force: bool = False, log: Log = lambda m: None) -> list:
    """Every target's plan rows (plain and the best k of each drafter), its profile measured or read from cache."""
    bar = _bar(settings.progress)
    say = (lambda m: bar.write(m, file=sys.stderr)) if settings.progress else log
    per_target: list[list[PlanRow]] = []
    models: list[LoadedModel] = []  # kept for the head-to-head runs
    try:
        for t in targets:
            loaded = load_model(t.path, BackendKind(t.engine), threads=threads, cache_dir=cache_dir, device="cpu")
            specs = candidate_specs(loaded, [])
            if t.engine == BackendKind.LLAMACPP.value:
                specs += draft_models(Path(t.path), cache_dir)
            if not loaded.backend.caps.batch_invariant:  # the plan is lossless: speculation only where it is exact
                say(f"plan: {t.label} at {threads} threads is not batch-invariant (speculation would not be "
                    "token-identical to plain greedy): plain only, with its plain-decoding kernels; --threads 1 "
                    "makes its speculation exact")
                specs = []
                if plain_kernels(t.engine, True):
                    del loaded
                    loaded = load_model(t.path, BackendKind(t.engine), threads=threads, cache_dir=cache_dir,
                                        device="cpu", exact_batches=False)
            bar.total = (bar.total or 0) + measure_steps(len(specs), settings.measure)
            bar.set_description(f"plan: measuring {t.label}")
            bar.refresh()
            profile, _ = load_or_measure(loaded, t.label, specs, threads=threads, device="cpu", cache_dir=cache_dir,
                                         force=force, settings=settings.measure, log=lambda m: None,
                                         step=lambda _: bar.update(1))
            models.append(loaded)
            per_target.append(target_rows(t, profile, specs))
            bar.n = bar.total
            bar.refresh()
        if len(targets) > 1:
            bar.set_description("plan: engines head to head")
            per_target = head_to_head(targets, models, per_target, say)
    finally:
        models.clear()
        bar.close()
    for t, target_rows_ in zip(targets, per_target):
        best = max(target_rows_, key=lambda r: r.predicted_tok_s)
        say(f"plan: {t.label}: plain {target_rows_[0].predicted_tok_s:.1f} tok/s, best {best.describe()} "
            f"{best.predicted_tok_s:.1f} tok/s")
    return [r for target_rows_ in per_target for r in target_rows_]


HEAD_TO_HEAD = MeasureSettings(prompts=3, max_tokens=48, prompt_tokens=256)  # plain runs, 2 rounds


def head_to_head(targets: list[PlanTarget], models: list[LoadedModel], per_target: list[list[PlanRow]], say: Log
                 ) -> list[list[PlanRow]]:
    """Put the targets on one time base: profiles measured minutes apart (or cached from another day) see a shared
    machine at different speeds, so every target decodes the same prompts plainly, interleaved, in two rounds (the
    second in reverse order, so a drift hits all alike), and each target's rows are scaled by its head-to-head
    plain speed over its profile's. Example: llama.cpp's profile says plain 97 tok/s, ONNX int4's 76; head to head
    they run 80 and 70: llama.cpp's rows x 0.82, ONNX's x 0.92."""
    from dataclasses import replace
    from .profile_measure import dev_prompts, run_rounds
    prompts = dev_prompts(HEAD_TO_HEAD.prompts)
    speeds: list[list[float]] = [[] for _ in targets]
    for order in (range(len(targets)), reversed(range(len(targets)))):
        for i in order:
            run = run_rounds(models[i], None, prompts, 0, HEAD_TO_HEAD.max_tokens, HEAD_TO_HEAD.prompt_tokens)
            speeds[i].append(float(run.tokens_per_s))
    out = []
    for t, rows, s in zip(targets, per_target, speeds):
        now, profiled = float(np.mean(s)), rows[0].predicted_tok_s
        scale = now / profiled if profiled > 0 and now > 0 else 1.0
        say(f"plan: {t.label}: plain {now:.1f} tok/s head to head (profile {profiled:.1f}; rows x {scale:.2f})")
        out.append([replace(r, predicted_tok_s=r.predicted_tok_s * scale) for r in rows])
    return out


def _bar(enabled: bool):
    from tqdm import tqdm
    return tqdm(total=0, file=sys.stderr, disable=not enabled, unit="step", dynamic_ncols=True, desc="plan",
                bar_format="{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}]")


def wants_plan(*, backend=None, drafter=None, k=None, lossy=None, device: str = "auto", auto: bool = False,
               no_plan: bool = False) -> bool:
    """Plan only when nothing says what to run: any given backend, drafter, k, lossy mode, device (the plan
    measures the CPU), --auto (one engine's tuner) or no_plan is honoured instead."""
    return not no_plan and not auto and device == "auto" and all(x is None for x in (backend, drafter, k, lossy))


def planned(model: "ModelSettings", decode: "DecodeSettings", *, progress: bool = True, log: Log = lambda m: None
            ) -> tuple[Plan, "ModelSettings", "DecodeSettings"]:
    """The plan for model.model at model.threads (cached, or measured now) and the settings that run its choice:
    what generate/chat/serve and Engine(MODEL) do by default."""
    plan, _ = plan_for(model.model, PlanSettings(threads=model.threads, progress=progress),
                       cache_dir=model.cache_dir, log=log)
    return (plan, *apply_plan(plan, model, decode))


def apply_plan(plan: Plan, model: "ModelSettings", decode: "DecodeSettings"
               ) -> tuple["ModelSettings", "DecodeSettings"]:
    """The settings that run the plan's choice: its engine and artifact (ONNX on the CPU: the plan measured the
    CPU), its drafter, k and length policy; the caller's ctx, threads, cache and verifier are kept."""
    from dataclasses import replace
    from ..runtime.drafters import parse_drafter
    row = plan.choice
    model = replace(model, model=row.path, backend=BackendKind(row.engine),
                    device="cpu" if row.engine == BackendKind.ONNX.value else model.device,
                    exact_batches=not plain_kernels(row.engine, row.plain))
    decode = replace(decode, drafter=parse_drafter(row.drafter), k=max(row.k, 1), adaptive_k=row.adaptive)
    return model, decode
