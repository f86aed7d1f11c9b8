"""Load a model and its drafter for the apps: catalogue name or path -> GGUF -> tokenizer + backend."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from ..models.catalog import resolve_model
from ..export.gguf_in import GGUFModel, open_gguf
from ..runtime.backends import Backend, BackendKind, open_backend
from ..runtime.drafters.base import Drafter
from ..runtime.drafters.model import ModelDrafter
from ..runtime.drafters.ngram import NgramDrafter
from ..runtime.tokenizer import Tokenizer
from ..runtime.types import SamplingParams


@dataclass
class LoadedModel:
    path: Path
    gguf: GGUFModel
    tokenizer: Tokenizer
    backend: Backend
    kind: BackendKind


def load_model(name_or_path: str, kind: BackendKind, *, ctx: int | None = None, threads: int | None = None,
               cache_dir: Path | None = None) -> LoadedModel:
    path = resolve_model(name_or_path, cache_dir)
    gguf = open_gguf(path)
    tokenizer = Tokenizer(gguf.tokenizer_spec())
    backend = open_backend(kind, gguf, n_ctx=ctx, n_threads=threads)
    return LoadedModel(path, gguf, tokenizer, backend, kind)


class DrafterKind(enum.Enum):
    NONE = "none"
    NGRAM = "ngram"
    MODEL = "model"


@dataclass(frozen=True)
class DrafterSpec:
    kind: DrafterKind
    model: str | None = None  # catalogue name or GGUF path for DrafterKind.MODEL

    @classmethod
    def parse(cls, text: str) -> "DrafterSpec":
        """'none' | 'ngram' | 'model:<name-or-path>'."""
        head, _, arg = text.partition(":")
        try:
            kind = DrafterKind(head)
        except ValueError:
            raise ValueError(f"unknown drafter {text!r}; use none, ngram or model:<name-or-path>") from None
        if (kind is DrafterKind.MODEL) != bool(arg):
            raise ValueError(f"drafter {text!r}: only 'model' takes an argument, as model:<name-or-path>")
        return cls(kind, arg or None)


def make_drafter(spec: DrafterSpec, target: LoadedModel, params: SamplingParams, *, ctx: int | None = None,
                 threads: int | None = None, cache_dir: Path | None = None) -> Drafter | None:
    """Build the drafter; a draft model must share the target's tokenizer (checked here, at start-up)."""
    if spec.kind is DrafterKind.NONE:
        return None
    if spec.kind is DrafterKind.NGRAM:
        return NgramDrafter()
    path = resolve_model(spec.model, cache_dir)
    if path.resolve() == target.path.resolve() and target.kind is BackendKind.NUMPY:
        # The NumPy backend holds any number of caches over one copy of the weights.
        return ModelDrafter(target.backend, params, max_len=ctx, name=f"model:{spec.model}")
    draft = load_model(str(path), target.kind, ctx=ctx, threads=threads, cache_dir=cache_dir)
    if draft.tokenizer.fingerprint() != target.tokenizer.fingerprint():
        raise ValueError(f"the draft model {spec.model} has a different tokenizer from the target {target.path.name}; "
                         "speculative decoding needs identical vocabularies: pick a drafter from the same family")
    return ModelDrafter(draft.backend, params, max_len=ctx, name=f"model:{spec.model}")
