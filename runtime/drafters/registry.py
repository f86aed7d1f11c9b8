"""The drafter registry: one builder per DrafterKind, from a typed spec (spec.py) and what the assembly layer loaded.

    build_drafter(spec, DrafterInputs(target, draft, corrections)) -> Drafter | None   (None: plain decoding)

No file I/O and no model loading here: the assembly layer (assembly/load.py) loads what `spec.needs_draft` /
`spec.needs_corrections` / `spec.needs_head` ask for and passes it in. Start-up checks run here: the target's
capabilities (spec.backend_needs, then the built drafter's `check`), and each drafter's own argument checks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..backends.base import Backend
from ..loradrop import Corrections
from .base import BackendNeed, Drafter, check_backend
from .dytree import DynamicTreeDrafter
from .early_exit import DelDrafter, EarlyExitDrafter
from .head import HeadDrafter, default_precision
from .head_model import HeadModel, TargetEmbedding
from .layerskip import LayerSkipDrafter, SwiftDrafter
from .lookup import LookupModelDrafter
from .loradrop import LoRADropDrafter
from .model import ModelDrafter
from .ngram import NgramDrafter
from .recycle import RecycleDrafter
from .spec import DrafterKind, DrafterSpec, HeadSpec, ModelSpec, SuffixSpec
from .suffix import LongerDrafter, SuffixDrafter, SuffixTreeDrafter
from .suffix_index import SuffixMemory


@dataclass(frozen=True, eq=False)
class DraftModel:
    """A loaded draft model: its backend, the name the spec gave it, VocabTrim ids (int32 [N], logits [T, N]) when
    its head is trimmed, and the positions its cache holds (None: the backend's context)."""

    backend: Backend
    name: str
    vocab_ids: np.ndarray | None = None
    max_len: int | None = None


@dataclass(frozen=True, eq=False)
class LoadedHead:
    """A draft head read and checked against the target (head_model.py), and the target's token embedding."""

    model: HeadModel
    embedding: TargetEmbedding


@dataclass(frozen=True, eq=False)
class DrafterInputs:
    """What the assembly layer filled in for a spec: the target backend, and a draft model / corrections / a draft
    head when the spec needs them."""

    target: Backend
    draft: DraftModel | None = None
    corrections: Corrections | None = None
    head: LoadedHead | None = None


def check_target(spec: DrafterSpec, target: Backend) -> None:
    """The start-up checks that need no built drafter (tree masks, drop steps): run them before loading anything.
    Layer plans are checked on the built drafter, whose name the message gives."""
    check_backend(target, spec.backend_needs - {BackendNeed.LAYER_PLAN}, str(spec))


def build_drafter(spec: DrafterSpec, inputs: DrafterInputs) -> Drafter | None:
    """requires: inputs.draft when spec.needs_draft, inputs.corrections when spec.needs_corrections.
    returns: the spec's drafter, checked against inputs.target (ValueError naming the fix otherwise); None for
    plain decoding."""
    if spec.needs_draft and inputs.draft is None:
        raise ValueError(f"drafter {spec}: needs a loaded draft model (DrafterInputs.draft)")
    if spec.needs_corrections and inputs.corrections is None:
        raise ValueError(f"drafter {spec}: needs LoRA-Drop corrections (DrafterInputs.corrections)")
    if spec.needs_head and inputs.head is None:
        raise ValueError(f"drafter {spec}: needs a loaded draft head (DrafterInputs.head)")
    check_target(spec, inputs.target)
    drafter = BUILDERS[spec.kind](spec, inputs)
    if drafter is not None:
        drafter.check(inputs.target)
    return drafter


def model_drafter(draft: DraftModel, stop=None) -> ModelDrafter:
    """A ModelDrafter named as its spec wrote it (a trimmed head adds its vocabulary size)."""
    trim = "" if draft.vocab_ids is None else f" (vocab {len(draft.vocab_ids)})"
    return ModelDrafter(draft.backend, max_len=draft.max_len, name=f"model:{draft.name}{trim}", stop=stop,
                        vocab_ids=draft.vocab_ids)


def _model(spec: ModelSpec, inputs: DrafterInputs) -> Drafter:
    if spec.tree:
        return DynamicTreeDrafter(model_drafter(inputs.draft), spec.tree)
    drafter = model_drafter(inputs.draft, spec.stop.build() if spec.stop else None)
    return _with_memory(LookupModelDrafter(drafter, spec.lookup) if spec.lookup else drafter, spec.suffix)


def _with_memory(drafter: Drafter, budget: int | None) -> Drafter:
    """'+suffix[:<budget>]': the suffix drafter with a fresh memory of `budget` tokens first, the longer draft."""
    return drafter if budget is None else LongerDrafter(SuffixDrafter(SuffixMemory(budget)), drafter)


def _head(spec: HeadSpec, inputs: DrafterInputs) -> Drafter:
    drafter = HeadDrafter(inputs.head.model, inputs.head.embedding, name=f"head:{spec.dir}",
                          precision=default_precision())
    return _with_memory(drafter, spec.suffix)


def _suffix(spec: SuffixSpec) -> Drafter:
    chain = SuffixDrafter(SuffixMemory(spec.budget))
    return SuffixTreeDrafter(chain, spec.tree) if spec.tree else chain


def _stop(spec: DrafterSpec):
    """A fresh draft-stop policy from the spec's suffix, or None."""
    return spec.stop.build() if spec.stop else None


BUILDERS: dict[DrafterKind, Callable[[DrafterSpec, DrafterInputs], Drafter | None]] = {
    DrafterKind.NONE: lambda spec, inputs: None,
    DrafterKind.NGRAM: lambda spec, inputs: _with_memory(NgramDrafter(), spec.suffix),
    DrafterKind.RECYCLE: lambda spec, inputs: RecycleDrafter(inputs.target.config.vocab_size, spec.nodes),
    DrafterKind.MODEL: _model,
    DrafterKind.SKIP: lambda spec, inputs: LayerSkipDrafter(spec.ratio, _stop(spec)),
    DrafterKind.SWIFT: lambda spec, inputs: SwiftDrafter(_stop(spec)),
    DrafterKind.EXIT: lambda spec, inputs: EarlyExitDrafter(spec.layer, _stop(spec)),
    DrafterKind.DEL: lambda spec, inputs: DelDrafter(_stop(spec)),
    DrafterKind.LORADROP: lambda spec, inputs: LoRADropDrafter(inputs.corrections),
    # one memory per built drafter: per loaded model, shared by every call of its decoder (the server's included)
    DrafterKind.SUFFIX: lambda spec, inputs: _suffix(spec),
    DrafterKind.HEAD: _head,
}
