"""The ASGI app behind `specedge serve`: OpenAI-compatible routes over specedge.Engines (one per model).

    client ──HTTP──> Host, Origin (403) ─> CORS ─> auth (401) ─> Content-Type (415) ─> body limit (413)
                                    ─> JSON depth, JSON, fields (400) ─> admission (429) ─> worker thread
                                                                                               │ Engine.stream
    client <──SSE or JSON── asyncio queue <── chunks (call_soon_threadsafe) <──────────────────┘

The Engine decodes one call at a time (one lock, one KV cache). Admission bounds the calls in flight to
`max_queue` waiting + 1 running; each runs in its own worker thread (a pool of exactly that size, so a
request never waits for a thread) and blocks on the Engine's lock until its turn. Every call carries a
threading.Event: a client that disconnects (seen as http.disconnect, for streamed and plain responses alike)
sets it and the Engine stops at its next token, which frees the lock for the next request.

Cross-site requests (a web page calling the local server, DNS rebinding) are refused by apps/server_guard.py.

Models: a ModelPool (apps/model_pool.py) maps ids to engines, loads them on first use and evicts idle ones
least-recently-used beyond --max-memory; a call holds a Lease on its engine from the route until it finishes.
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..runtime.stats import CallStats
from ..runtime.types import FinishReason
from . import openai_protocol as proto
from . import openai_embeddings as embeddings_api
from . import openai_responses as responses_api
from .api import Engine
from .generation import (Outcome, assembler_for, choices_of, drive, events, outcome_of, response_events, response_of,
                         sender, unsent)
from .model_pool import Lease, ModelNotFound, ModelPool, PoolFull, engine_bytes, generates
from .openai_chat import chat_messages, chat_tools
from .openai_errors import APIError, invalid
from .openai_protocol import GenRequest, Shape
from .openai_responses_shapes import ResponseShape
from .server_guard import Admission, SiteGuard, SitePolicy, check_api_key, read_json
from .server_metrics import CONTENT_TYPE, Metrics, PromMetrics, merged
from .tokenize_protocol import parse_detokenize, parse_tokenize
from .sse import SSEResponse, watch_disconnect
from .stream_assembler import StreamAssembler


@dataclass(frozen=True)
class ServerConfig:
    model_id: str = ""  # the id of a single Engine given to create_app (a ModelPool names its own models)
    api_key: str | None = None
    max_queue: int = 8  # requests waiting for an engine; one more runs
    max_request_bytes: int = 1 << 20
    cors_origins: tuple[str, ...] = ()  # origins browsers may call from ("*": any); others get 403
    bind_host: str = "127.0.0.1"  # the --host: without api_key, Host headers must name it or loopback

    def site_policy(self) -> SitePolicy:
        return SitePolicy(self.bind_host, check_host=self.api_key is None, cors_origins=self.cors_origins)


class Server:
    """Routes and state for a ModelPool of Engines (or one Engine). `app` is the Starlette application."""

    def __init__(self, models: Engine | ModelPool, config: ServerConfig) -> None:
        if not isinstance(models, ModelPool):
            models = ModelPool.single(models, config.model_id or models.name, weigh=engine_bytes)
        self.models, self.config, self.created = models, config, int(time.time())
        self.admission = Admission(config.max_queue + 1)
        self.pool = ThreadPoolExecutor(max_workers=config.max_queue + 1, thread_name_prefix="specedge-gen")
        self.metrics = Metrics()
        self.prom = PromMetrics(models)
        self.active: set[threading.Event] = set()
        routes = [Route("/v1/models", self.list_models, methods=["GET"]),
                  Route("/v1/models/{model_id:path}", self.model, methods=["GET"]),
                  Route("/v1/completions", self.completions, methods=["POST"]),
                  Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                  Route("/v1/responses", self.responses, methods=["POST"]),
                  Route("/v1/embeddings", self.embeddings, methods=["POST"]),
                  Route("/tokenize", self.tokenize, methods=["POST"]),
                  Route("/detokenize", self.detokenize, methods=["POST"]),
                  Route("/specedge/metrics", self.metrics_route, methods=["GET"]),
                  Route("/metrics", self.prometheus, methods=["GET"]),
                  Route("/health", self.health, methods=["GET"])]
        self._paths = {r.path for r in routes}
        handlers = {APIError: self._api_error, HTTPException: self._http_error, Exception: self._crash}
        guard = [Middleware(SiteGuard, policy=config.site_policy(), refused=self._refused)]
        cors = [Middleware(CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])] if config.cors_origins else []
        self.app = Starlette(routes=routes, exception_handlers=handlers, lifespan=self._lifespan,
                             middleware=guard + cors)

    # ---- plumbing ---------------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _lifespan(self, app):
        yield
        for ev in list(self.active):  # shutting down: stop running calls at their next token
            ev.set()
        self.pool.shutdown(wait=True, cancel_futures=True)

    async def _api_error(self, request: Request, e: APIError) -> JSONResponse:
        with self.metrics.lock:
            self.metrics.client_errors += e.status < 500 and e.status != 429
            self.metrics.rejected += e.status == 429
        lease = getattr(request.state, "lease", None)
        if lease is None or not lease.handed_off:  # a call that ran is counted when it finishes
            outcome = "rejected" if e.status == 429 else "client_error" if e.status < 500 else "server_error"
            self.prom.request(getattr(request.state, "model", ""), self._route(request), outcome)
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    def _refused(self, path: str) -> None:
        """A request SiteGuard refused (403): a client error of no model."""
        with self.metrics.lock:
            self.metrics.client_errors += 1
        self.prom.request("", self._label(path), "client_error")

    def _route(self, request: Request) -> str:
        return self._label(request.url.path)

    def _label(self, path: str) -> str:
        """The route's path for metric labels (one label for every /v1/models/{id}, "other" for unknown paths)."""
        return path if path in self._paths else "/v1/models/{model_id}" if path.startswith("/v1/models/") \
            else "other"

    async def _http_error(self, request: Request, e: HTTPException) -> JSONResponse:
        msg = {404: f"no route {request.method} {request.url.path}: the server has /v1/models, /v1/completions, "
                    "/v1/chat/completions, /v1/responses, /v1/embeddings, /tokenize, /detokenize, /metrics and /health",
               405: f"{request.method} is not allowed on {request.url.path}"}.get(e.status_code, str(e.detail))
        return await self._api_error(request, APIError(e.status_code, msg, code=str(e.status_code)))

    async def _crash(self, request: Request, e: Exception) -> JSONResponse:
        err = APIError(500, f"internal error: {type(e).__name__}: {e}", type="server_error")
        self.prom.request(getattr(request.state, "model", ""), self._route(request), "server_error")
        return JSONResponse(err.body(), status_code=500)

    async def _lease(self, request: Request, body: dict, *, embedding: bool = False) -> Lease:
        """The engine of the body's `model` (loaded if needed); the caller releases the lease (the call's end
        releases it once the lease is handed_off). An embedding model serves /v1/embeddings only (embedding=True:
        any model)."""
        named = body.get("model")
        if named is not None and not isinstance(named, str):
            raise invalid(f"model must be a string, got {named!r}", "model")
        if named is None and len(self.models.ids) > 1:
            raise invalid(f"model is required: this server has several models ({', '.join(self.models.ids)}; "
                                "GET /v1/models)", "model")
        try:
            model_id = self.models.resolve(named)
        except ModelNotFound as e:
            raise APIError(404, e.args[0], param="model", code="model_not_found") from None
        request.state.model = model_id
        t0 = time.perf_counter()
        try:
            lease = await asyncio.to_thread(self.models.lease, model_id)
        except PoolFull as e:
            raise APIError(503, str(e), type="server_error", code="model_pool_full",
                           headers={"Retry-After": "1"} if e.busy else None) from None
        except (ValueError, FileNotFoundError, ImportError, RuntimeError) as e:
            raise APIError(500, f"loading model {model_id!r} failed: {e}", type="server_error",
                           code="model_load_failed") from None
        lease.t0 = t0  # the request's latency includes a load on first use
        if not embedding and not generates(lease.engine):
            lease.release()
            raise APIError(400, f"model {model_id!r} is an embedding model: it serves /v1/embeddings only",
                           param="model", code="model_not_supported")
        request.state.lease = lease
        return lease

    async def _leased_generate(self, request: Request, body: dict, build):
        """Lease the body's model, build the GenRequest with its engine (`await build(engine)`), generate."""
        lease = await self._lease(request, body)
        try:
            return await self._generate(request, await build(lease.engine), lease)
        finally:
            if not lease.handed_off:
                lease.release()

    # ---- routes -----------------------------------------------------------------------------------------------

    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "models": {s.id: {"loaded": s.loaded} for s in self.models.state()}})

    def _card(self, state) -> dict:
        return proto.model_card(state.id, self.created, {"loaded": state.loaded, "bytes": state.bytes})

    async def list_models(self, request: Request) -> JSONResponse:
        check_api_key(request.headers, self.config.api_key)
        return JSONResponse(proto.models_list([self._card(s) for s in self.models.state()]))

    async def model(self, request: Request) -> JSONResponse:
        check_api_key(request.headers, self.config.api_key)
        name = request.path_params["model_id"]
        found = [s for s in self.models.state() if s.id == name]
        if not found:
            served = ", ".join(repr(i) for i in self.models.ids)
            raise APIError(404, f"model {name!r} is not served here: this server has {served} (GET /v1/models)",
                           param="model", code="model_not_found")
        return JSONResponse(self._card(found[0]))

    async def prometheus(self, request: Request) -> Response:
        check_api_key(request.headers, self.config.api_key)
        return Response(self.prom.render(), media_type=CONTENT_TYPE)

    async def tokenize(self, request: Request) -> JSONResponse:
        check_api_key(request.headers, self.config.api_key)
        body = await read_json(request, self.config.max_request_bytes)
        content, add_special = parse_tokenize(body)
        with await self._lease(request, body) as lease:
            ids = await asyncio.to_thread(lease.engine.tokenizer.encode, content,
                                          add_bos=None if add_special else False)
        self.prom.request(lease.model_id, "/tokenize", "completed")
        return JSONResponse({"tokens": [int(t) for t in ids]})

    async def detokenize(self, request: Request) -> JSONResponse:
        check_api_key(request.headers, self.config.api_key)
        body = await read_json(request, self.config.max_request_bytes)
        with await self._lease(request, body) as lease:
            tokenizer = lease.engine.tokenizer
            ids = parse_detokenize(body, tokenizer.vocab_size)
            text = await asyncio.to_thread(tokenizer.decode, ids)
        self.prom.request(lease.model_id, "/detokenize", "completed")
        return JSONResponse({"content": text})

    async def metrics_route(self, request: Request) -> JSONResponse:
        check_api_key(request.headers, self.config.api_key)
        return JSONResponse({**self.metrics.to_dict(), "in_flight": self.admission.n,
                             "max_in_flight": self.admission.limit})

    async def completions(self, request: Request):
        check_api_key(request.headers, self.config.api_key)
        body = await read_json(request, self.config.max_request_bytes)

        async def build(engine: Engine) -> GenRequest:
            return proto.parse_completion(body, vocab_size=engine.model.backend.config.vocab_size)
        return await self._leased_generate(request, body, build)

    async def chat_completions(self, request: Request):
        check_api_key(request.headers, self.config.api_key)
        body = await read_json(request, self.config.max_request_bytes)
        messages = chat_messages(body)
        tools, choice, _ = chat_tools(body)

        async def build(engine: Engine) -> GenRequest:
            try:
                rendered = await asyncio.to_thread(engine.render_chat, messages, tools, choice)
            except ValueError as e:
                raise invalid(f"{e}: check the roles and order of messages", "messages") from None
            return proto.parse_chat(body, rendered)
        return await self._leased_generate(request, body, build)

    async def responses(self, request: Request):
        check_api_key(request.headers, self.config.api_key)
        body = await read_json(request, self.config.max_request_bytes)
        chat, messages = responses_api.to_chat(body)
        try:
            tools, choice, _ = chat_tools(chat)
        except APIError as e:
            raise responses_api.renamed(e) from None

        async def build(engine: Engine) -> GenRequest:
            try:
                rendered = await asyncio.to_thread(engine.render_chat, messages, tools, choice)
            except ValueError as e:
                raise invalid(f"{e}: check the roles and order of the input items", "input") from None
            return responses_api.parse_responses(body, rendered, chat)
        return await self._leased_generate(request, body, build)

    async def embeddings(self, request: Request) -> JSONResponse:
        """POST /v1/embeddings: an embedding model's vectors, or a generation model's embedding mode
        (Engine.embed); rows L2-normalised; float lists or base64 (little-endian float32)."""
        check_api_key(request.headers, self.config.api_key)
        body = await read_json(request, self.config.max_request_bytes)
        texts, b64 = embeddings_api.parse(body)
        with await self._lease(request, body, embedding=True) as lease:
            if not self.admission.try_acquire():
                raise APIError(429, "the server is busy: retry after a moment, or start the server with a larger "
                               "--max-queue", type="rate_limit_error", code="queue_full", headers={"Retry-After": "1"})
            try:
                model = lease.engine
                counts = await asyncio.to_thread(lambda: model.count_tokens(texts) if not generates(model)
                                                 else [len(model.tokenizer.encode(t)) for t in texts])
                vectors = await asyncio.to_thread(model.embed, texts)
                embeddings_api.check_dimensions(body, vectors.shape[1])
            except ValueError as e:
                raise invalid(str(e), "input") from None
            finally:
                self.admission.release()
        self.prom.request(lease.model_id, "/v1/embeddings", "completed")
        return JSONResponse(embeddings_api.response(lease.model_id, vectors, sum(counts), b64))

    # ---- generation -------------------------------------------------------------------------------------------

    async def _generate(self, request: Request, req: GenRequest, lease: Lease):
        """Admit the call and start it, then stream it (SSE) or answer its n choices with one JSON body."""
        with self.metrics.lock:
            self.metrics.requests += 1
        if not self.admission.try_acquire():
            raise APIError(429, f"the server is busy: {self.admission.limit - 1} requests are already waiting and "
                           "one is running; retry after a moment, or start the server with a larger --max-queue",
                           type="rate_limit_error", code="queue_full", headers={"Retry-After": "1"})
        cancel = threading.Event()
        try:
            chunks = await asyncio.to_thread(lambda: lease.engine.stream(req.prompt, req.call(0), cancel=cancel))
        except ValueError as e:
            self.admission.release()
            raise proto.engine_error(e, req) from None
        except BaseException:
            self.admission.release()
            raise
        self.active.add(cancel)
        lease.handed_off = True  # from here the call's end releases the lease
        shape = Shape.new(lease.model_id, req.chat) if req.responses is None else \
            ResponseShape.new(lease.model_id, req.responses)
        if req.stream:
            return self._stream(req, chunks, cancel, lease, shape)
        return await self._answer(request, req, chunks, cancel, lease, shape)

    def _stream(self, req: GenRequest, chunks, cancel: threading.Event, lease: Lease, shape) -> SSEResponse:
        """The call's SSE response: its worker sends the stream assembler's events to the queue the route's
        payloads are made from (apps/generation.py)."""
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        work = loop.run_in_executor(self.pool, drive, chunks, assembler_for(req), cancel, sender(loop, queue),
                                    self._running)
        work.add_done_callback(lambda w: self._finished(req, cancel, chunks.stats, lease, outcome_of(w)))
        if req.responses is not None:
            return SSEResponse(response_events(shape, req, queue, chunks, lease.engine), cancel, named=True)
        return SSEResponse(events(shape, req, queue, chunks, lease.engine), cancel)

    async def _answer(self, request: Request, req: GenRequest, chunks, cancel: threading.Event, lease: Lease,
                      shape) -> JSONResponse:
        """The call's n choices decoded one after another (seeds seed, seed+1, ...), answered as one JSON body."""
        engine, loop = lease.engine, asyncio.get_running_loop()
        watcher = asyncio.ensure_future(watch_disconnect(request.receive, cancel))
        outcomes, calls = [], []
        try:
            for i in range(req.n):
                if i > 0:
                    chunks = engine.stream(req.prompt, req.call(i), cancel=cancel)
                outcome = await loop.run_in_executor(self.pool, drive, chunks, StreamAssembler(), cancel, unsent,
                                                     self._running)
                outcomes.append(outcome)
                calls.append(chunks)
                if outcome.error or outcome.reason is FinishReason.CANCELLED:
                    break
        finally:
            watcher.cancel()
            worst = next((o for o in outcomes if o.error), outcomes[-1] if outcomes else None)
            if worst is not None and len(outcomes) > 1:
                worst = replace(worst, completion_tokens=sum(o.completion_tokens for o in outcomes))
            self._finished(req, cancel, merged([c.stats for c in calls]), lease, worst)
        bad = [o for o in outcomes if o.error]
        if bad:
            raise APIError(500, bad[0].text, type="server_error")
        first = calls[0].stats
        if req.responses is not None:
            return JSONResponse(response_of(shape, req, outcomes[0], first, engine))
        return JSONResponse(shape.completion(choices_of(req, outcomes, shape, engine), first.prompt_tokens,
                                             sum(o.completion_tokens for o in outcomes), first))

    def _finished(self, req: GenRequest, cancel: threading.Event, stats: CallStats | None, lease: Lease,
                  outcome: "Outcome | None") -> None:
        self.active.discard(cancel)
        self.admission.release()
        lease.release()
        if stats is not None:
            self.metrics.record(req, stats, lease.model_id)
        route = req.route
        if outcome is None or outcome.error:
            self.prom.request(lease.model_id, route, "server_error")
        elif stats is not None:
            self.prom.finished(lease.model_id, route, stats, outcome.completion_tokens,
                               time.perf_counter() - lease.t0)

    def _running(self, delta: int) -> None:
        with self.metrics.lock:
            self.metrics.running += delta

def create_app(models: Engine | ModelPool, config: ServerConfig) -> Starlette:
    """The Starlette app serving an Engine (as config.model_id) or a ModelPool; `app.state.server` is the Server
    (metrics, admission, models)."""
    server = Server(models, config)
    server.app.state.server = server
    return server.app
