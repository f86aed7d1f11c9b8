"""Prompt lookup first, a draft model otherwise: `--drafter model:<name>+lookup[:<n>]`.

Each round, the n-gram drafter (docs/algorithms.md 2.6) looks for an earlier occurrence of the context's last m tokens,
m = 3 .. n. If one exists its continuation is the draft: it costs nothing to make, and on text that repeats the
prompt (summaries, retrieval answers, translations that keep names and numbers) it is as long and as likely to be
accepted as the draft model's. Only when no such match exists does the draft model run. Each draft is verified by its
own rule (docs/algorithms.md 1.2 for the lookup draft, which has no q; 1.1 for the model's), so the hybrid is lossless
exactly when both parts are. The draft's `kind` is the matched length for lookup drafts and 0 for model drafts, so
the adaptive draft length (runtime/draft_length.py) keeps a separate acceptance model for each.

A match is not always worth a round: a 1-token match that is usually rejected costs a verify forward that a model
draft would have filled with several accepted tokens. So the hybrid is a drafter chain (runtime/drafters/chain.py:
lookup, then the model): it keeps, per source (lookup drafts by match length, and the model), a running rate of
tokens emitted per second of round, and takes a lookup draft only when its match length's rate is at least the
model's; a source it has passed over is retried every `explore` (8) rounds; rates start afresh with each sequence.
Decisions change only which lossless draft is verified, never the output.

A model round can end in a match too: after each token the model drafts, if the draft so far ends in a 3-token
match (and that length is worth taking), the match's continuation completes the draft instead of further model
forwards. Those tokens carry point-mass q rows (a deterministic proposal: speculative sampling then accepts x with
probability p(x) and resamples from p without x, the 1.2 rule's law), so the mixed draft stays lossless.

The draft model's cache is not fed during lookup rounds: ModelDrafter reconciles it with the committed context at its
next propose, in one batched forward over the tokens it missed.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from ..types import Draft, SamplingParams, Tokens
from .chain import ChainDrafter
from .model import ModelDrafter
from .ngram import NgramDrafter

LOOKUP, MODEL = 0, 1  # the chain's source indices


class LookupModelDrafter(ChainDrafter):
    """The chain [prompt lookup (n-gram, matches of min_n..max_n tokens), model]; a lookup match may complete a model
    draft (`extend`)."""

    def __init__(self, model: ModelDrafter, min_n: int = 2, max_n: int = 3, *, explore: int = 8,
                 extend: bool = True, clock: Callable[[], float] = time.perf_counter) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"lookup needs 1 <= n <= {max_n} (the shortest context match that replaces the draft "
                             f"model), got {min_n}")
        self.model = model
        self.lookup = NgramDrafter(max_n=max_n, min_n=min_n)
        super().__init__([self.lookup, model], name=f"{model.name}+lookup:{min_n}", explore=explore, clock=clock)
        self.extend = extend  # let a lookup match end a model draft (see _extension)
        self.extended = 0  # model drafts a lookup match completed

    @property
    def rounds(self) -> dict[str, int]:
        """Which part made each draft (for --stats and tests)."""
        return {"lookup": self.counts[LOOKUP], "model": self.counts[MODEL]}

    def draft_fallback(self, context: Tokens, k: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        return self.model.propose(context, k, params, rng, extend=self._extension(context) if self.extend else None)

    def _extension(self, context: Tokens):
        """For the model's draft loop: once its draft so far ends in a match of the longest length (max_n) that is
        worth taking, the match's continuation ends the draft instead of more model forwards."""
        head = np.asarray(context, dtype=np.int32)[-self.lookup.max_n:]

        def extend(drafted: np.ndarray, room: int) -> np.ndarray:
            found = self.lookup.continuation(np.concatenate([head, drafted]), room)
            if found.kind != self.lookup.max_n or not self.worth((LOOKUP, found.kind)):
                return found.tokens[:0]
            self.extended += 1
            self._uncharged = True  # a completed model draft's free tail would flatter the model's rate
            return found.tokens

        return extend
