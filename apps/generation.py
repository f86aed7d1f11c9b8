"""One call's generation for `specedge serve`: the worker that drives Engine.stream through the stream assembler,
the SSE payloads of a streamed call (the assembler's events mapped onto the chat / completions chunks or the
Responses events), and the choices of a non-streamed one (apps/server.py routes, admits and leases)."""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Callable

from ..assembly.decoder import CallStream
from ..runtime.types import FinishReason
from . import openai_responses_shapes as responses_shapes
from . import openai_shapes as proto_shapes
from .api import Engine
from .openai_errors import APIError
from .openai_protocol import GenRequest, Shape
from .openai_shapes import TokenText
from .stream_assembler import Call, End, Event, Failed, StreamAssembler, Text
from .tool_parse import parse_tool_calls


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


def assembler_for(req: GenRequest) -> StreamAssembler:
    """The stream assembler of a call: its tools, parallel_tool_calls and (Responses) max_tool_calls."""
    max_calls = req.responses.max_tool_calls if req.responses is not None else None
    return StreamAssembler(req.tools, parallel=req.parallel_tool_calls, max_calls=max_calls)


def sender(loop, queue: asyncio.Queue) -> Callable[[Event], None]:
    """Events from the worker thread onto the event loop's queue."""
    return lambda event: loop.call_soon_threadsafe(queue.put_nowait, event)


def unsent(event: Event) -> None:
    """`send` of a non-streamed call: its events are not sent (its Outcome is the answer)."""


def drive(chunks, assembler: StreamAssembler, cancel: threading.Event, send: Callable[[Event], None],
          running: Callable[[int], None]) -> Outcome:
    """Worker thread: drive Engine.stream (blocks on the engine's lock until this call's turn) through the
    assembler; a streamed call's events go to `send` (Text, Call, then End, or Failed when the backend raises);
    returns the whole outcome. `running(+1/-1)` is called when decoding starts and ends."""
    started, got = False, assembler.collector
    try:
        if cancel.is_set():  # the client left while the call waited for a thread: never take the lock
            chunks.close()
            return Outcome("", 0, FinishReason.CANCELLED)
        for c in chunks:
            if not started:
                started = True
                running(+1)
            for event in assembler.push(c):
                send(event)
        for event in assembler.finish():
            send(event)
        return Outcome(got.text, len(got.tokens), got.reason, got.logprobs)
    except Exception as e:  # a backend failure: the client gets a 500 / an error event, the server lives on
        message = f"generation failed: {type(e).__name__}: {e}"
        send(Failed(message))
        return Outcome(message, len(got.tokens), got.reason, error=True)
    finally:
        if started:
            running(-1)


async def _events(queue: asyncio.Queue):
    """The assembler's events as they arrive, End or Failed last."""
    while True:
        event = await queue.get()
        yield event
        if isinstance(event, (End, Failed)):
            return


async def events(shape: Shape, req: GenRequest, queue: asyncio.Queue, call: CallStream, engine: Engine):
    """SSE payloads for a streamed chat / completions call: a first chunk (chat: the role; completions with echo:
    the prompt), then one chunk per event (apps/stream_assembler.py): content with the logprobs of the tokens whose
    text it completes, a whole tool call as delta.tool_calls, and the final chunk with finish_reason, the logprobs
    no other chunk carried and the `specedge` statistics; the usage chunk if asked. [DONE] is the transport's."""
    text_of = TokenText(engine.tokenizer) if req.options.logprobs is not None else None
    offset, usage = text_offset(req), req.include_usage

    def logprobs_of(lps):
        nonlocal offset
        if text_of is None or not lps:
            return None
        if req.chat:
            return proto_shapes.chat_logprobs(lps, text_of)
        out, offset = proto_shapes.completion_logprobs(lps, text_of, offset)
        return out

    if req.chat:
        yield shape.chunk("", first=True, with_usage=usage)
    elif req.echo:
        yield shape.chunk(echo_text(req, engine), with_usage=usage)
    async for e in _events(queue):
        if isinstance(e, Text):
            yield shape.chunk(e.text, with_usage=usage, logprobs=logprobs_of(e.logprobs))
        elif isinstance(e, Call):
            yield shape.chunk(None, with_usage=usage, logprobs=logprobs_of(e.logprobs), tool_call=(e.index, e.call))
        elif isinstance(e, Failed):
            yield APIError(500, e.message, type="server_error").body()
        else:
            yield shape.chunk(None if req.chat else "", reason=e.reason, stats=call.stats, with_usage=usage,
                              logprobs=logprobs_of(e.logprobs), called=e.tool_calls > 0)
            if usage:
                yield shape.usage_chunk(call.stats.prompt_tokens, e.completion_tokens)


def outcome_of(work) -> "Outcome | None":
    """A finished worker future's Outcome (None when it was cancelled or raised)."""
    return None if work.cancelled() or work.exception() is not None else work.result()


def response_of(shape, req: GenRequest, outcome: Outcome, stats, engine: Engine) -> dict:
    """The non-streamed Response object of a /v1/responses call (apps/openai_responses_shapes.py)."""
    content, calls = parse_tool_calls(outcome.text, req.tools)
    calls = calls if req.parallel_tool_calls else calls[:1]
    text_of = TokenText(engine.tokenizer) if req.options.logprobs is not None else None
    lps = responses_shapes.logprobs_of(outcome.logprobs, text_of)
    output = shape.output(content if req.tools else outcome.text, calls, lps)
    return shape.response("completed", output, reason=outcome.reason, stats=stats,
                          completion_tokens=outcome.completion_tokens)


async def response_events(shape, req: GenRequest, queue: asyncio.Queue, call: CallStream, engine: Engine):
    """The events of a streamed /v1/responses call: created and in_progress, then per assembler event a text delta
    (with the logprobs of the tokens whose text it completes, when asked) or a whole function call item, then
    completed or incomplete with usage. A function_call item has no logprobs field: a call's logprobs, and those
    End carries, are not sent (the non-streamed output's message lists every token's)."""
    es = responses_shapes.EventStream(shape)
    text_of = TokenText(engine.tokenizer) if req.options.logprobs is not None else None
    for out in es.start():
        yield out
    async for e in _events(queue):
        if isinstance(e, Text):
            got = es.delta(e.text, responses_shapes.logprobs_of(e.logprobs, text_of))
        elif isinstance(e, Call):
            got = es.call(e.call)
        elif isinstance(e, Failed):
            got = [es.error(e.message)]
        else:
            got = es.finish(e.reason, call.stats, e.completion_tokens)
        for out in got:
            yield out
