"""A chain of draft sources (generic composition): each round the sources are tried in order, and the first one
with a draft whose measured rate is worth it drafts; the last source (the fallback) drafts otherwise.

Rates: per source and draft kind (the key (i, kind); the fallback has one key (last, 0)), an exponential moving
average of tokens emitted per second of round (draft + verify, timed between propose and accept). An earlier
source's draft of some kind is taken only when its rate is at least the fallback's; a key passed over is retried
every `explore` rounds, so a rate that improves is noticed; each key is tried once before any comparison (that key
first, then the fallback). Rates start afresh with each sequence. Decisions change only which lossless draft is
verified, never the output.

runtime/drafters/lookup.py composes prompt lookup and a draft model this way (LookupModelDrafter).
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from ..backends.base import Backend, Cache
from ..types import Draft, Logits, SamplingParams, Tokens
from .base import Drafter, DrafterCaps

Key = tuple[int, int]  # (source index, draft kind)


class Rate:
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


def chain_caps(sources: Sequence[Drafter]) -> DrafterCaps:
    """A chain observes / binds / pays when any source does; its adaptive budget is the fallback's kind (0) when the
    fallback pays: a free source's kind (the last seen) must not cut the paid fallback's draft."""
    caps = [s.caps for s in sources]
    return DrafterCaps(observes_logits=any(c.observes_logits for c in caps),
                       binds_target=any(c.binds_target for c in caps),
                       reads_taps=any(c.reads_taps for c in caps),
                       pays_per_token=any(c.pays_per_token for c in caps),
                       budget_kind=0 if caps[-1].pays_per_token else None,
                       needs=frozenset().union(*(c.needs for c in caps)))


class ChainDrafter(Drafter):
    """Sources tried in order (see the module docstring); chain drafters only (no trees)."""

    def __init__(self, sources: Sequence[Drafter], *, name: str | None = None, explore: int = 8,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if len(sources) < 2 or any(s.caps.tree for s in sources):
            raise ValueError("a drafter chain needs two or more chain drafters (tree drafters cannot be chained)")
        self.sources = list(sources)
        self.caps = chain_caps(self.sources)
        self.name = name or "+".join(s.name for s in self.sources)
        self.explore, self.clock = explore, clock
        self.counts = [0] * len(self.sources)  # rounds each source drafted (for --stats and tests)
        self.rates: dict[Key, Rate] = {}
        self._passed: dict[Key, int] = {}  # key -> rounds it was passed over since it last drafted
        self.source = len(self.sources) - 1  # the source of the current round
        self._key: Key = self.fallback_key
        self._uncharged = False  # the current round's rate must not be charged (lookup.py: a completed model draft)
        self._draft_s = 0.0
        self._proposed_at = 0.0

    @property
    def fallback_key(self) -> Key:
        return (len(self.sources) - 1, 0)

    @property
    def weight_bytes_per_token(self) -> int:
        """What a fallback round reads per drafted token."""
        return self.sources[-1].weight_bytes_per_token

    @property
    def verify_taps(self) -> tuple[int, ...]:
        """Every source's taps (known after bind)."""
        return tuple(sorted(set().union(*(s.verify_taps for s in self.sources))))

    def observe_prompt(self, taps: dict[int, np.ndarray], tokens: Tokens, start: int) -> None:
        for s in self.sources:
            if s.caps.reads_taps:
                s.observe_prompt({n: taps[n] for n in s.verify_taps if n in taps}, tokens, start)

    def observe_verify(self, taps: dict[int, np.ndarray], emitted: Tokens) -> None:
        """Every source with taps hears every round (a head keeps its cache whichever source drafted)."""
        for s in self.sources:
            if s.verify_taps:
                s.observe_verify({n: taps[n] for n in s.verify_taps}, emitted)

    def check(self, target: Backend) -> None:
        for s in self.sources:
            s.check(target)

    def bind(self, target: Backend, cache: Cache) -> None:
        for s in self.sources:
            if s.caps.binds_target:
                s.bind(target, cache)

    def begin(self, prompt: Tokens) -> None:
        """A new sequence: its rates start afresh. How often a source's draft is right is a property of the text
        (a translation that copies names, a summary that quotes), so a rate learned on the previous answer misleads."""
        for s in self.sources:
            s.begin(prompt)
        self.source, self._key = len(self.sources) - 1, self.fallback_key
        self.rates.clear()
        self._passed.clear()

    def finish(self, tokens: Tokens) -> None:
        for s in self.sources:
            s.finish(tokens)

    def observe(self, tokens: Tokens, logits: Logits) -> None:
        for s in self.sources:
            if s.caps.observes_logits:
                s.observe(tokens, logits)

    def propose(self, context: Tokens, k: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        """The first source's draft worth taking, else the fallback's (`draft_fallback`)."""
        t0 = self.clock()
        self._uncharged = False
        for i, src in enumerate(self.sources[:-1]):
            draft = src.propose(context, k, params, rng)
            if draft.k and self.worth((i, draft.kind)):
                self.source, self._key = i, (i, draft.kind)
                break
        else:
            self.source, self._key = len(self.sources) - 1, self.fallback_key
            draft = self.draft_fallback(context, k, params, rng)
        self.counts[self.source] += 1
        self._proposed_at = self.clock()
        self._draft_s = self._proposed_at - t0
        return draft

    def draft_fallback(self, context: Tokens, k: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        """Hook: the fallback's draft (lookup.py lets a lookup match complete it)."""
        return self.sources[-1].propose(context, k, params, rng)

    def worth(self, key: Key) -> bool:
        """This key emits at least as many tokens per second as the fallback, or it is its turn to be retried."""
        mine, fallback = self.rates.get(key), self.rates.get(self.fallback_key)
        if mine is not None and fallback is None:
            return False
        if mine is None or mine.per_second >= fallback.per_second:
            self._passed[key] = 0
            return True
        self._passed[key] = self._passed.get(key, 0) + 1
        if self._passed[key] >= self.explore:
            self._passed[key] = 0
            return True
        return False

    def accept(self, n_accepted: int, next_token: int) -> None:
        """Charge the round (draft + verify) to its key; the source that drafted learns from the verdict."""
        seconds = self._draft_s + (self.clock() - self._proposed_at)
        if not self._uncharged:
            self.rates.setdefault(self._key, Rate()).update(n_accepted + 1, seconds)
        self.sources[self.source].accept(n_accepted, next_token)
