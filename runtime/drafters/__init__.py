"""Drafters (runtime/drafters/base.py: the seam), their typed specs (spec.py) and the registry that builds them
(registry.py)."""
from .base import BackendNeed, Drafter, DrafterCaps, TreeDrafter
from .registry import BUILDERS, DraftModel, DrafterInputs, LoadedHead, build_drafter, check_target
from .spec import (DelSpec, DrafterKind, DrafterSpec, ExitSpec, HeadSpec, LoraDropSpec, ModelSpec, NgramSpec,
                   NoneSpec, RecycleSpec, SkipSpec, SuffixSpec, SwiftSpec, parse_drafter)

__all__ = ["BackendNeed", "Drafter", "DrafterCaps", "TreeDrafter", "BUILDERS", "DraftModel", "DrafterInputs",
           "LoadedHead", "build_drafter", "check_target", "DelSpec", "DrafterKind", "DrafterSpec", "ExitSpec",
           "HeadSpec", "LoraDropSpec", "ModelSpec", "NgramSpec", "NoneSpec", "RecycleSpec", "SkipSpec", "SuffixSpec",
           "SwiftSpec", "parse_drafter"]
