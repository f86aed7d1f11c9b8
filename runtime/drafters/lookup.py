"""Prompt lookup first, a draft model otherwise: `--drafter model:<name>+lookup[:<n>]`.

Each round, the n-gram drafter (ALGORITHMS.md 2.6) looks for an earlier occurrence of the context's last m tokens,
m = 3 .. n. If one exists its continuation is the draft: it costs nothing to make, and on text that repeats the
prompt (summaries, retrieval answers, translations that keep names and numbers) it is as long and as likely to be
accepted as the draft model's. Only when no such match exists does the draft model run. Each draft is verified by its
own rule (ALGORITHMS.md 1.2 for the lookup draft, which has no q; 1.1 for the model's), so the hybrid is lossless
exactly when both parts are. The draft's `kind` is the matched length for lookup drafts and 0 for model drafts, so
the adaptive draft length (runtime/draft_length.py) keeps a separate acceptance model for each.

A match is not always worth a round: a 1-token match that is usually rejected costs a verify forward that a model
draft would have filled with several accepted tokens. So the hybrid keeps, per source (lookup drafts by match length,
and the model), a running rate of tokens emitted per second of round (draft + verify, timed between propose and
accept), and takes a lookup draft only when its match length's rate is at least the model's; a source it has passed
over is retried every `explore` (8) rounds, so a rate that improves is noticed; rates start afresh with each
sequence. Decisions change only which lossless draft is verified, never the output.

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

from ..types import Draft, Tokens
from .model import ModelDrafter
from .ngram import NgramDrafter


class _Rate:
    """Exponential moving averages of tokens emitted and seconds spent per round, for one draft source."""

    def __init__(self, decay: float = 0.8) -> None:
        self.decay, self.tokens, self.seconds, self.rounds = decay, 0.0, 0.0, 0

    def update(self, tokens: int, seconds: float) -> None:
        a = 1.0 if self.rounds == 0 else 1.0 - self.decay
        self.tokens += a * (tokens - self.tokens)
        self.seconds += a * (seconds - self.seconds)
        self.rounds += 1

    @property
    def per_second(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)


class LookupModelDrafter:
    def __init__(self, model: ModelDrafter, min_n: int = 2, max_n: int = 3, *, explore: int = 8,
                 extend: bool = True, clock: Callable[[], float] = time.perf_counter) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"lookup needs 1 <= n <= {max_n} (the shortest context match that replaces the draft "
                             f"model), got {min_n}")
        self.model = model
        self.lookup = NgramDrafter(max_n=max_n, min_n=min_n)
        self.name = f"{model.name}+lookup:{min_n}"
        self.weight_bytes_per_token = model.weight_bytes_per_token  # what a model round reads per drafted token
        # the adaptive length's budget is the model's (kind 0), not the last round's source: a 2-token match that is
        # usually cut after one token must not cut the next model draft to one token
        self.budget_kind = 0
        self.rounds = {"lookup": 0, "model": 0}  # which part made each draft (for --stats and tests)
        self.explore, self.clock = explore, clock
        self.extend = extend  # let a lookup match end a model draft (see _extension)
        self.extended = 0  # model drafts a lookup match completed
        self.rates: dict[int, _Rate] = {}  # source -> rate; 0 = the model, m >= 1 = lookup with an m-token match
        self._passed: dict[int, int] = {}  # lookup match length -> rounds it was passed over since it last drafted
        self._source = 0
        self._extended = False  # the current model draft was completed by a lookup match
        self._draft_s = 0.0
        self._proposed_at = 0.0

    def begin(self, prompt: Tokens) -> None:
        """A new sequence: its rates start afresh. How often a match continues correctly is a property of the text
        (a translation that copies names, a summary that quotes), so a rate learned on the previous answer misleads:
        a 3-token match passed over there stayed passed over for a whole translation answer (63.8 vs 119 tok/s on the
        same prompt in two runs, 18 rounds being too few for a retry every 16)."""
        self.lookup.begin(prompt)
        self.model.begin(prompt)
        self._source = 0
        self.rates.clear()
        self._passed.clear()

    def propose(self, context: Tokens, k: int, rng: np.random.Generator) -> Draft:
        t0 = self.clock()
        self._extended = False
        draft = self.lookup.propose(context, k, rng)
        if draft.k and self._worth(draft.kind):
            self._source = draft.kind
            self.rounds["lookup"] += 1
        else:
            self._source = 0
            self.rounds["model"] += 1
            draft = self.model.propose(context, k, rng, extend=self._extension(context) if self.extend else None)
        self._proposed_at = self.clock()
        self._draft_s = self._proposed_at - t0
        return draft

    def _extension(self, context: Tokens):
        """For the model's draft loop: once its draft so far ends in a match of the longest length (max_n) that is
        worth taking, the match's continuation ends the draft instead of more model forwards."""
        head = np.asarray(context, dtype=np.int32)[-self.lookup.max_n:]

        def extend(drafted: np.ndarray, room: int) -> np.ndarray:
            found = self.lookup.continuation(np.concatenate([head, drafted]), room)
            if found.kind != self.lookup.max_n or not self._worth(found.kind):
                return found.tokens[:0]
            self.extended += 1
            self._extended = True
            return found.tokens

        return extend

    def _worth(self, kind: int) -> bool:
        """Lookup with this match length emits at least as many tokens per second as the model, or it is its turn to
        be retried. Each source is tried once before any comparison: this match length first, then the model."""
        mine, model = self.rates.get(kind), self.rates.get(0)
        if mine is not None and model is None:
            return False
        if mine is None or mine.per_second >= model.per_second:
            self._passed[kind] = 0
            return True
        self._passed[kind] = self._passed.get(kind, 0) + 1
        if self._passed[kind] >= self.explore:
            self._passed[kind] = 0
            return True
        return False

    def accept(self, n_accepted: int, next_token: int) -> None:
        """Charge the round (draft + verify) to its source; only a model draft informs the model's draft-stop
        policy; the lookup index grows from the next context."""
        seconds = self._draft_s + (self.clock() - self._proposed_at)
        if not self._extended:  # a completed model draft's free tail would flatter the model's rate
            self.rates.setdefault(self._source, _Rate()).update(n_accepted + 1, seconds)
        if self._source == 0:
            self.model.accept(n_accepted, next_token)
