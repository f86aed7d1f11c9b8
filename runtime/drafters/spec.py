"""Drafter specs: the typed form of a `--drafter` string, one frozen dataclass per DrafterKind (a tagged union).

    parse_drafter(text) -> DrafterSpec        str(spec) -> the canonical text (parse_drafter(str(s)) == s)

Grammar: 'none' | 'ngram' | 'model:<name-or-path>' | 'recycle[:<nodes>]' | 'skip:<R>' | 'swift' | 'exit:<layer>' |
'del' | 'loradrop[:<corrections-dir>]' | 'suffix[:<budget>]' | 'head:<dir>', optionally followed by '+<stop>' (model and
self-speculative drafters): +conf, +conf:<t>, +logistic, +logistic:<h> (runtime/draft_stop.py StopSpec); or, for a
model drafter, '+tree[:<nodes>]' (a dynamic draft tree, runtime/drafters/dytree.py) or '+lookup[:<n>]' (prompt lookup
first, the model when no n-token match exists, runtime/drafters/lookup.py). A chain ngram, model or head drafter may end
in '+suffix[:<budget>]': the suffix drafter's memory of past answers first, the longer draft of the two
(runtime/drafters/suffix.py); <budget> is the memory's size in tokens (default 65536).
'suffix[:<budget>]+tree[:<nodes>]': the suffix drafter's trees (a target with tree masks).

Each spec declares what it needs: from the target backend (`backend_needs`: tree masks, layer plans, drop steps)
and from the assembly layer (`needs_draft`: a loaded draft model; `needs_corrections`: fitted LoRA-Drop
corrections). runtime/drafters/registry.py builds the drafter from a spec and those inputs.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import ClassVar

from ..draft_stop import StopKind, StopSpec, format_number
from .base import BackendNeed


class DrafterKind(enum.Enum):
    NONE = "none"
    NGRAM = "ngram"
    MODEL = "model"
    RECYCLE = "recycle"  # token recycling trees (needs a backend with tree masks)
    SKIP = "skip"  # balanced layer skip at speed ratio R (docs/algorithms.md 2.3)
    SWIFT = "swift"  # on-the-fly skip-set search (2.3)
    EXIT = "exit"  # early exit at layer l (2.4)
    DEL = "del"  # exit layer and draft length from shadow tokens (2.4)
    LORADROP = "loradrop"  # self-speculative LoRA-Drop (2.5); optional argument: a fitted corrections directory
    SUFFIX = "suffix"  # a memory of past answers (2.9); optional argument: its budget in tokens
    HEAD = "head"  # a trained draft head over the target's taps (runtime/drafters/head.py); argument: its directory


SUFFIX_BUDGET = 65536  # tokens a suffix drafter's memory holds by default (about 1.3 MB of index)
SUFFIX_BUDGETS = (256, 1 << 24)  # the budgets parse_drafter accepts


_LAYERED = frozenset({BackendNeed.LAYER_PLAN})


@dataclass(frozen=True)
class DrafterSpec:
    """The base of the spec union; `DrafterSpec.parse(text)` is `parse_drafter(text)`."""

    kind: ClassVar[DrafterKind]
    needs_draft: ClassVar[bool] = False  # the assembly layer loads a draft model (registry.DraftModel)
    needs_corrections: ClassVar[bool] = False  # the assembly layer loads LoRA-Drop corrections
    needs_head: ClassVar[bool] = False  # the assembly layer loads a draft head and the target's embedding

    @classmethod
    def parse(cls, text: str) -> "DrafterSpec":
        return parse_drafter(text)

    @property
    def backend_needs(self) -> frozenset[BackendNeed]:
        """What the target backend must support (checked at start-up)."""
        return frozenset()

    @property
    def is_tree(self) -> bool:
        """The drafter drafts token trees (tree rounds; not tuned by the auto-tuner)."""
        return False

    def __str__(self) -> str:
        return self.kind.value


def _suffix(stop: StopSpec | None) -> str:
    return "" if stop is None else f"+{stop}"


def _memory(budget: int | None) -> str:
    """The '+suffix[:<budget>]' a chain drafter's spec ends in (the default budget unwritten)."""
    return "" if budget is None else "+suffix" if budget == SUFFIX_BUDGET else f"+suffix:{budget}"


@dataclass(frozen=True)
class NoneSpec(DrafterSpec):
    """Plain decoding: no drafter."""
    kind: ClassVar[DrafterKind] = DrafterKind.NONE


@dataclass(frozen=True)
class NgramSpec(DrafterSpec):
    """Prompt lookup / n-gram drafter (docs/algorithms.md 2.6); `suffix`: a suffix memory of that many tokens
    combined with it (2.9), None: none."""
    kind: ClassVar[DrafterKind] = DrafterKind.NGRAM
    suffix: int | None = None

    def __str__(self) -> str:
        return f"ngram{_memory(self.suffix)}"


class _OptionalTree:
    """A spec drafting chains, or trees of `tree` nodes (then the target needs tree masks)."""
    tree: int | None

    @property
    def backend_needs(self) -> frozenset[BackendNeed]:
        return frozenset({BackendNeed.TREE_MASK}) if self.tree else frozenset()

    @property
    def is_tree(self) -> bool:
        return bool(self.tree)


@dataclass(frozen=True)
class SuffixSpec(_OptionalTree, DrafterSpec):
    """A memory of past answers: the suffix drafter (2.9) with a memory of `budget` tokens; `tree`: trees of that
    many nodes (None: chains)."""
    kind: ClassVar[DrafterKind] = DrafterKind.SUFFIX
    budget: int = SUFFIX_BUDGET
    tree: int | None = None

    def __str__(self) -> str:
        tree = f"+tree:{self.tree}" if self.tree else ""
        return ("suffix" if self.budget == SUFFIX_BUDGET else f"suffix:{self.budget}") + tree


@dataclass(frozen=True)
class RecycleSpec(DrafterSpec):
    """Token recycling trees of `nodes` nodes (2.7)."""
    kind: ClassVar[DrafterKind] = DrafterKind.RECYCLE
    nodes: int = 16

    @property
    def backend_needs(self) -> frozenset[BackendNeed]:
        return frozenset({BackendNeed.TREE_MASK})

    @property
    def is_tree(self) -> bool:
        return True

    def __str__(self) -> str:
        return f"recycle:{self.nodes}"


@dataclass(frozen=True)
class ModelSpec(_OptionalTree, DrafterSpec):
    """A separate draft model (2.1): `model` is a catalogue name or GGUF path (an exported artifact for onnx);
    optionally a draft stop, a dynamic tree of `tree` nodes, or prompt lookup first (matches of >= `lookup`); for a
    chain, `suffix`: a suffix memory of that many tokens combined with it (2.9)."""
    kind: ClassVar[DrafterKind] = DrafterKind.MODEL
    needs_draft: ClassVar[bool] = True
    model: str = ""
    stop: StopSpec | None = None
    tree: int | None = None
    lookup: int | None = None
    suffix: int | None = None

    def __str__(self) -> str:
        tree = f"+tree:{self.tree}" if self.tree else ""
        lookup = f"+lookup:{self.lookup}" if self.lookup else ""
        return f"model:{self.model}{_suffix(self.stop)}{tree}{lookup}{_memory(self.suffix)}"


@dataclass(frozen=True)
class HeadSpec(DrafterSpec):
    """A trained draft head in `dir` (head.json + head.npz) reading the target's taps; `suffix`: a suffix memory of
    that many tokens combined with it (2.9), None: none."""
    kind: ClassVar[DrafterKind] = DrafterKind.HEAD
    needs_head: ClassVar[bool] = True
    dir: str = ""
    suffix: int | None = None

    @property
    def backend_needs(self) -> frozenset[BackendNeed]:
        return frozenset({BackendNeed.TAPS})

    def __str__(self) -> str:
        return f"head:{self.dir}{_memory(self.suffix)}"


@dataclass(frozen=True)
class _LayeredSpec(DrafterSpec):
    """The self-speculative drafters that run the target's own layers: they need a backend with layer plans."""

    @property
    def backend_needs(self) -> frozenset[BackendNeed]:
        return _LAYERED


@dataclass(frozen=True)
class SkipSpec(_LayeredSpec):
    """Balanced layer skip at speed ratio R (2.3)."""
    kind: ClassVar[DrafterKind] = DrafterKind.SKIP
    ratio: float = 2.0
    stop: StopSpec | None = None

    def __str__(self) -> str:
        return f"skip:{format_number(self.ratio)}{_suffix(self.stop)}"


@dataclass(frozen=True)
class SwiftSpec(_LayeredSpec):
    """SWIFT's on-the-fly skip-set search (2.3)."""
    kind: ClassVar[DrafterKind] = DrafterKind.SWIFT
    stop: StopSpec | None = None

    def __str__(self) -> str:
        return f"swift{_suffix(self.stop)}"


@dataclass(frozen=True)
class ExitSpec(_LayeredSpec):
    """Early exit after `layer` layers (2.4)."""
    kind: ClassVar[DrafterKind] = DrafterKind.EXIT
    layer: int = 1
    stop: StopSpec | None = None

    def __str__(self) -> str:
        return f"exit:{self.layer}{_suffix(self.stop)}"


@dataclass(frozen=True)
class DelSpec(_LayeredSpec):
    """DEL: exit layer and draft length from shadow tokens (2.4)."""
    kind: ClassVar[DrafterKind] = DrafterKind.DEL
    stop: StopSpec | None = None

    def __str__(self) -> str:
        return f"del{_suffix(self.stop)}"


@dataclass(frozen=True)
class LoraDropSpec(DrafterSpec):
    """Self-speculative LoRA-Drop (2.5) with the corrections fitted in `dir` (None: pure reuse). Not to be confused
    with runtime/loradrop.py's LoRADropFit, what `export --lora-drop` fits."""
    kind: ClassVar[DrafterKind] = DrafterKind.LORADROP
    needs_corrections: ClassVar[bool] = True
    dir: str | None = None

    @property
    def backend_needs(self) -> frozenset[BackendNeed]:
        return frozenset({BackendNeed.LAYER_REUSE})

    def __str__(self) -> str:
        return "loradrop" if self.dir is None else f"loradrop:{self.dir}"


_ARG = {DrafterKind.MODEL: "model:<name-or-path>", DrafterKind.SKIP: "skip:<R>", DrafterKind.EXIT: "exit:<layer>",
        DrafterKind.HEAD: "head:<dir>"}
_STOPS = tuple(k.value for k in StopKind)


def parse_drafter(text: str) -> DrafterSpec:
    """The spec of a `--drafter` string (grammar in the module docstring); ValueError naming the fix otherwise."""
    body, plus, stop = text.rpartition("+")
    if plus and stop.partition(":")[0] == "suffix":
        return _with_memory(text, body, stop.partition(":")[2])
    if plus and stop.partition(":")[0] == "tree":
        return _tree(text, body, stop.partition(":")[2])
    if plus and stop.partition(":")[0] == "lookup":
        return _lookup(text, body, stop.partition(":")[2])
    if not plus or stop.partition(":")[0] not in _STOPS:
        body, stop = text, None
    head, _, arg = body.partition(":")
    try:
        kind = DrafterKind(head)
    except ValueError:
        if head.startswith("suffix+"):
            raise ValueError(f"drafter {text!r}: the suffix memory combines with a drafter written first, as "
                             "ngram+suffix or model:<name>+suffix") from None
        raise ValueError(f"unknown drafter {text!r}; use none, ngram, recycle[:nodes], model:<name-or-path>, "
                         "skip:<R>, swift, exit:<layer>, del, loradrop[:<corrections-dir>], suffix[:<budget>] or "
                         "head:<dir>"
                         ) from None
    if kind is DrafterKind.SUFFIX:
        if stop is not None:
            raise ValueError(f"drafter {text!r}: the suffix drafter drafts without probabilities; drop the +{stop}")
        return SuffixSpec(_budget(text, arg) if arg else SUFFIX_BUDGET)
    if kind is DrafterKind.LORADROP:
        if stop is not None:
            raise ValueError(f"drafter {text!r}: the loradrop drafter takes no draft stop; drop the +{stop}")
        return LoraDropSpec(arg or None)  # optional: a fitted corrections directory
    if kind is DrafterKind.RECYCLE:
        return _recycle(text, arg, stop)
    if (kind in _ARG) != bool(arg):
        raise ValueError(f"drafter {text!r}: only {', '.join(_ARG.values())} (and recycle:<nodes>) take an "
                         "argument")
    stop_spec = None
    if stop is not None:
        if kind in (DrafterKind.NONE, DrafterKind.NGRAM):
            raise ValueError(f"drafter {text!r}: a draft stop needs a drafter with probabilities (model, skip, "
                             "swift, exit, del)")
        stop_spec = StopSpec.parse(stop)  # fails here, at start-up
    if kind is DrafterKind.HEAD:
        if stop is not None:
            raise ValueError(f"drafter {text!r}: the head drafter takes no draft stop; drop the +{stop}")
        return HeadSpec(arg)
    if kind is DrafterKind.MODEL:
        return ModelSpec(arg, stop=stop_spec)
    if kind in (DrafterKind.SKIP, DrafterKind.EXIT):
        try:
            value = int(arg) if kind is DrafterKind.EXIT else float(arg)
        except ValueError:
            raise ValueError(f"drafter {text!r}: expected {_ARG[kind]} with a number") from None
        return SkipSpec(value, stop_spec) if kind is DrafterKind.SKIP else ExitSpec(value, stop_spec)
    if kind is DrafterKind.SWIFT:
        return SwiftSpec(stop_spec)
    if kind is DrafterKind.DEL:
        return DelSpec(stop_spec)
    return NoneSpec() if kind is DrafterKind.NONE else NgramSpec()


def _recycle(text: str, arg: str, stop: str | None) -> RecycleSpec:
    if arg and not arg.isdigit():
        raise ValueError(f"drafter {text!r}: the recycle tree size is a node count, as recycle:16")
    if stop is not None:
        raise ValueError(f"drafter {text!r}: recycle drafts trees without probabilities; drop the +{stop}")
    return RecycleSpec(int(arg) if arg else 16)


def _tree(text: str, body: str, nodes: str) -> ModelSpec | SuffixSpec:
    spec = parse_drafter(body)
    chain_suffix = isinstance(spec, SuffixSpec) and not spec.tree
    if not chain_suffix and (not isinstance(spec, ModelSpec) or spec.stop is not None or spec.lookup or spec.suffix):
        raise ValueError(f"drafter {text!r}: +tree[:<nodes>] follows a model drafter without a draft stop, lookup "
                         "or suffix memory, or the suffix drafter, as model:<name>+tree:16 or suffix+tree:16")
    if nodes and not (nodes.isdigit() and 1 <= int(nodes) <= 256):
        raise ValueError(f"drafter {text!r}: the tree size is a node count in 1..256, as +tree:16")
    return replace(spec, tree=int(nodes) if nodes else 16) if chain_suffix else \
        ModelSpec(spec.model, tree=int(nodes) if nodes else 16)


def _lookup(text: str, body: str, n: str) -> ModelSpec:
    spec = parse_drafter(body)
    if not isinstance(spec, ModelSpec) or spec.tree:
        raise ValueError(f"drafter {text!r}: +lookup[:<n>] follows a chain model drafter, as model:<name>+lookup:2")
    if n and not (n.isdigit() and 1 <= int(n) <= 3):
        raise ValueError(f"drafter {text!r}: the lookup match length is 1, 2 or 3 tokens, as +lookup:2")
    return replace(spec, lookup=int(n) if n else 2)


def _budget(text: str, arg: str) -> int:
    lo, hi = SUFFIX_BUDGETS
    if not (arg.isdigit() and lo <= int(arg) <= hi):
        raise ValueError(f"drafter {text!r}: the suffix memory's budget is a token count in {lo}..{hi}, as "
                         f"suffix:{SUFFIX_BUDGET}")
    return int(arg)


def _with_memory(text: str, body: str, arg: str) -> DrafterSpec:
    """'<ngram | chain model drafter | head>+suffix[:<budget>]'."""
    spec = parse_drafter(body)
    if not isinstance(spec, (NgramSpec, ModelSpec, HeadSpec)) or spec.is_tree or spec.suffix is not None:
        raise ValueError(f"drafter {text!r}: +suffix[:<budget>] follows ngram, a chain model drafter or a head, once, "
                         "as ngram+suffix or model:<name>+suffix (the suffix drafter alone: suffix[:<budget>])")
    return replace(spec, suffix=_budget(text, arg) if arg else SUFFIX_BUDGET)
