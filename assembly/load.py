"""Load a model and its drafter for the apps.

    engine_for: the engine a model names (an exported artifact -> onnx, a catalogue name or GGUF -> llamacpp);
          load_model with kind=None follows it, an explicit kind is honoured exactly
    GGUF backends (numpy, llamacpp): catalogue name or .gguf path -> GGUF -> tokenizer + backend; llama.cpp also
          runs files our code cannot read (no family module: models/gguf_any.MetadataGGUF; a tokenizer we do not
          build) with llama.cpp's own tokenizer (caps.own_tokenizer)
    onnx: an exported directory, or a name like smollm2-135m-onnx-int8 found in the model cache (where
          `specedge export` writes by default) -> manifest (hashes verified, parity gate passed) -> tokenizer.json
          + chat template from the artifact + the backend for the manifest's format and profile (ours, its
          static-shape profile, or optimum's layout)
    drafter model:<artifact> on an artifact exported with --drafter-vocab N runs its trimmed decoder (VocabTrim,
          runtime/vocab_trim.py): logits over N ids, mapped back to full-vocabulary ids by ModelDrafter
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..models.catalog import file_sha256, model_cache_dir, resolve_model
from ..models.errors import ModelFileError, UnsupportedModelError
from ..models.gguf_any import MetadataGGUF, open_any_gguf
from ..models.manifest import MANIFEST, Manifest, Profile, read_manifest
from ..models.gguf_in import GGUFModel, open_gguf
from ..models import hub
from ..models.ref import RefKind, model_ref
from ..runtime.backends import (Backend, BackendKind, GateTuning, Kernels, OpenSettings, Opens, TokenizingBackend,
                                Variance, artifact_engine, default_gguf_engine, describe_gpu_layers, info, open_backend,
                                open_onnx)
from ..runtime.drafters import (Drafter, DrafterInputs, DrafterKind, DrafterSpec, DraftModel, LoadedHead,  # noqa: F401
                                ModelSpec, build_drafter, check_target, parse_drafter)  # re-exported for the apps
from ..runtime.drafters.head_model import HeadModel, TargetEmbedding
from ..runtime.tokenizer import TextTokenizer, Tokenizer
from ..runtime.vocab_trim import drafter_manifest, read_drafter_vocab


@dataclass
class LoadedModel:
    path: Path  # the GGUF file, or the artifact directory for onnx
    gguf: GGUFModel | MetadataGGUF | None  # None for onnx; MetadataGGUF: no family module (llama.cpp only)
    tokenizer: TextTokenizer  # ours (runtime.tokenizer.Tokenizer), or llama.cpp's for files we cannot tokenize
    backend: Backend
    kind: BackendKind
    vocab_ids: np.ndarray | None = None  # int32 [N] when the backend is a VocabTrim drafter graph (logits [T, N])
    manifest: Manifest | None = None  # onnx: the artifact's manifest, read and verified once by load_onnx
    kernels: Kernels = Kernels.EXACT  # FAST_PLAIN_ONLY: opened with its fast kernels, plain decoding only


def artifact_name(model: str, weights: str, via: str = "specedge", profile: Profile = Profile.DYNAMIC,
                  gpu: bool = False) -> str:
    """The cache name `specedge export` gives an artifact: smollm2-135m + int8 -> smollm2-135m-onnx-int8 (static
    profile: smollm2-135m-onnx-static-int8, layered: -onnx-layered-int8, the dynamic profile's GPU graph:
    -onnx-gpu-fp16); a checkpoint directory by its name (path/SmolLM2-135M + fp32 -> SmolLM2-135M-onnx-fp32; via
    optimum: -optimum-fp32)."""
    p = Path(model)
    base = (hub.base_name(model) if hub.is_hub_ref(model) else p.stem if model.endswith(".gguf")
            else p.resolve().name if p.is_dir() else model)
    infix = "gpu-" if gpu else "" if profile is Profile.DYNAMIC else f"{profile.value}-"
    return f"{base}-{'optimum' if via == 'optimum' else 'onnx'}-{infix}{weights}"


def resolve_artifact(name_or_path: str, cache_dir: Path | None = None) -> Path:
    """An exported directory as given, else `<model cache>/<name>`; ModelFileError with what to run otherwise."""
    p = Path(name_or_path)
    if p.is_dir():
        return p
    cached = model_cache_dir(cache_dir) / str(name_or_path)
    if (cached / MANIFEST).is_file():
        return cached
    hint = (f"{name_or_path} is a GGUF file: export it first with `specedge export {name_or_path} --format onnx`"
            if p.suffix == ".gguf" else
            f"no exported ONNX model {name_or_path!r} (not a directory, not in {cached.parent}); run `specedge "
            f"export MODEL --format onnx --weights int8` (it writes {artifact_name('MODEL', 'int8')} to the cache)")
    raise ModelFileError(hint)


def load_onnx(name_or_path: str, *, device: str = "auto", threads: int | None = None,
              cache_dir: Path | None = None, log=None, trimmed: bool = False) -> LoadedModel:
    """Manifest -> verified files -> parity gate recorded as passed -> tokenizer + the backend for its format and
    profile (OnnxBackend, StaticOnnxBackend for the static-shape profile, OptimumBackend for `--via optimum`).
    trimmed=True: the artifact's VocabTrim drafter graph when it has one (vocab_ids set), else the model."""
    root = resolve_artifact(name_or_path, cache_dir)
    manifest = read_manifest(root, verify=True)
    parity = manifest.raw.get("parity")
    if isinstance(parity, dict) and parity.get("pending"):  # written before the gate runs, replaced by its numbers
        raise ModelFileError(f"{root} is an unfinished export (stopped before its parity gate finished); "
                             "re-export the model with `specedge export`")
    if isinstance(parity, dict) and not parity.get("passed", False):
        raise ModelFileError(f"{root} failed its parity gate at export (top-1 {parity.get('top1', 0):.2%}, max "
                             f"|dlogit| {parity.get('max_dlogit')}); re-export in another --weights format")
    if manifest.raw.get("tokenizer") is None:
        raise ModelFileError(f"{root}/{MANIFEST} lists no tokenizer; re-export the model with `specedge export`")
    vocab = read_drafter_vocab(manifest) if trimmed else None
    if vocab is not None:
        manifest = drafter_manifest(manifest, vocab)
    tokenizer = _artifact_tokenizer(root, manifest)
    backend = open_onnx(manifest, device=device, threads=threads, log=log)  # by the manifest's format and profile
    return LoadedModel(root, None, tokenizer, backend, artifact_engine().kind, None if vocab is None else vocab.ids,
                       manifest)


def _artifact_tokenizer(root: Path, manifest) -> Tokenizer:
    try:
        return Tokenizer(manifest.tokenizer_spec())
    except ModelFileError:
        raise
    except ValueError as e:  # tokenizer.json that `tokenizers` cannot load (its hash matched: written that way)
        raise ModelFileError(f"{root}: {e}") from None


def engine_for(name_or_path: str, cache_dir: Path | None = None) -> BackendKind:
    """The engine a model names (models/ref.py, the backend registry): an exported artifact runs on the artifact
    engine (ONNX Runtime), a catalogue name, GGUF file or hub GGUF on the default GGUF engine (llama.cpp).
    ModelFileError for a Hugging Face checkpoint (export it first) and for what model_ref refuses."""
    ref = model_ref(name_or_path, cache_dir)
    if ref.kind is RefKind.CHECKPOINT:
        raise ModelFileError(ref.export_hint())
    return (default_gguf_engine() if ref.gguf else artifact_engine()).kind


def load_model(name_or_path: str, kind: BackendKind | None = None, *, ctx: int | None = None,
               threads: int | None = None, cache_dir: Path | None = None, device: str = "auto",
               log=None, kernels: Kernels = Kernels.EXACT, gpu_layers: int | None = None) -> LoadedModel:
    """The model on `kind`'s engine exactly as asked; kind=None: the engine the model names (engine_for).
    kernels FAST_PLAIN_ONLY: plain decoding only, on an engine with fast kernels (registry fast_kernels; ValueError
    on one without); a drafter on it warns.
    gpu_layers: llama.cpp's layers on a GPU (None: all where the build offloads, else 0; BackendInfo.gpu_layers)."""
    engine = info(kind if kind is not None else engine_for(name_or_path, cache_dir))
    layers = engine.gpu_layers(gpu_layers)  # a request it cannot honour fails here, before anything loads
    if kernels is Kernels.FAST_PLAIN_ONLY and engine.fast_kernels is None:
        raise ValueError(f"the {engine.name} backend has no faster plain-decoding kernels: open it with "
                         "Kernels.EXACT")
    if engine.opens is Opens.ARTIFACT:
        return load_onnx(name_or_path, device=device, threads=threads, cache_dir=cache_dir, log=log)
    if device not in ("auto", "cpu"):
        raise ValueError(f"--device {device} applies to --backend onnx; the {engine.value} backend runs on the CPU")
    try:
        ref = model_ref(name_or_path, cache_dir)
    except ModelFileError:  # nothing we know: resolve_model says what it looked for
        ref = None
    if ref is not None and ref.kind is RefKind.CHECKPOINT:
        raise ValueError(ref.export_hint())
    if ref is not None and ref.kind is RefKind.ARTIFACT:
        where = "directory" if Path(name_or_path).is_dir() else "in the cache"
        raise ValueError(f"{name_or_path} is an exported artifact {where}: the {engine.value} backend runs GGUF "
                         "files; use --backend onnx, or leave --backend out (the engine follows the model)")
    path = resolve_model(name_or_path, cache_dir)
    # an engine that reads any GGUF runs files without a family module as metadata only (gguf_any)
    gguf = open_any_gguf(path, cache_dir) if engine.reads_any_gguf else open_gguf(path, cache_dir)
    try:
        tokenizer: TextTokenizer | None = Tokenizer(gguf.tokenizer_spec())
    except UnsupportedModelError:  # no family, or a tokenizer we do not build: the engine's own, if it has one
        if not engine.reads_any_gguf:
            raise
        tokenizer = None
    if engine.check is not None:  # a file the engine cannot run is refused before any gate or load
        engine.check(gguf)
    tuning = GateTuning()
    if engine.gated:  # the file's gate, measured once and cached: faithful call size, batch invariance
        from .engine_gate import engine_gate
        gate = engine_gate(path, engine, threads=threads, cache_dir=cache_dir, log=log or (lambda m: None))
        if not gate.passed:
            raise ModelFileError(gate.summary())
        tuning = GateTuning(gate.max_call, gate.invariant, gate.plain_faithful)
    backend = open_backend(engine.kind, gguf, OpenSettings(ctx, threads, kernels, layers, tuning))
    if layers and log:
        log(f"{engine.name}: {describe_gpu_layers(layers, gguf.config.n_layers)} (--gpu-layers 0 keeps them on the "
            "CPU)")
    if tokenizer is None:
        tokenizer = _engine_tokenizer(backend, gguf)
    return LoadedModel(path, gguf, tokenizer, backend, engine.kind, kernels=kernels)


def model_tokenizer(name_or_path: str, cache_dir: Path | None = None) -> TextTokenizer:
    """The tokenizer a model runs with, without loading its weights: an exported artifact's, or a GGUF's
    (gguf_tokenizer). ModelFileError / FileNotFoundError naming what is missing."""
    ref = model_ref(name_or_path, cache_dir)
    if ref.kind is RefKind.ARTIFACT:
        root = resolve_artifact(name_or_path, cache_dir)
        return _artifact_tokenizer(root, read_manifest(root, verify=False))
    if ref.kind is RefKind.CHECKPOINT:
        raise ValueError(ref.export_hint())
    return gguf_tokenizer(resolve_model(name_or_path, cache_dir), cache_dir)


def gguf_tokenizer(path: Path, cache_dir: Path | None = None) -> TextTokenizer:
    """The tokenizer load_model gives a GGUF on llama.cpp, without loading the weights: ours (cached in the model
    cache `cache_dir` when built from a large vocabulary), or llama.cpp's (vocabulary only) for a file our code
    cannot tokenize."""
    gguf = open_any_gguf(path, cache_dir)
    try:
        return Tokenizer(gguf.tokenizer_spec())
    except UnsupportedModelError:
        from ..runtime.backends.llamacpp import vocab_tokenizer
        return vocab_tokenizer(path, gguf.chat_template, _merges(gguf))


def _merges(gguf: GGUFModel | MetadataGGUF) -> list[str]:
    return [str(m) for m in gguf.fields("tokenizer.ggml.merges").get("tokenizer.ggml.merges") or []]


def _engine_tokenizer(backend: Backend, gguf: GGUFModel | MetadataGGUF) -> TextTokenizer:
    """The backend's own tokenizer (caps.own_tokenizer: llama.cpp) with the file's chat template and merges."""
    if not backend.caps.own_tokenizer or not isinstance(backend, TokenizingBackend):
        raise ModelFileError(f"{gguf.path}: our tokenizer cannot read this file and the {backend.name} backend has "
                             "none of its own; use --backend llamacpp")
    return backend.tokenizer(gguf.chat_template, _merges(gguf))


def batch_variance(model: LoadedModel) -> Variance | None:
    """Why greedy speculative output may differ from plain greedy on this model as loaded, and the fix (None: it
    may not): what its backend declares in caps.variance (llama.cpp's thread count or GPU layers, fast kernels, an
    ik gate's probe, an ONNX GPU graph run at each call's width or an old int4 artifact on a CPU without AVX-512)."""
    return model.backend.caps.variance


def batch_invariance_warning(model: LoadedModel) -> str | None:
    """batch_variance in one line, naming the model's file (None: greedy speculation is token-identical here)."""
    variance = batch_variance(model)
    return None if variance is None else variance.warning(model.path.name)


def make_drafter(spec: DrafterSpec, target: LoadedModel, *, ctx: int | None = None, threads: int | None = None,
                 cache_dir: Path | None = None, device: str = "auto") -> Drafter | None:
    """Load what the spec needs (a draft model on the target's backend kind, sharing its tokenizer; LoRA-Drop
    corrections; a draft head) and build the drafter through the registry (runtime/drafters/registry.py); checked
    here, at start-up. Drafters take each call's SamplingParams in `propose`."""
    check_target(spec, target.backend)  # before loading anything (tree masks, drop steps)
    draft = _draft_model(spec, target, ctx=ctx, threads=threads, cache_dir=cache_dir, device=device) \
        if spec.needs_draft else None
    corrections = None
    if spec.needs_corrections:
        from .loradrop import load_corrections
        corrections = load_corrections(spec.dir, target)
    head = load_head(spec.dir, target) if spec.needs_head else None
    return build_drafter(spec, DrafterInputs(target.backend, draft, corrections, head))


def load_head(path: str, target: LoadedModel) -> LoadedHead:
    """A draft head directory checked against the target (shape, taps, the GGUF's SHA-256 when head.json names
    one), with the target's token embedding read from its GGUF (rows dequantized on demand)."""
    if not isinstance(target.gguf, GGUFModel):
        raise ValueError(f"the head drafter reads the target's token embedding from its GGUF file, and "
                         f"{target.path.name} was not opened from one we read; run a GGUF model with --backend native "
                         "(or --backend numpy)")
    head = HeadModel.load(path)
    head.check_target(target.backend.config, lambda: file_sha256(target.path))
    return LoadedHead(head, TargetEmbedding.from_gguf(target.gguf))


def _draft_model(spec: ModelSpec, target: LoadedModel, *, ctx, threads, cache_dir, device) -> DraftModel:
    engine = info(target.kind)
    if engine.many_caches and resolve_model(spec.model, cache_dir).resolve() == target.path.resolve():
        # a backend that holds any number of caches over one copy of the weights drafts with itself
        return DraftModel(target.backend, spec.model, max_len=ctx)
    if engine.opens is Opens.ARTIFACT:  # a --drafter-vocab artifact drafts with its trimmed head
        draft = load_onnx(spec.model, device=device, threads=threads, cache_dir=cache_dir, trimmed=True)
    else:
        draft = load_model(spec.model, target.kind, ctx=ctx, threads=threads, cache_dir=cache_dir, device=device)
    if draft.tokenizer.vocab_size != target.tokenizer.vocab_size:
        raise ValueError(f"the draft model {spec.model} has a different tokenizer from the target {target.path.name} "
                         f"(a vocabulary of {draft.tokenizer.vocab_size} tokens, the target's "
                         f"{target.tokenizer.vocab_size}); speculative decoding needs identical vocabularies: pick a "
                         "drafter from the same family")
    if draft.tokenizer.fingerprint() != target.tokenizer.fingerprint():
        raise ValueError(f"the draft model {spec.model} has a different tokenizer from the target {target.path.name}; "
                         "speculative decoding needs identical vocabularies: pick a drafter from the same family")
    return DraftModel(draft.backend, spec.model, draft.vocab_ids, ctx)
