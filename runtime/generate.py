"""Text streaming on top of the token decode loop: incremental detokenization, stop strings, finish reasons; and
the one collector of a Response stream (tokens without the EOS token, logprobs aligned with them).

The CLI, the Python API, the server and the benchmark all consume `stream` (through assembly/decoder.py).
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Iterable, Iterator, Sequence

from .backends.base import Backend
from .decode import decode
from .request import PLAIN, Request, Speculation
from .session import Session
from .stats import DecodeStats
from .tokenizer import StreamDecoder, TextTokenizer
from .types import FinishReason, GenerationResult, Response, TokenLogprob, Tokens


def held_back(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string (it may still complete).

    >>> held_back("hello wor", ["world"])
    3
    """
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best


def stream(target: Backend, tokenizer: TextTokenizer, prompt: Tokens, spec: Speculation = PLAIN,
           req: Request = Request(), *, session: Session | None = None, stats: DecodeStats | None = None
           ) -> Iterator[Response]:
    """Yield Responses as tokens are committed; the last one carries the finish reason. `decode` (runtime/decode.py)
    with req.eos_ids None meaning the tokenizer's end-of-turn ids; each Response carries its token's TokenLogprob
    when req.logprobs asks.

    Text that might begin a stop string (req.stop) is held back until it cannot; a stop string and the EOS token
    are never part of the output.
    """
    stops = list(req.stop)
    if req.eos_ids is None:
        req = replace(req, eos_ids=tuple(tokenizer.eos_ids))
    detok = StreamDecoder(tokenizer)
    pending, produced, t0 = "", 0, time.perf_counter()
    events = decode(target, prompt, spec, req, session=session, stats=stats)
    for ev in events:
        produced += 1
        rate = produced / max(time.perf_counter() - t0, 1e-9)
        if ev.finish_reason is FinishReason.EOS:
            yield Response(pending + detok.flush(), ev.token, ev.from_draft, rate, FinishReason.EOS, ev.logprob)
            return
        pending += detok.push(ev.token)
        hits = [i for i in (pending.find(s) for s in stops) if i >= 0]
        if hits:
            events.close()
            yield Response(pending[:min(hits)], ev.token, ev.from_draft, rate, FinishReason.STOP, ev.logprob)
            return
        if ev.finish_reason is not None:
            yield Response(pending + detok.flush(), ev.token, ev.from_draft, rate, ev.finish_reason, ev.logprob)
            return
        keep = held_back(pending, stops)
        out, pending = pending[:len(pending) - keep], pending[len(pending) - keep:]
        yield Response(out, ev.token, ev.from_draft, rate, None, ev.logprob)


class Collector:
    """A Response stream joined as it arrives, the one place that aligns tokens and logprobs: the EOS token ends
    the answer but is not part of it (not in `tokens`, its logprob not in `logprobs`; its text is never output).

    `add(r)` takes one Response; `take_logprobs()` returns the logprobs added since the last take (a streaming
    caller sends them with the next piece of text); `result(prompt_tokens, stats)` is the GenerationResult."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.tokens: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.asked = False  # a Response carried a logprob (the call asked for them)
        self.reason = FinishReason.LENGTH
        self._taken = 0

    def add(self, r: Response) -> None:
        self.parts.append(r.text)
        self.reason = r.finish_reason or self.reason
        self.asked = self.asked or r.logprob is not None
        if r.finish_reason is FinishReason.EOS:
            return
        self.tokens.append(r.token)
        if r.logprob is not None:
            self.logprobs.append(r.logprob)

    def take_logprobs(self) -> list[TokenLogprob]:
        out, self._taken = self.logprobs[self._taken:], len(self.logprobs)
        return out

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def result(self, prompt_tokens: int = 0, stats=None) -> GenerationResult:
        return GenerationResult(self.text, list(self.tokens), self.reason, prompt_tokens, stats,
                                list(self.logprobs) if self.asked else None)


def collect(responses: Iterable[Response], on_text: Callable[[str], None] | None = None) -> GenerationResult:
    """Join a Response stream into one result (Collector); on_text sees each piece of text as it arrives."""
    c = Collector()
    for r in responses:
        c.add(r)
        if on_text is not None and r.text:
            on_text(r.text)
    return c.result()
