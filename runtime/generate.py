"""Text streaming on top of the token decode loop: incremental detokenization, stop strings, finish reasons.

The CLI, the Python API, the server and the benchmark all consume `stream`.
"""
from __future__ import annotations

import time
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from .backends.base import Backend
from .constraint import Constraint
from .decode import decode
from .drafters.base import Drafter
from .lossy import LossyMode
from .session import Session
from .stats import DecodeStats
from .tokenizer import StreamDecoder, Tokenizer
from .types import FinishReason, GenerationResult, Response, SamplingParams, Tokens
from .verify import VerifierKind


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


def stream(target: Backend, tokenizer: Tokenizer, prompt: Tokens, params: SamplingParams, *,
           drafter: Drafter | None = None, k: int = 4, max_tokens: int | None = 128, stop: Sequence[str] = (),
           rng: np.random.Generator | None = None, stats: DecodeStats | None = None,
           eos_ids: Sequence[int] | None = None, ctx: int | None = None, adaptive_k: bool = False,
           verifier_kind: VerifierKind = VerifierKind.CHAIN, lossy: LossyMode | None = None,
           session: Session | None = None, constraint: Constraint | None = None,
           logprobs: int | None = None) -> Iterator[Response]:
    """Yield Responses as tokens are committed; the last one carries the finish reason.

    max_tokens None: to EOS, a stop string or the context limit (runtime/decode.py).
    lossy: a labelled lossy mode (runtime/lossy.py) instead of speculation. session: a runtime/session.py Session
    whose cached prefix is reused. constraint, logprobs: as runtime/decode.py's (each Response then carries its
    token's TokenLogprob).

    Text that might begin a stop string is held back until it cannot; a stop string and the EOS token
    are never part of the output.
    """
    stops = [s for s in stop if s]
    eos = tuple(tokenizer.eos_ids if eos_ids is None else eos_ids)
    detok = StreamDecoder(tokenizer)
    pending, produced, t0 = "", 0, time.perf_counter()
    events = decode(target, prompt, params, drafter=drafter, k=k, max_tokens=max_tokens, eos_ids=eos, rng=rng,
                    stats=stats, ctx=ctx, adaptive_k=adaptive_k, verifier_kind=verifier_kind, session=session,
                    lossy=lossy, constraint=constraint, logprobs=logprobs)
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


def collect(responses: Iterable[Response], on_text: Callable[[str], None] | None = None) -> GenerationResult:
    """Join a Response stream into one result; on_text sees each piece of text as it arrives. The EOS token is
    dropped from the tokens (it is never in the text)."""
    parts, tokens, lps, reason = [], [], [], FinishReason.LENGTH
    for r in responses:
        parts.append(r.text)
        tokens.append(r.token)
        lps.append(r.logprob)
        reason = r.finish_reason or reason
        if on_text is not None and r.text:
            on_text(r.text)
    if reason is FinishReason.EOS:
        tokens, lps = tokens[:-1], lps[:-1]
    logprobs = lps if (lps and lps[0] is not None) else None
    return GenerationResult(text="".join(parts), tokens=tokens, finish_reason=reason, logprobs=logprobs)


def generate(target: Backend, tokenizer: Tokenizer, prompt: Tokens, params: SamplingParams,
             **kwargs) -> GenerationResult:
    """Collect `stream` into one result (text, tokens, finish reason, stats as a dict)."""
    stats = kwargs.pop("stats", None) or DecodeStats()
    result = collect(stream(target, tokenizer, prompt, params, stats=stats, **kwargs))
    return GenerationResult(result.text, result.tokens, result.finish_reason, len(prompt), stats.to_dict(),
                            result.logprobs)
