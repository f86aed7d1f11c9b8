"""The targets a plan measures for a model (assembly/plan_run.py): every engine worth running it, the ONNX
artifacts exported on demand within the plan's budget, and the catalogue draft models that fit a GGUF target.

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

An export is skipped, with a line saying why, when it would need more than half the memory available or an
estimated quarter of the plan's budget (EXPORT_S_PER_MPARAM; SmolLM2-135M: about 15 s on 2 cores).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..models.catalog import CATALOG, cached_path, file_sha256, model_cache_dir, resolve_model
from ..models.errors import ModelFileError, UnsupportedModelError
from ..models.gguf_any import open_any_gguf
from ..models.gguf_in import open_gguf
from ..models.manifest import FORMAT, MANIFEST, PAD_ROW_NONE, Manifest, Profile, read_manifest
from ..models.ref import RefKind, model_ref
from ..runtime.backends import artifact_engine, gguf_engines
from .load import artifact_name
from .plan import PlanTarget

if TYPE_CHECKING:
    from .plan_run import PlanSettings

Log = Callable[[str], None]
EXPORT_S_PER_MPARAM = 0.12  # an ONNX export with its parity gate, seconds per million parameters (2 cores: SmolLM2
#                             135M about 15 s); an export estimated over a quarter of the budget is not made
_BYTES_PER_WEIGHT = {"int4": 0.6, "int8": 1.1, "fp16": 2.0, "fp32": 4.0}  # artifact bytes per parameter, about


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
