"""`specedge serve MODEL [MODEL...]`: an OpenAI-compatible HTTP server (apps/server.py) over specedge.Engines (a
ModelPool, apps/model_pool.py: several models load on first use, least recently used evicted beyond --max-memory).

Binds 127.0.0.1 by default. Any other address needs --api-key (or SPECEDGE_API_KEY) or an explicit
--allow-remote, so that a model is never exposed to the network without the user asking for it. Web pages are kept
out by apps/server_guard.py: Host and Origin checks (--cors-origin lets named origins in), JSON bodies only.
"""
from __future__ import annotations

import ipaddress
import threading
from urllib.parse import urlsplit
from dataclasses import replace
from pathlib import Path

import click

from ..models.manifest import MANIFEST
from ..assembly.open import open_decoder
from .options import engine_options, engine_settings

LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None, allow_remote: bool) -> None:
    """Refuse a non-loopback address without an API key or --allow-remote (raises click.UsageError)."""
    if not is_loopback(host) and not api_key and not allow_remote:
        raise click.UsageError(f"--host {host} exposes the server beyond this machine: set an API key (--api-key or "
                               "SPECEDGE_API_KEY), or pass --allow-remote to serve without one")


class ServerThread:
    """Run a uvicorn server for `app` in a background thread (tests, perf/load_test.py); a context manager.

    port 0 picks a free port; `url` is the base URL once started. Leaving the block stops the server (running
    calls are cancelled at their next token) and joins the thread.
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        import uvicorn
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                                timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="specedge-serve", daemon=True)
        self.host = host

    def __enter__(self) -> "ServerThread":
        import time
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start (see the log above)")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{self.host}:{self.port}"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def model_sources(models: tuple[str, ...], models_dir: Path | None) -> list[str]:
    """The models to serve: those named, then each *.gguf file and exported artifact directory in models_dir."""
    found = list(models)
    if models_dir is not None:
        if not models_dir.is_dir():
            raise click.UsageError(f"--models-dir {models_dir}: not a directory")
        found += [str(p) for p in sorted(models_dir.iterdir())
                  if (p.is_file() and p.suffix == ".gguf") or (p.is_dir() and (p / MANIFEST).is_file())]
    if not found:
        raise click.UsageError("give a MODEL, or --models-dir DIR holding .gguf files or exported artifacts")
    return found


def estimate_bytes(model: str, cache_dir: Path | None) -> int:
    """A model's weight bytes on disk before loading (0 when it is not on disk yet: a catalogue model to pull)."""
    from ..models.catalog import resolve_model
    from ..models.ref import RefKind, model_ref
    from .model_pool import disk_bytes
    try:
        ref = model_ref(model, cache_dir)
        if ref.path is not None and ref.path.exists():
            return disk_bytes(ref.path)
        return disk_bytes(resolve_model(model, cache_dir, pull_if_missing=False)) if ref.kind is not \
            RefKind.CHECKPOINT else 0
    except Exception:  # noqa: BLE001 - any lookup failure means "unknown yet"; loading reports the real error
        return 0


def is_origin(value: str) -> bool:
    """scheme://host[:port] and nothing more, as a browser's Origin header has it."""
    try:
        u = urlsplit(value)
        u.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError:
        return False
    return "://" in value and bool(u.scheme and u.hostname) and not (u.path or u.query or u.fragment) \
        and "@" not in u.netloc and not value.endswith((":", "?", "#"))


def parse_origins(ctx, param, values: tuple[str, ...]) -> tuple[str, ...]:
    """--cors-origin values, lower case as browsers send them, or '*' (BadParameter for anything else)."""
    for v in values:
        if v != "*" and not is_origin(v):
            raise click.BadParameter(f"{v!r} is not an origin: give scheme://host[:port] as the browser sends it "
                                     "(e.g. http://localhost:5173, no path or trailing slash), or '*' for any origin")
    return tuple(v.lower() for v in values)


def parse_max_memory(ctx, param, value: str | None) -> int | None:
    from .model_pool import parse_bytes
    if value is None:
        return None
    try:
        return parse_bytes(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


@click.command("serve")
@click.argument("models", nargs=-1)
@click.option("--models-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Also serve each *.gguf file and exported artifact directory in DIR (id: its file/dir name).")
@click.option("--max-memory", callback=parse_max_memory, default=None,
              help="Weight bytes the loaded models may take (e.g. 2GB, 1.5GiB); loading another evicts the least "
                   "recently used idle ones. Default: no limit.")
@click.option("--cors-origin", "cors_origins", multiple=True, callback=parse_origins, metavar="ORIGIN",
              help="Let browser pages from ORIGIN (e.g. http://localhost:5173) call the server (repeatable; '*' for "
                   "any). Default: requests with an Origin header get 403.")
@engine_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--api-key", envvar="SPECEDGE_API_KEY", default=None,
              help="Require 'Authorization: Bearer KEY' (env SPECEDGE_API_KEY).")
@click.option("--allow-remote", is_flag=True, help="Allow a non-loopback --host without an API key.")
@click.option("--max-queue", type=click.IntRange(0, 1024), default=8, show_default=True,
              help="Requests that may wait while one runs; more get 429.")
@click.option("--max-request-bytes", type=click.IntRange(1024, None), default=1 << 20, show_default=True,
              help="Largest request body; larger gets 413.")
@click.option("--model-id", default=None,
              help="Model id reported by /v1/models (one MODEL only; default: from MODEL).")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True)
def serve_cmd(**o) -> None:
    """Serve MODEL(s) over an OpenAI-compatible HTTP API (/v1/models, /v1/completions, /v1/chat/completions,
    /v1/responses, /v1/embeddings; an embedding model such as all-minilm-l6-v2 serves /v1/embeddings only).

    With several models, requests choose one by `model`; they load on first use (the first at start)."""
    check_bind(o["host"], o["api_key"], o["allow_remote"])
    sources = model_sources(o["models"], o["models_dir"])
    if o["model_id"] and len(sources) > 1:
        raise click.UsageError("--model-id names a single model; with several, each is known by its file name")
    try:
        import uvicorn

        from ..assembly.embedding import is_embedding_model, open_embedder
        from ..runtime.cores import CoreShare
        from .api import Engine
        from .model_pool import ModelPool, PoolEntry, engine_bytes, format_bytes, model_id_for
        from .serve_threads import known_same_logits, remember_same_logits, threads_line
        from .server import ServerConfig, create_app
    except ImportError as e:
        raise click.ClickException(f"{e}: install the server extra, pip install 'specedge[serve]'") from None
    log = lambda m: click.echo(m, err=True)  # noqa: E731
    first = next((m for m in sources if not is_embedding_model(m)), sources[0])
    model_s, decode_s = engine_settings({**o, "model": first})  # a bad --drafter / --lossy fails here
    cores = CoreShare()  # the process's cores, shared by the calls computing at once (apps/serve_threads.py)

    def loader(model: str, model_id: str):
        def load() -> Engine:  # errors reach the pool: at start a CLI error, later a 500 naming the model
            if is_embedding_model(model):  # /v1/embeddings only (assembly/embedding.py)
                embedder = open_embedder(model, cache_dir=o["cache_dir"], threads=model_s.threads)
                log(f"model {model_id}: embeddings, {embedder.dim} dimensions, {embedder.pooling} pooling")
                return embedder
            decoder = open_decoder(replace(model_s, model=model), decode_s, plan=not o["no_plan"], auto=o["auto"],
                                   log=lambda m: log(f"{model_id}: {m}"))
            known = known_same_logits(decoder, o["cache_dir"])
            engine = Engine(decoder, model, cores=cores, same_logits=known)
            if known is None:
                remember_same_logits(decoder, o["cache_dir"], engine)
            log(threads_line(engine, model_id, given=o["threads"] is not None))
            log(f"model {model_id}: {engine.backend_kind}, drafter {engine.drafter_name}, ctx {engine.context_length}")
            return engine
        return load

    ids = [o["model_id"] or model_id_for(m) for m in sources]
    try:
        pool = ModelPool([PoolEntry(i, loader(m, i), estimate_bytes(m, o["cache_dir"])) for m, i in zip(sources, ids)],
                         max_bytes=o["max_memory"], weigh=engine_bytes, log=log)
        pool.lease(ids[0]).release()  # the first model at start: its errors surface now
    except (ValueError, FileNotFoundError, ImportError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None
    config = ServerConfig(api_key=o["api_key"] or None, max_queue=o["max_queue"],
                          max_request_bytes=o["max_request_bytes"], cors_origins=o["cors_origins"],
                          bind_host=o["host"])
    memory = f"max memory {format_bytes(o['max_memory'])}" if o["max_memory"] else "no memory limit"
    log(f"specedge serve: {', '.join(ids)} on http://{o['host']}:{o['port']}/v1 - max queue {config.max_queue}, "
        f"API key {'required' if config.api_key else 'not required'}, {memory}"
        + (f", CORS {' '.join(config.cors_origins)}" if config.cors_origins else ""))
    uvicorn.run(create_app(pool, config), host=o["host"], port=o["port"], log_level=o["log_level"],
                timeout_graceful_shutdown=5)
