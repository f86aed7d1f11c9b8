"""`specedge serve MODEL`: an OpenAI-compatible HTTP server (apps/server.py) over one specedge.Engine.

Binds 127.0.0.1 by default. Any other address needs --api-key (or SPECEDGE_API_KEY) or an explicit
--allow-remote, so that a model is never exposed to the network without the user asking for it.
"""
from __future__ import annotations

import ipaddress
import threading
from pathlib import Path

import click

from ..runtime.backends import BackendKind
from ..runtime.backends.onnx_providers import DEVICE_CHOICES
from ..runtime.verify import VerifierKind

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


@click.command("serve")
@click.argument("model")
@click.option("--backend", type=click.Choice([k.value for k in BackendKind]), default=None,
              help="default: the engine the model names: llama.cpp for GGUF, ONNX Runtime for an exported artifact")
@click.option("--drafter", default="ngram", show_default=True, help="As in `specedge generate --drafter`.")
@click.option("--k", "k", type=click.IntRange(0, 64), default=4, show_default=True, help="Draft length (maximum).")
@click.option("--adaptive-k/--fixed-k", default=True, show_default=True)
@click.option("--verifier", type=click.Choice([v.value for v in VerifierKind]), default="chain", show_default=True)
@click.option("--ctx", type=click.IntRange(16, None), default=None,
              help="KV positions (prompt + answer) per request; default min(model context, 4096).")
@click.option("--threads", type=click.IntRange(1, None), default=None, help="CPU threads for the backend.")
@click.option("--device", type=click.Choice(DEVICE_CHOICES), default="auto", show_default=True)
@click.option("--cache-dir", type=click.Path(path_type=Path), default=None, help="Model cache.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--api-key", envvar="SPECEDGE_API_KEY", default=None,
              help="Require 'Authorization: Bearer KEY' (env SPECEDGE_API_KEY).")
@click.option("--allow-remote", is_flag=True, help="Allow a non-loopback --host without an API key.")
@click.option("--max-queue", type=click.IntRange(0, 1024), default=8, show_default=True,
              help="Requests that may wait while one runs; more get 429.")
@click.option("--max-request-bytes", type=click.IntRange(1024, None), default=1 << 20, show_default=True,
              help="Largest request body; larger gets 413.")
@click.option("--model-id", default=None, help="Model id reported by /v1/models (default: from MODEL).")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True)
def serve_cmd(**o) -> None:
    """Serve MODEL over an OpenAI-compatible HTTP API (/v1/models, /v1/completions, /v1/chat/completions)."""
    check_bind(o["host"], o["api_key"], o["allow_remote"])
    try:
        import uvicorn

        from .api import Engine
        from .server import ServerConfig, create_app, model_id_for
    except ImportError as e:
        raise click.ClickException(f"{e}: install the server extra, pip install 'specedge[serve]'") from None
    try:
        engine = Engine(o["model"], backend=o["backend"], drafter=o["drafter"], k=o["k"],
                        adaptive_k=o["adaptive_k"], verifier=o["verifier"], ctx=o["ctx"], threads=o["threads"],
                        device=o["device"], cache_dir=o["cache_dir"], log=lambda m: click.echo(m, err=True))
    except (ValueError, FileNotFoundError, ImportError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None
    config = ServerConfig(model_id=o["model_id"] or model_id_for(o["model"]), api_key=o["api_key"] or None,
                          max_queue=o["max_queue"], max_request_bytes=o["max_request_bytes"])
    click.echo(f"specedge serve: {config.model_id} ({engine.backend_kind}, drafter {o['drafter']}, ctx "
               f"{engine.context_length}) on http://{o['host']}:{o['port']}/v1 - max queue {config.max_queue}, "
               f"API key {'required' if config.api_key else 'not required'}", err=True)
    uvicorn.run(create_app(engine, config), host=o["host"], port=o["port"], log_level=o["log_level"],
                timeout_graceful_shutdown=5)
