"""Stopping an answer that repeats itself (finish reason `repetition`).

Greedy decoding of a small model, quantized ones above all, often falls into a loop ("la France, la France, ..."
until the context is full). The rule looks only at the answer's committed tokens (never the prompt), one token at a
time, and stops at the first position where it holds; the output is then a prefix of what decoding without the rule
gives, so greedy speculative output is still a prefix of plain greedy output, token for token, whatever number of
tokens a speculative step commits at once (runtime/decode.py checks each one in order).

The rule: the answer ends in `copies` back-to-back copies of one span of L tokens, 1 <= L <= max_span, where
copies >= max(min_copies, ceil(min_tokens / L)); so the repeated region is at least min_tokens long (a run of 200
identical tokens, 50 copies of a 4-token phrase, 4 copies of a 64-token paragraph). Lists and code are not exact
back-to-back copies of 200 tokens: "1. ... 2. ..." items differ, and an 8 x 8 table of zeros is 140 tokens.

Example (max_span 2, min_copies 3, min_tokens 6): the answer a b c b c b c stops at its 7th token (b c three times,
6 tokens); a b b b b b stops at its 6th (b five times is only 5 tokens: span 1 needs 6 copies, so it goes on).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RepetitionStop:
    """The thresholds (module docstring); the defaults stop a loop after about 200 repeated tokens."""
    max_span: int = 64  # longest repeated span looked for, in tokens
    min_copies: int = 4  # copies of a span back to back, at least
    min_tokens: int = 200  # tokens the copies cover together, at least

    def __post_init__(self) -> None:
        if self.max_span < 1 or self.min_copies < 2 or self.min_tokens < 2:
            raise ValueError(f"repetition stop: max_span >= 1, min_copies >= 2 and min_tokens >= 2, got {self}")

    def watch(self) -> "RepetitionWatch":
        return RepetitionWatch(self)


class RepetitionWatch:
    """The rule applied to one answer, token by token: `push(token)` is True at the first token after which the
    answer ends in a repetition. O(max_span) per token: for each span L it keeps how many tokens in a row equal the
    token L before them; the answer's tail is L-periodic over `run + L` tokens, so it holds `(run + L) // L`
    copies of the span."""

    def __init__(self, rule: RepetitionStop) -> None:
        self.spans = np.arange(1, rule.max_span + 1)  # [S] the periods L
        copies = np.maximum(rule.min_copies, np.ceil(rule.min_tokens / self.spans))
        self.need = (copies - 1) * self.spans  # [S] the run that means `copies` copies of an L-token span
        self.runs = np.zeros(rule.max_span, dtype=np.int64)  # [S]
        self.tail = np.full(rule.max_span, -1, dtype=np.int64)  # [S] the last max_span tokens, newest last
        self.n = 0

    def push(self, token: int) -> bool:
        """Record one committed answer token; True when the answer (this token included) ends in a repetition."""
        # tail[-L] is the token L positions before this one (-1 before the answer's start: never equal)
        same = self.tail[::-1] == token
        self.runs = np.where(same, self.runs + 1, 0)
        self.tail[:-1], self.tail[-1] = self.tail[1:], token
        self.n += 1
        return bool(np.any(self.runs >= self.need))


REPETITION_STOP = RepetitionStop()
