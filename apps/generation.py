"""One call's generation for `specedge serve`: the worker that drives Engine.stream, the SSE events of a streamed
call, and the choices of a non-streamed one (apps/server.py routes, admits and leases; this module turns a call's
Responses into OpenAI's shapes)."""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Callable

from ..assembly.decoder import CallStream
from ..runtime.generate import Collector
from ..runtime.types import FinishReason
from . import openai_responses as responses_api
from . import openai_shapes as proto_shapes
from .api import Engine
from .openai_protocol import APIError, GenRequest, Shape
from .openai_shapes import TokenText
from .tools import ToolStream, parse_tool_calls


@dataclass
class Outcome:
    text: str  # the answer, or the error message when `error`
    completion_tokens: int
    reason: FinishReason
    logprobs: list = field(default_factory=list)  # TokenLogprob per completion token, when the call asked
    error: bool = False  # the backend failed: the client gets a 500 / an error event


def echo_text(req: GenRequest, engine: Engine) -> str:
    if not req.echo:
        return ""
    return req.prompt if isinstance(req.prompt, str) else engine.tokenizer.decode(req.prompt)

def text_offset(req: GenRequest) -> int:
    """Completions' text_offset of the first generated token: after the prompt's text, as OpenAI counts."""
    return len(req.prompt) if isinstance(req.prompt, str) else 0


def choices_of(req: GenRequest, outcomes: list[Outcome], shape: Shape, engine: Engine) -> list[dict]:
    """The non-streamed choices: chat content with its parsed tool calls (one with parallel_tool_calls false) or
    completion text (after the echoed prompt), each with its logprobs when asked."""
    text_of = TokenText(engine.tokenizer)
    echo = echo_text(req, engine)
    choices = []
    for i, o in enumerate(outcomes):
        if req.chat:
            content, calls = parse_tool_calls(o.text, req.tools)
            calls = calls if req.parallel_tool_calls else calls[:1]
            lp = None if req.options.logprobs is None else proto_shapes.chat_logprobs(o.logprobs, text_of)
            choices.append(shape.choice(i, content if req.tools else o.text, o.reason, tool_calls=calls,
                                        logprobs=lp))
        else:
            lp = None if req.options.logprobs is None else \
                proto_shapes.completion_logprobs(o.logprobs, text_of, text_offset(req))[0]
            choices.append(shape.choice(i, echo + o.text, o.reason, logprobs=lp))
    return choices


def drive(chunks, cancel: threading.Event, loop, queue: asyncio.Queue, stream: bool,
          running: Callable[[int], None]) -> Outcome:
    """Worker thread: drive Engine.stream (blocks on the engine's lock until this call's turn); streamed
    pieces go to the event loop's queue as ("text", text, [TokenLogprob]): the logprobs of the tokens since the
    last piece (a token whose text is held back, by a stop string or an unfinished UTF-8 character, travels
    with the piece that carries its text; the EOS token's is dropped); returns the whole outcome. `running(+1/-1)` is called when decoding starts and ends."""
    def put(item) -> None:
        if stream:
            loop.call_soon_threadsafe(queue.put_nowait, item)

    got, started = Collector(), False  # the one collector: the EOS token and its logprob are not the completion's
    try:
        if cancel.is_set():  # the client left while the call waited for a thread: never take the lock
            chunks.close()
            return Outcome("", 0, FinishReason.CANCELLED)
        for c in chunks:
            if not started:
                started = True
                running(+1)
            got.add(c)
            if c.text:
                put(("text", c.text, got.take_logprobs()))
        rest = got.take_logprobs()
        if rest:
            put(("text", "", rest))
        put(("end", (got.reason, len(got.tokens))))
        return Outcome(got.text, len(got.tokens), got.reason, got.logprobs)
    except Exception as e:  # a backend failure: the client gets a 500 / an error event, the server lives on
        put(("error", f"generation failed: {type(e).__name__}: {e}"))
        return Outcome(f"generation failed: {type(e).__name__}: {e}", len(got.tokens), got.reason, error=True)
    finally:
        if started:
            running(-1)


async def events(shape: Shape, req: GenRequest, queue: asyncio.Queue, call: CallStream, engine: Engine):
    """SSE payloads for a streamed call: a first chunk (chat: the role; completions with echo: the prompt),
    content chunks and tool-call chunks (apps/tools.py ToolStream: text that may begin a <tool_call> is held
    back, a call is sent whole when its block closes), each with the logprobs of the tokens whose text it
    carries, the final chunk with finish_reason and the `specedge` statistics, the usage chunk if asked, then
    [DONE]."""
    first, fed, held, calls = True, 0, [], 0
    tools = ToolStream(req.tools)
    text_of = TokenText(engine.tokenizer) if req.options.logprobs is not None else None
    offset = text_offset(req)
    if req.chat:
        yield shape.chunk("", first=True, with_usage=req.include_usage)
        first = False
    elif req.echo:
        yield shape.chunk(echo_text(req, engine), with_usage=req.include_usage)

    def logprobs_of(lps):
        nonlocal offset
        if text_of is None or not lps:
            return None
        if req.chat:
            return proto_shapes.chat_logprobs(lps, text_of)
        out, offset = proto_shapes.completion_logprobs(lps, text_of, offset)
        return out

    def chunks_of(events, final: bool):
        nonlocal first, calls
        released = []
        while held and (final or held[0][0] <= tools.consumed):
            released += held.pop(0)[1]
        out = []
        for j, (kind, value) in enumerate(events):
            lp = logprobs_of(released) if j == len(events) - 1 else None
            if kind == "call":
                if calls and not req.parallel_tool_calls:
                    continue
                out.append(shape.chunk(None, first=first, with_usage=req.include_usage, logprobs=lp,
                                       tool_call=(calls, value)))
                calls += 1
            else:
                out.append(shape.chunk(value, first=first, with_usage=req.include_usage, logprobs=lp))
            first = False
        if not events and released:
            held.insert(0, (0, released))  # no text went out: keep them for the next chunk
        return out

    while True:
        kind, *value = await queue.get()
        if kind == "text":
            text, lps = value
            fed += len(text)
            if lps:
                held.append((fed, lps))
            for c in chunks_of(tools.push(text), False):
                yield c
        elif kind == "error":
            yield APIError(500, value[0], type="server_error").body()
            return
        else:
            reason, n = value[0]
            for c in chunks_of(tools.finish(), True):
                yield c
            rest = [lp for _, lps in held for lp in lps]
            yield shape.chunk(None if req.chat else "", reason=reason, stats=call.stats, with_usage=req.include_usage,
                              logprobs=logprobs_of(rest), called=calls > 0)
            if req.include_usage:
                yield shape.usage_chunk(call.stats.prompt_tokens, n)
            return


def outcome_of(work) -> "Outcome | None":
    """A finished worker future's Outcome (None when it was cancelled or raised)."""
    return None if work.cancelled() or work.exception() is not None else work.result()


def response_of(shape, req: GenRequest, outcome: Outcome, stats, engine: Engine) -> dict:
    """The non-streamed Response object of a /v1/responses call (apps/openai_responses.py)."""
    content, calls = parse_tool_calls(outcome.text, req.tools)
    calls = calls if req.parallel_tool_calls else calls[:1]
    text_of = TokenText(engine.tokenizer) if req.options.logprobs is not None else None
    lps = responses_api.logprobs_of(outcome.logprobs, text_of)
    output = shape.output(content if req.tools else outcome.text, calls, lps)
    return shape.response("completed", output, reason=outcome.reason, stats=stats,
                          completion_tokens=outcome.completion_tokens)


async def response_events(shape, req: GenRequest, queue: asyncio.Queue, call: CallStream, engine: Engine):
    """The events of a streamed /v1/responses call: created and in_progress, text deltas (each with the logprobs
    of the tokens whose text it carries, when asked), whole function calls when their blocks close (ToolStream, as
    on the chat route), then completed or incomplete with usage."""
    es = responses_api.EventStream(shape)
    tools = ToolStream(req.tools)
    text_of = TokenText(engine.tokenizer) if req.options.logprobs is not None else None
    calls, pending = 0, []  # pending: logprobs of tokens whose text ToolStream holds back
    blank = ""  # with tools: whitespace (between calls) held until text follows it, dropped at the end
    for e in es.start():
        yield e

    def out(events, lps):
        nonlocal calls, pending, blank
        got, lps = [], pending + lps
        for kind, value in events:
            if kind == "call":
                limit = req.responses.max_tool_calls
                if (calls and not req.parallel_tool_calls) or (limit and calls >= limit):
                    continue
                got += es.call(value)
                calls += 1
            elif value and req.tools and not (blank + value).strip():
                blank += value
            elif value:
                got += es.delta(blank + value, responses_api.logprobs_of(lps, text_of))
                lps, blank = [], ""
        pending = lps
        return got

    while True:
        kind, *value = await queue.get()
        if kind == "text":
            text, lps = value
            for e in out(tools.push(text), lps):
                yield e
        elif kind == "error":
            yield es.error(value[0])
            return
        else:
            reason, n = value[0]
            for e in out(tools.finish(), []):
                yield e
            for e in es.finish(reason, call.stats, n):
                yield e
            return
