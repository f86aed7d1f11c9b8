"""The Drafter seam (llama.cpp common/speculative.h lifecycle): begin / propose / accept, plus optional capabilities
declared up front in `caps` (a frozen DrafterCaps), which the decode loop reads once when a decode starts.

Contracts (every method but `propose` / `propose_tree` has a no-op default here):
  begin(prompt)                          a new sequence starts with these tokens.
  propose(context, k, params, rng)       requires: context = every committed token (prompt + output); returns a Draft
                                         of at most k tokens continuing it (k may be 0), any q rows computed with
                                         `params` (the call's SamplingParams: a drafter holds none of its own).
  accept(n_accepted, next_token)         the target kept the first n_accepted draft tokens, then emitted next_token.
  finish(tokens)                         the sequence ended (finished, stopped or interrupted): tokens = the prompt
                                         and every emitted token (a memory of past answers keeps them: suffix.py).
Optional, declared by caps:
  caps.binds_target    bind(target, cache): once per sequence before begin; self-speculative drafters run the
                       target's own weights (a LayerPlan) and write draft K/V into its cache past its length, leaving
                       cache.length as they found it (the verify forward overwrites those rows). After bind,
                       `verify_taps` (DEL) may be non-empty: the decode step then runs its verify forward as
                       hidden(..., taps=verify_taps) and calls observe_verify({n: h [T, D]}, emitted) before accept.
  caps.reads_taps      the drafter reads the target's hidden states at `verify_taps` (fixed at construction) at
                       every position, the prompt's included (a trained head, head.py): the stepper prefills with
                       hidden(prompt[start:-1], taps=verify_taps) instead of feeding it and, after begin, calls
                       observe_prompt({n: h [T - 1 - start, D]}, prompt, start): rows at positions start..T-2 (those
                       below `start` were cached by a Session and never tapped: the drafter keeps what it saw of them,
                       or drafts without); every verify forward then taps them and calls observe_verify(taps,
                       emitted), rows 0..len(emitted)-1 at positions C-1.. for C committed tokens before the round.
                       Needs a LayeredBackend (BackendNeed.TAPS).
  caps.observes_logits observe(tokens [T], logits [T, V]) after every target forward (token recycling).
  caps.tree            a TreeDrafter: propose_tree(context, max_nodes, params, rng) -> TreeDraft and `max_nodes`
                       instead of propose; the decode loop runs tree rounds (runtime/steppers.py TreeStepper).
  caps.pays_per_token  drafting a token reads weights: the adaptive draft length budgets the request (budget_kind:
                       the draft kind whose acceptance sets the budget; None = the last kind seen).
  caps.needs           what the target backend must support; checked at construction (`check`), not mid-decode.
`weight_bytes_per_token` is what one drafted token reads (0 for free drafters; MBSU); it may change after bind or
with the plan of a round (self-speculative drafters).
"""
from __future__ import annotations

import abc
import enum
from dataclasses import dataclass
import numpy as np

from ..backends.base import Backend, Cache, LayeredBackend, require_tree
from ..loradrop import require_reuse
from ..tree import TreeDraft
from ..types import Draft, Logits, SamplingParams, Tokens


class BackendNeed(enum.Enum):
    TREE_MASK = "tree_mask"  # the target verifies token trees (caps.tree_mask)
    LAYER_PLAN = "layer_plan"  # the target is a LayeredBackend running layer plans (self-speculative drafters)
    LAYER_REUSE = "layer_reuse"  # ... including LoRA-Drop drop steps (caps.layer_reuse)
    TAPS = "taps"  # the target exposes hidden states after given layers (LayeredBackend.hidden's taps)


@dataclass(frozen=True)
class DrafterCaps:
    """What a drafter kind does beyond begin / propose / accept, and what it needs from the target backend."""

    observes_logits: bool = False
    binds_target: bool = False
    reads_taps: bool = False
    tree: bool = False
    pays_per_token: bool = False
    budget_kind: int | None = None
    needs: frozenset[BackendNeed] = frozenset()


def require_layered(target: Backend, drafter: str) -> LayeredBackend:
    """The target as a LayeredBackend, or a ValueError naming the fix (raised at start-up)."""
    if not target.caps.layer_plan or not isinstance(target, LayeredBackend):
        if target.caps.layer_hint:
            raise ValueError(f"the {drafter} drafter runs the target's own layers with a layer plan: "
                             f"{target.caps.layer_hint}")
        raise ValueError(f"the {drafter} drafter runs the target's own layers with a layer plan, which the "
                         f"{target.name} backend does not support (caps.layer_plan); use --backend numpy, an ONNX "
                         "artifact exported with --profile layered, or a drafter that needs no layer plans (ngram, "
                         "model:<name>)")
    return target


def require_taps(target: Backend, drafter: str) -> LayeredBackend:
    """The target as a LayeredBackend whose hidden states a drafter can tap, or a ValueError naming the fix."""
    if not target.caps.layer_plan or not isinstance(target, LayeredBackend):
        raise ValueError(f"the {drafter} drafter reads the target's hidden states (taps) from its own forwards, which "
                         f"the {target.name} backend does not expose (caps.layer_plan); use --backend native (or "
                         "--backend numpy)")
    return target


def check_backend(target: Backend, needs: frozenset[BackendNeed], drafter: str) -> None:
    """Raise a ValueError naming the fix when `target` lacks one of `needs` (STYLE principle 10)."""
    if BackendNeed.TREE_MASK in needs:
        require_tree(target)
    if BackendNeed.LAYER_PLAN in needs:
        require_layered(target, drafter)
    if BackendNeed.LAYER_REUSE in needs:
        require_reuse(target)
    if BackendNeed.TAPS in needs:
        require_taps(target, drafter)


class Drafter(abc.ABC):
    """A chain drafter; subclasses declare `caps` and override what they use (see the module docstring)."""

    caps: DrafterCaps = DrafterCaps()  # per class; a composite (chain.py) derives its own per instance
    name: str = "drafter"
    weight_bytes_per_token: int = 0
    verify_taps: tuple[int, ...] = ()

    def check(self, target: Backend) -> None:
        """Start-up check: the target supports what this drafter needs (caps.needs)."""
        check_backend(target, self.caps.needs, self.name)

    def begin(self, prompt: Tokens) -> None:
        """A new sequence starts with `prompt` [T]."""

    @abc.abstractmethod
    def propose(self, context: Tokens, k: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        """requires: context [T] = every committed token; returns a Draft of <= k tokens (q from `params`)."""

    def accept(self, n_accepted: int, next_token: int) -> None:
        """The target kept n_accepted draft tokens, then emitted next_token."""

    def finish(self, tokens: Tokens) -> None:
        """The sequence ended; tokens [T] = its prompt and every emitted token."""

    def bind(self, target: Backend, cache: Cache) -> None:
        """caps.binds_target: share the target's weights and KV cache for the next sequence."""

    def observe(self, tokens: Tokens, logits: Logits) -> None:
        """caps.observes_logits: tokens [T] fed to a target forward and their logits [T, V]."""

    def observe_verify(self, taps: dict[int, np.ndarray], emitted: Tokens) -> None:
        """verify_taps non-empty: hidden states {n: [T, D]} of the verify forward and the emitted tokens [m]."""

    def observe_prompt(self, taps: dict[int, np.ndarray], tokens: Tokens, start: int) -> None:
        """caps.reads_taps: hidden states {n: [T - 1 - start, D]} of the prefill of tokens [T] from `start`."""


class TreeDrafter(Drafter):
    """A drafter of token trees (caps.tree): `propose_tree` and `max_nodes` (the largest tree it proposes; the decode
    loop reserves that much cache room) instead of `propose`."""

    caps: DrafterCaps = DrafterCaps(tree=True, needs=frozenset({BackendNeed.TREE_MASK}))
    max_nodes: int = 0

    def propose(self, context: Tokens, k: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        raise TypeError(f"the {self.name} drafter drafts trees: the decode loop calls propose_tree")

    @abc.abstractmethod
    def propose_tree(self, context: Tokens, max_nodes: int, params: SamplingParams, rng: np.random.Generator
                     ) -> TreeDraft:
        """requires: context [T] = every committed token; returns a tree of <= max_nodes nodes."""
