"""One streamed call's output as typed events, the same for the chat-completions and the Responses routes: the
decoder's Responses in, text with its logprobs, whole tool calls and the end out (apps/generation.py maps them onto
each route's wire shape). Synchronous and free of I/O: the server's worker thread runs it, tests run it alone.

    Response("Sure. ")  Response("<tool")  Response('_call>{..}</tool_call>')  Response("", EOS)
          │                  │ held (may begin a call)     │
          ▼                  ▼                             ▼
    Text("Sure. ", [lp0])                    Call(get_weather, 0, [lp1, lp2])     End(EOS, 3 tokens, 1 call, [])

The rules, one place for both routes:
- A token's logprob goes out with the event that completes its text (its piece's last character): held-back text
  (a possible <tool_call>, and upstream a stop string or an unfinished UTF-8 character) holds its tokens'
  logprobs with it, so no event carries a logprob before its text.
- With tools offered, whitespace-only text is held until non-whitespace text follows and then sent with it (with
  its logprobs), across calls; at the end it is dropped. A call's surrounding newlines so never make an empty-looking
  message or chunk of their own (the non-streamed content is stripped the same way).
- Calls beyond the limit (parallel_tool_calls false: one; Responses' max_tool_calls) are not sent.
- End carries the logprobs of tokens whose text no event sent: a dropped call, an unclosed block cut by max_tokens,
  whitespace dropped at the end, a stop string's tokens. Every completion token's logprob is in exactly one event.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence, Union

from ..runtime.generate import Collector
from ..runtime.types import FinishReason, Response, TokenLogprob
from .tool_parse import Parsed, ToolStream
from .tools import Tool, ToolCall

Logprobs = tuple[TokenLogprob, ...]


@dataclass(frozen=True)
class Text:
    """Content text and the logprobs of the tokens whose text it completes."""
    text: str
    logprobs: Logprobs = ()


@dataclass(frozen=True)
class Call:
    """A whole tool call (its block closed), its index among the calls sent, and the logprobs of its text."""
    call: ToolCall
    index: int
    logprobs: Logprobs = ()


@dataclass(frozen=True)
class End:
    """The call ended: why, its completion tokens (EOS not counted), the calls sent, and the logprobs no other event
    carried."""
    reason: FinishReason
    completion_tokens: int
    tool_calls: int
    logprobs: Logprobs = ()


@dataclass(frozen=True)
class Failed:
    """The backend raised: the stream stops here (the client gets an error event)."""
    message: str


Event = Union[Text, Call, End, Failed]


class StreamAssembler:
    """Responses -> events (the module docstring's rules). `push(r)` returns the events r completes, `finish()` the
    rest and End; `collector` holds the whole answer (text, tokens, logprobs) for the caller's own record."""

    def __init__(self, tools: Sequence[Tool] = (), *, parallel: bool = True, max_calls: int | None = None) -> None:
        self.collector = Collector()  # the one place that aligns tokens and logprobs (EOS's dropped)
        self._parser = ToolStream(tools)
        self._hold_blank = bool(tools)
        self._limit = 1 if not parallel else max_calls  # None: no limit
        self._fed = 0  # characters of text pushed
        self._held: list[tuple[int, list[TokenLogprob]]] = []  # (end of its piece's text, logprobs), not yet sent
        self._blank, self._blank_lps = "", []  # whitespace held until text follows it
        self._unsent: list[TokenLogprob] = []  # logprobs of calls not sent: they go with End
        self.calls = 0

    def push(self, r: Response) -> list[Event]:
        self.collector.add(r)
        if not r.text:  # a token whose text is held upstream: its logprob waits for the piece that carries it
            return []
        self._fed += len(r.text)
        self._hold(self.collector.take_logprobs())
        return self._events(self._parser.push(r.text))

    def finish(self) -> list[Event]:
        self._hold(self.collector.take_logprobs())
        out = self._events(self._parser.finish())
        left = self._unsent + self._blank_lps + [lp for _, lps in self._held for lp in lps]
        self._held, self._blank, self._blank_lps, self._unsent = [], "", [], []
        return out + [End(self.collector.reason, len(self.collector.tokens), self.calls, tuple(left))]

    def _hold(self, lps: list[TokenLogprob]) -> None:
        if lps:
            self._held.append((self._fed, lps))

    def _release(self, end: int) -> list[TokenLogprob]:
        """The held logprobs of the pieces whose text ends by `end`."""
        out: list[TokenLogprob] = []
        while self._held and self._held[0][0] <= end:
            out += self._held.pop(0)[1]
        return out

    def _events(self, found: list[Parsed]) -> list[Event]:
        out: list[Event] = []
        for p in found:
            lps = self._release(p.end)
            if isinstance(p.value, ToolCall):
                if self._limit is not None and self.calls >= self._limit:
                    self._unsent += lps
                    continue
                out.append(Call(p.value, self.calls, tuple(lps)))
                self.calls += 1
            elif self._hold_blank and not (self._blank + p.value).strip():
                self._blank += p.value
                self._blank_lps += lps
            else:
                out.append(Text(self._blank + p.value, tuple(self._blank_lps + lps)))
                self._blank, self._blank_lps = "", []
        return out


def assemble(responses: Iterable[Response], tools: Sequence[Tool] = (), *, parallel: bool = True,
             max_calls: int | None = None) -> Iterator[Event]:
    """The events of a whole Response stream, End last (StreamAssembler)."""
    a = StreamAssembler(tools, parallel=parallel, max_calls=max_calls)
    for r in responses:
        yield from a.push(r)
    yield from a.finish()
