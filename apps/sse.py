"""Server-sent events for `specedge serve`: the SSE response and the disconnect watcher that cancels a call whose
client went away (streamed or not)."""
from __future__ import annotations

import asyncio
import json
import threading


async def watch_disconnect(receive, cancel: threading.Event) -> None:
    """Set `cancel` when the client disconnects (the request body has been read: the next message is the end)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            cancel.set()
            return


class SSEResponse:
    """Server-sent events (`data: {json}\\n\\n` ... `data: [DONE]\\n\\n`) from an async iterator of dicts; a
    disconnect, seen while sending or while waiting for the next chunk, sets `cancel`."""

    def __init__(self, events, cancel: threading.Event, *, named: bool = False) -> None:
        self.events, self.cancel, self.named = events, cancel, named

    async def __call__(self, scope, receive, send) -> None:
        watcher = asyncio.ensure_future(watch_disconnect(receive, self.cancel))
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                                    (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]})
            async for event in self.events:
                if self.cancel.is_set():
                    return
                await send({"type": "http.response.body", "body": sse_bytes(event, self.named), "more_body": True})
            # the Responses API ends with its response.completed event; chat and completions with [DONE]
            await send({"type": "http.response.body", "body": b"" if self.named else b"data: [DONE]\n\n",
                        "more_body": False})
        except OSError:  # the client went away mid-send
            pass
        finally:
            self.cancel.set()  # a no-op once the call has ended; stops it otherwise
            watcher.cancel()
            await self.events.aclose()


def sse_bytes(obj: dict, named: bool = False) -> bytes:
    """One event: `data: {json}`, preceded by `event: {type}` when named (the Responses API's form)."""
    if named:
        return f"event: {obj.get('type', 'error')}\n".encode() + sse_bytes(obj)
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
