"""Load a model and its drafter for the apps.

    GGUF backends (numpy, llamacpp): catalogue name or .gguf path -> GGUF -> tokenizer + backend
    onnx: an exported directory, or a name like smollm2-135m-onnx-int8 found in the model cache (where
          `specedge export` writes by default) -> manifest (hashes verified, parity gate passed) -> tokenizer.json
          + chat template from the artifact + the backend for the manifest's format and profile (ours, its
          static-shape profile, or optimum's layout)
    drafter model:<artifact> on an artifact exported with --drafter-vocab N runs its trimmed decoder (VocabTrim,
          runtime/vocab_trim.py): logits over N ids, mapped back to full-vocabulary ids by ModelDrafter
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..models.catalog import model_cache_dir, resolve_model
from ..models.errors import ModelFileError
from ..models.manifest import MANIFEST, PAD_ROW_ATTENTION, Profile, read_manifest
from ..models.gguf_in import GGUFModel, open_gguf
from ..runtime.backends import Backend, BackendKind, open_backend, open_onnx
from ..runtime.backends.base import require_tree
from ..runtime.draft_stop import parse_stop
from ..runtime.drafters.base import Drafter
from ..runtime.drafters.early_exit import DelDrafter, EarlyExitDrafter
from ..runtime.drafters.layerskip import LayerSkipDrafter, SwiftDrafter
from ..runtime.drafters.model import ModelDrafter
from ..runtime.drafters.ngram import NgramDrafter
from ..runtime.drafters.recycle import RecycleDrafter
from ..runtime.drafters.selfspec import require_layered
from ..runtime.tokenizer import Tokenizer
from ..runtime.vocab_trim import drafter_manifest, read_drafter_vocab
from ..runtime.types import SamplingParams


@dataclass
class LoadedModel:
    path: Path  # the GGUF file, or the artifact directory for onnx
    gguf: GGUFModel | None  # None for onnx
    tokenizer: Tokenizer
    backend: Backend
    kind: BackendKind
    vocab_ids: np.ndarray | None = None  # int32 [N] when the backend is a VocabTrim drafter graph (logits [T, N])


def artifact_name(model: str, weights: str, via: str = "specedge", profile: Profile = Profile.DYNAMIC) -> str:
    """The cache name `specedge export` gives an artifact: smollm2-135m + int8 -> smollm2-135m-onnx-int8 (static
    profile: smollm2-135m-onnx-static-int8, layered: -onnx-layered-int8); a checkpoint directory by its name
    (path/SmolLM2-135M + fp32 -> SmolLM2-135M-onnx-fp32; via optimum: -optimum-fp32)."""
    p = Path(model)
    base = p.stem if model.endswith(".gguf") else p.resolve().name if p.is_dir() else model
    infix = "" if profile is Profile.DYNAMIC else f"{profile.value}-"
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
    return LoadedModel(root, None, tokenizer, backend, BackendKind.ONNX, None if vocab is None else vocab.ids)


def _artifact_tokenizer(root: Path, manifest) -> Tokenizer:
    try:
        return Tokenizer(manifest.tokenizer_spec())
    except ModelFileError:
        raise
    except ValueError as e:  # tokenizer.json that `tokenizers` cannot load (its hash matched: written that way)
        raise ModelFileError(f"{root}: {e}") from None


def load_model(name_or_path: str, kind: BackendKind, *, ctx: int | None = None, threads: int | None = None,
               cache_dir: Path | None = None, device: str = "auto", log=None) -> LoadedModel:
    if kind is BackendKind.ONNX:
        return load_onnx(name_or_path, device=device, threads=threads, cache_dir=cache_dir, log=log)
    if device not in ("auto", "cpu"):
        raise ValueError(f"--device {device} applies to --backend onnx; the {kind.value} backend runs on the CPU")
    if Path(name_or_path).is_dir():
        if (Path(name_or_path) / "config.json").is_file() and not (Path(name_or_path) / MANIFEST).is_file():
            raise ValueError(f"{name_or_path} is a Hugging Face checkpoint: export it with `specedge export "
                             f"{name_or_path} --format onnx` and run the result with --backend onnx")
        raise ValueError(f"{name_or_path} is a directory (an exported artifact?): use --backend onnx")
    path = resolve_model(name_or_path, cache_dir)
    gguf = open_gguf(path)
    tokenizer = Tokenizer(gguf.tokenizer_spec())
    backend = open_backend(kind, gguf, n_ctx=ctx, n_threads=threads)
    return LoadedModel(path, gguf, tokenizer, backend, kind)


class DrafterKind(enum.Enum):
    NONE = "none"
    NGRAM = "ngram"
    MODEL = "model"
    RECYCLE = "recycle"  # token recycling trees (needs a backend with tree masks)
    SKIP = "skip"  # balanced layer skip at speed ratio R (ALGORITHMS.md 2.3)
    SWIFT = "swift"  # on-the-fly skip-set search (2.3)
    EXIT = "exit"  # early exit at layer l (2.4)
    DEL = "del"  # exit layer and draft length from shadow tokens (2.4)
    LORADROP = "loradrop"  # self-speculative LoRA-Drop (2.5); optional argument: a fitted corrections directory


_ARG = {DrafterKind.MODEL: "model:<name-or-path>", DrafterKind.SKIP: "skip:<R>", DrafterKind.EXIT: "exit:<layer>"}
_STOPS = ("conf", "logistic")


@dataclass(frozen=True)
class DrafterSpec:
    kind: DrafterKind
    model: str | None = None  # DrafterKind.MODEL: catalogue name or GGUF path; an exported artifact for onnx
    value: float | None = None  # skip: the speed ratio R; exit: the exit layer; recycle: the tree's node count
    stop: str | None = None  # a draft-stop policy for drafters with q (runtime/draft_stop.py), from a '+' suffix
    tree: int | None = None  # model drafters: draft a dynamic tree of this many nodes ('+tree[:<nodes>]')
    lookup: int | None = None  # model drafters: prompt lookup first, matches of >= this many tokens ('+lookup[:<n>]')

    @classmethod
    def parse(cls, text: str) -> "DrafterSpec":
        """'none' | 'ngram' | 'model:<name-or-path>' | 'recycle[:<nodes>]' | 'skip:<R>' | 'swift' | 'exit:<layer>' |
        'del' | 'loradrop[:<corrections-dir>]', optionally followed by '+<stop>' (model and self-speculative
        drafters): +conf, +conf:<t>, +logistic, +logistic:<h>; or, for a model drafter, '+tree[:<nodes>]' (a dynamic
        draft tree, runtime/drafters/dytree.py) or '+lookup[:<n>]' (prompt lookup first, the model when no n-token
        match exists, runtime/drafters/lookup.py)."""
        body, plus, stop = text.rpartition("+")
        if plus and stop.partition(":")[0] == "tree":
            return cls._tree(text, body, stop.partition(":")[2])
        if plus and stop.partition(":")[0] == "lookup":
            return cls._lookup(text, body, stop.partition(":")[2])
        if not plus or stop.partition(":")[0] not in _STOPS:
            body, stop = text, None
        head, _, arg = body.partition(":")
        try:
            kind = DrafterKind(head)
        except ValueError:
            raise ValueError(f"unknown drafter {text!r}; use none, ngram, recycle[:nodes], model:<name-or-path>, "
                             "skip:<R>, swift, exit:<layer>, del or loradrop[:<corrections-dir>]") from None
        if kind is DrafterKind.LORADROP:
            if stop is not None:
                raise ValueError(f"drafter {text!r}: the loradrop drafter takes no draft stop; drop the +{stop}")
            return cls(kind, arg or None)  # optional: a fitted corrections directory
        if kind is DrafterKind.RECYCLE:
            if arg and not arg.isdigit():
                raise ValueError(f"drafter {text!r}: the recycle tree size is a node count, as recycle:16")
            if stop is not None:
                raise ValueError(f"drafter {text!r}: recycle drafts trees without probabilities; drop the +{stop}")
            return cls(kind, None, int(arg) if arg else 16)
        if (kind in _ARG) != bool(arg):
            raise ValueError(f"drafter {text!r}: only {', '.join(_ARG.values())} (and recycle:<nodes>) take an "
                             "argument")
        if stop is not None:
            if kind in (DrafterKind.NONE, DrafterKind.NGRAM):
                raise ValueError(f"drafter {text!r}: a draft stop needs a drafter with probabilities (model, skip, "
                                 "swift, exit, del)")
            parse_stop(stop)  # fails here, at start-up
        if kind is DrafterKind.MODEL:
            return cls(kind, arg, stop=stop)
        value = None
        if arg:
            try:
                value = int(arg) if kind is DrafterKind.EXIT else float(arg)
            except ValueError:
                raise ValueError(f"drafter {text!r}: expected {_ARG[kind]} with a number") from None
        return cls(kind, None, value, stop)

    @classmethod
    def _tree(cls, text: str, body: str, nodes: str) -> "DrafterSpec":
        spec = cls.parse(body)
        if spec.kind is not DrafterKind.MODEL or spec.stop is not None:
            raise ValueError(f"drafter {text!r}: +tree[:<nodes>] follows a model drafter without a draft stop, as "
                             "model:<name>+tree:16")
        if nodes and not (nodes.isdigit() and 1 <= int(nodes) <= 256):
            raise ValueError(f"drafter {text!r}: the tree size is a node count in 1..256, as +tree:16")
        return cls(spec.kind, spec.model, tree=int(nodes) if nodes else 16)

    @classmethod
    def _lookup(cls, text: str, body: str, n: str) -> "DrafterSpec":
        spec = cls.parse(body)
        if spec.kind is not DrafterKind.MODEL or spec.tree:
            raise ValueError(f"drafter {text!r}: +lookup[:<n>] follows a chain model drafter, as "
                             "model:<name>+lookup:2")
        if n and not (n.isdigit() and 1 <= int(n) <= 3):
            raise ValueError(f"drafter {text!r}: the lookup match length is 1, 2 or 3 tokens, as +lookup:2")
        return cls(spec.kind, spec.model, stop=spec.stop, lookup=int(n) if n else 2)

    def __str__(self) -> str:
        """The canonical --drafter text: parse(str(spec)) == spec."""
        if self.kind is DrafterKind.MODEL:
            tail = f"+tree:{self.tree}" if self.tree else f"+lookup:{self.lookup}" if self.lookup else ""
            return f"model:{self.model}{'+' + self.stop if self.stop else ''}{tail}"
        if self.kind is DrafterKind.LORADROP:
            return f"loradrop:{self.model}" if self.model else "loradrop"
        if self.kind is DrafterKind.RECYCLE:
            return f"recycle:{self.nodes}"
        arg = "" if self.value is None else f":{int(self.value) if self.kind is DrafterKind.EXIT else self.value:g}"
        return f"{self.kind.value}{arg}{'+' + self.stop if self.stop else ''}"

    @property
    def nodes(self) -> int:
        """DrafterKind.RECYCLE: the tree template's node count."""
        return int(self.value) if self.value is not None else 16


parse_drafter = DrafterSpec.parse


def batch_invariance_warning(backend: Backend, cpu_flags: Sequence[str]) -> str | None:
    """Why greedy speculative output may differ from plain greedy on this artifact and CPU (None: it may not).

    An int4 artifact whose pad row runs through attention only (exported before io.pad_row) gives one-token calls a
    4-bit MatMulNBits with one row, which on CPUs without AVX-512 takes onnxruntime's M == 1 kernel and rounds
    differently from a verify call's rows (docs/onnx.md "Batch invariance")."""
    manifest = getattr(backend, "manifest", None)
    if manifest is None or manifest.pad_row != PAD_ROW_ATTENTION or "avx512f" in cpu_flags:
        return None
    if not any(str(t.get("storage", "")).startswith("nbits4") for t in manifest.tensors.values()):
        return None
    return (f"{manifest.root.name} was exported before the pad row ran through the whole network: on this CPU (no "
            "AVX-512) its 4-bit matmuls round one-token calls differently from verify calls, so greedy speculative "
            "output may differ from plain greedy; re-export it with `specedge export`")


def make_drafter(spec: DrafterSpec, target: LoadedModel, params: SamplingParams, *, ctx: int | None = None,
                 threads: int | None = None, cache_dir: Path | None = None, device: str = "auto") -> Drafter | None:
    """Build the drafter; a draft model runs on the target's backend kind and must share its tokenizer (checked
    here, at start-up)."""
    if spec.kind is DrafterKind.NONE:
        return None
    if spec.kind is DrafterKind.NGRAM:
        return NgramDrafter()
    if spec.kind is DrafterKind.RECYCLE:
        require_tree(target.backend)  # at start-up
        return RecycleDrafter(target.backend.config.vocab_size, spec.nodes)
    stop = parse_stop(spec.stop) if spec.stop else None
    selfspec = {DrafterKind.SKIP: lambda: LayerSkipDrafter(spec.value, params, stop),
                DrafterKind.SWIFT: lambda: SwiftDrafter(params, stop),
                DrafterKind.EXIT: lambda: EarlyExitDrafter(int(spec.value), params, stop),
                DrafterKind.DEL: lambda: DelDrafter(params, stop)}
    if spec.kind in selfspec:
        drafter = selfspec[spec.kind]()
        require_layered(target.backend, drafter.name)  # at start-up, not at the first bind
        return drafter
    if spec.kind is DrafterKind.LORADROP:
        from ..runtime.drafters.loradrop import LoRADropDrafter
        from .loradrop import load_corrections
        return LoRADropDrafter(load_corrections(spec.model, target), params)
    if spec.tree:
        require_tree(target.backend)  # at start-up: the target verifies the tree
        from ..runtime.drafters.dytree import DynamicTreeDrafter
        return DynamicTreeDrafter(_model_drafter(spec, target, params, None, ctx=ctx, threads=threads,
                                                 cache_dir=cache_dir, device=device), spec.tree)
    drafter = _model_drafter(spec, target, params, stop, ctx=ctx, threads=threads, cache_dir=cache_dir, device=device)
    if spec.lookup:
        from ..runtime.drafters.lookup import LookupModelDrafter
        return LookupModelDrafter(drafter, spec.lookup)
    return drafter


def _model_drafter(spec: DrafterSpec, target: LoadedModel, params: SamplingParams, stop, *, ctx, threads, cache_dir,
                   device) -> ModelDrafter:
    if target.kind is BackendKind.NUMPY and resolve_model(spec.model, cache_dir).resolve() == target.path.resolve():
        # The NumPy backend holds any number of caches over one copy of the weights.
        return ModelDrafter(target.backend, params, max_len=ctx, name=f"model:{spec.model}", stop=stop)
    if target.kind is BackendKind.ONNX:  # a --drafter-vocab artifact drafts with its trimmed head
        draft = load_onnx(spec.model, device=device, threads=threads, cache_dir=cache_dir, trimmed=True)
    else:
        draft = load_model(spec.model, target.kind, ctx=ctx, threads=threads, cache_dir=cache_dir, device=device)
    if draft.tokenizer.fingerprint() != target.tokenizer.fingerprint():
        raise ValueError(f"the draft model {spec.model} has a different tokenizer from the target {target.path.name}; "
                         "speculative decoding needs identical vocabularies: pick a drafter from the same family")
    trim = "" if draft.vocab_ids is None else f" (vocab {len(draft.vocab_ids)})"
    return ModelDrafter(draft.backend, params, max_len=ctx, name=f"model:{spec.model}{trim}", stop=stop,
                        vocab_ids=draft.vocab_ids)
