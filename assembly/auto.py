"""Auto-tuning for the apps: load (or measure and cache) the device profile of a target and pick the drafter and k
with the most expected tokens/s (perf/profile.py). Used by `generate/chat --auto` (via cli.setup) and by
`specedge bench --profile-device / --auto` (apps/bench_cmd.py).

Profiles live at <model cache>/profiles/<key>.json; the key covers the model file (or artifact manifest), backend,
its engine version, threads and device. A missing, stale or corrupt profile is re-measured (for a 135M model on 2
cores about 20 s plus 25 s per draft model candidate: each drafter decodes the profile prompts twice, at fixed k and
with the adaptive length), with a message on stderr saying why.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from ..models.catalog import file_sha256, heads_dir, model_cache_dir
from .measured import recorded, watch
from .notice import Measuring
from .environment import environment
from .profile import (PLAIN, PROFILES, Choice, DeviceProfile, choose, k_label, load_profile, model_fingerprint,
                      profile_key, profile_path)
from .profile_measure import MeasureSettings, measure, warm_page_cache
from ..runtime.backends import BackendKind, Kernels, info
from ..runtime.cores import default_threads
from .load import DrafterKind, LoadedModel, load_model, make_drafter, parse_drafter

if TYPE_CHECKING:
    from .decoder import DecodeSettings, ModelSettings

Log = Callable[[str], None]
SELFSPEC_DEFAULT = "skip:2"  # tried on targets that run layer plans (numpy, layered ONNX artifacts)


@dataclass
class Tuned:
    """One target's profile (where it is cached) and the configuration chosen from it."""

    label: str  # backend[:model] as given to bench --targets
    profile: DeviceProfile
    path: Path
    choice: Choice


def engine_version(kind: BackendKind) -> str | None:
    return info(kind).version()


def candidate_specs(target: LoadedModel, requested: Sequence[str], cache_dir: Path | None = None) -> list[str]:
    """Drafters worth measuring on this target: ngram, the requested ones (tree drafters and 'none' dropped: plain
    is always a candidate; trees are not tuned here), layer skip where the backend runs layer plans, and there the
    trained heads made for this very file (trained_heads)."""
    specs = ["ngram"]
    for text in requested:
        spec = parse_drafter(text)
        if spec.kind not in (DrafterKind.NONE, DrafterKind.RECYCLE) and not spec.is_tree and text not in specs:
            specs.append(text)
    if target.backend.caps.layer_plan and SELFSPEC_DEFAULT not in specs:
        specs.append(SELFSPEC_DEFAULT)
    for s in quantized_self_drafters(target):  # alone and behind prompt lookup (the best measured on fp32 SmolLM2)
        specs += [x for x in (s, f"{s}+lookup") if x not in specs]
    if target.backend.caps.layer_plan:  # the head drafter reads the verify forward's taps
        specs += [x for x in trained_heads(target.path, cache_dir) if x not in specs]
    return specs


def trained_heads(gguf: Path, cache_dir: Path | None) -> list[str]:
    """`head:<dir>` for every trained head in the heads cache (models.catalog.heads_dir) whose head.json names this
    GGUF's SHA-256: a head is measured only on the file it was trained on."""
    root = heads_dir(cache_dir)
    if not Path(gguf).is_file() or not root.is_dir():
        return []
    mine, out = None, []
    for meta in sorted(root.glob("*/head.json")):
        try:
            target = json.loads(meta.read_text()).get("target", {})
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(target, dict) and target.get("gguf_sha256"):
            mine = mine or file_sha256(gguf)
            if target["gguf_sha256"] == mine and (meta.parent / "head.npz").is_file():
                out.append(f"head:{meta.parent}")
    return out


def quantized_self_drafters(target: LoadedModel) -> list[str]:
    """`model:<dir>` for every int4/int8 dynamic ONNX artifact beside a float ONNX target that was exported from the
    same source file (provenance source_sha256): the same weights with 8-bit activations, the most accepted drafter
    measured for float targets (README, "Drafters": 1.42x on SmolLM2 fp32, 1.58x behind prompt lookup)."""
    manifest = target.manifest
    if manifest is None or manifest.weight_format not in ("fp32", "fp16"):
        return []
    source = manifest.raw.get("provenance", {}).get("source_sha256")
    found = []
    for path in sorted(Path(manifest.root).resolve().parent.glob("*/manifest.json")):
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if (source and raw.get("provenance", {}).get("source_sha256") == source and raw.get("profile") == "dynamic"
                and raw.get("weight_format") in ("int4", "int8") and path.parent != Path(manifest.root).resolve()):
            found.append(f"model:{path.parent}")
    return found


def profile_device(kernels: Kernels) -> str:
    """The device a CPU engine's profile is keyed by: "cpu" for its exact kernels, "cpu:fast-plain-only" for its fast
    ones (profiles cached before the Kernels enum, keyed "cpu:plain-kernels", are not found and so re-measured)."""
    return "cpu" if kernels is Kernels.EXACT else f"cpu:{kernels.value}"


def load_or_measure(target: LoadedModel, label: str, specs: Sequence[str], *, threads: int | None, device: str,
                    cache_dir: Path | None, ctx: int | None = None, force: bool = False,
                    settings: MeasureSettings = MeasureSettings(), log: Log = lambda m: None,
                    step: Log = lambda m: None) -> tuple[DeviceProfile, Path]:
    """The cached profile when it is valid for this target and covers `specs`; else measure (all of `specs` plus
    what the old profile had), cache and return it. force=True always re-measures. `step` is called after each
    part of a measurement (profile_measure.measure_steps(len(specs), settings) calls; none when cached)."""
    device = device if info(target.kind).devices else profile_device(target.kernels)
    threads = default_threads(threads)  # the backends' default: `generate` without --threads shares
    # the profile `bench --threads N` measured when N is that default
    fingerprint = model_fingerprint(target.path)
    key = profile_key(fingerprint, target.kind.value, threads, device, engine_version(target.kind))
    path = profile_path(model_cache_dir(cache_dir), key)
    old, why = (None, "re-measuring as asked (--profile-device)") if force else load_profile(path, key)
    if old is not None:
        missing = [s for s in specs if s not in old.drafters]
        if not missing:
            return old, path
        why = f"the device profile {path} has no measurements for {missing}"
        specs = list(old.drafters) + missing
    about = settings.budget_s if settings.budget_s is not None else 20 + 15 * len(specs)
    log(Measuring(f"{why}: measuring {label} (T(n), drafters {', '.join(specs)}; each drafter decodes "
                  f"{settings.prompts} prompts twice; about {about:.0f} s for a small model on 2 cores, once, then "
                  "cached; --drafter and --k instead of --auto skip it)"))
    drafters = {s: make_drafter(parse_drafter(s), target, ctx=ctx, threads=threads, cache_dir=cache_dir,
                                device=device) for s in specs}
    warm_page_cache(Path(target.path))  # the first round must not be the one that reads the weights from disk
    with watch(threads) as w:
        fields = measure(target, drafters, settings, log=log, step=step)
    profile = DeviceProfile(key=key, target=label, backend=target.kind.value, model=str(target.path),
                            fingerprint=fingerprint, threads=threads, device=device,
                            machine={**environment(threads), "load": recorded(w.load)},
                            created=time.strftime("%Y-%m-%d %H:%M:%S"), **fields)
    # a measurement taken while another process used the CPU says nothing about the engine: used, not cached
    PROFILES.keep(profile.to_dict(), path, w.load, log=log, subject=f"device profile of {label}")
    return profile, path


def auto_settings(model: "ModelSettings", decode: "DecodeSettings", target: LoadedModel, log: Log
                  ) -> "DecodeSettings":
    """generate/chat --auto: the decode settings (drafter, k, fixed or adaptive) from this target's profile; the
    requested drafter (if not ngram/none) is measured as a candidate too. Prints the choice to stderr."""
    from dataclasses import replace
    specs = candidate_specs(target, [str(decode.drafter)], model.cache_dir)
    profile, path = load_or_measure(target, f"{model.backend.value}:{model.model}", specs, threads=model.threads,
                                    device=model.device, cache_dir=model.cache_dir, ctx=model.ctx, log=log)
    choice = choose(profile, specs)
    log(f"--auto: {choice.describe()}; profile {path}")
    return replace(decode, drafter=parse_drafter(choice.drafter),
                   k=choice.k if choice.drafter != PLAIN else decode.k, adaptive_k=choice.adaptive)


def tune_targets(targets: Sequence[str], drafters: Sequence[str], *, model: str, threads: int | None, ctx: int,
                 cache_dir: Path | None, force: bool, log: Log) -> list[Tuned]:
    """bench --profile-device / --auto: per target, its profile (measured when forced, missing or stale) and the
    chosen configuration. Each target is loaded for the measurement and released before the next."""
    from .spec import parse_target
    out = []
    for label in targets:
        kind, name = parse_target(label, model)
        target = load_model(name, kind, ctx=ctx, threads=threads, cache_dir=cache_dir, device="cpu")
        specs = candidate_specs(target, drafters, cache_dir)
        profile, path = load_or_measure(target, label, specs, threads=threads, device="cpu", cache_dir=cache_dir,
                                        ctx=ctx, force=force, log=log)
        del target
        out.append(Tuned(label, profile, path, choose(profile, specs)))
    return out


def profile_rows(tuned: Sequence[Tuned]) -> list[dict]:
    """JSON-ready summaries (results.json 'profiles', profiles.json): the curve, drafter stats and the choice."""
    rows = []
    for t in tuned:
        p, c = t.profile, t.choice
        rows.append({"target": t.label, "key": p.key, "path": str(t.path), "ctx": p.ctx, "verify_s": p.verify_s,
                     "overhead_s": p.overhead_s, "plain_tok_s_measured": p.plain_tok_s_measured,
                     "prompt_tok_s_measured": p.prompt_tok_s_measured,
                     "drafters": {k: {"accept": d.accept, "draft_fixed_s": d.draft_fixed_s,
                                      "draft_per_token_s": d.draft_per_token_s, "tok_s_measured": d.tok_s_measured,
                                      "tok_s_adaptive": d.tok_s_adaptive, "tau_adaptive": d.tau_adaptive}
                                  for k, d in p.drafters.items()},
                     "choice": {"drafter": c.drafter, "k": c.k, "adaptive": c.adaptive,
                                "predicted_tok_s": c.predicted_tok_s,
                                "plain_predicted_tok_s": c.plain_tok_s}})
    return rows


def choice_table(tuned: Sequence[Tuned]) -> str:
    """Markdown: per target, T(n)/T(1), the best k (fixed or adaptive) per drafter and the chosen configuration."""
    lines = ["| target | T(n)/T(1), n = 1.. | best per drafter (predicted tok/s) | chosen | predicted tok/s | "
             "plain predicted |", "|---|---|---|---|---|---|"]
    for t in tuned:
        v = t.profile.verify_s
        best: dict[str, tuple[str, float]] = {}
        for c in t.choice.candidates:
            if c.drafter != PLAIN and c.tok_s > best.get(c.drafter, ("", 0.0))[1]:
                best[c.drafter] = (k_label(c.k, c.adaptive), c.tok_s)
        per = ", ".join(f"{d} {k} ({r:.1f})" for d, (k, r) in best.items())
        ch = t.choice
        chosen = "plain" if ch.drafter == PLAIN else f"{ch.drafter} {k_label(ch.k, ch.adaptive)}"
        lines.append(f"| {t.label} | {' '.join(f'{x / v[0]:.2f}' for x in v)} | {per} | {chosen} | "
                     f"{ch.predicted_tok_s:.1f} | {ch.plain_tok_s:.1f} |")
    return "\n".join(lines) + "\n"
