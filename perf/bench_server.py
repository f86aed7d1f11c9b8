"""Upstream llama-server as a `specedge bench` baseline (`--baseline llama-server`): the comparison users make.

Two llama-server processes on loopback, both on the bench's GGUF, threads and context with flash attention on: its
plain decoding and its speculative default (`--spec-default`). Each is started once, waited for (/health answers
200) and always stopped (bench_cmd holds them in an ExitStack: an error, Ctrl-C or the end of the run). The bench's
prompts go to /v1/chat/completions as one user message, greedy (temperature 0; or sampled with the values specedge
resolves, `server_sampling`), max_tokens, `cache_prompt: false`
(every request processes its whole prompt, as the in-process configurations do), streamed so the first token's
time is the client's.

Timed as perf/bench_llama.py times llama-cpp-python, from the client: prefill_s is the time to the first streamed
token (the prompt's processing and the request's own overhead), decode_s the rest of the request, so prefill_s +
decode_s is the request's wall clock and end-to-end tok/s is what the user waited for. llama-server's own `timings`
(prompt_n, prompt_ms, predicted_n, predicted_ms) are kept beside them (the row's `server_timings`). Answers are
compared as text: a row's outputs are its answers' UTF-8 bytes, so `identical_to_plain` of the --spec-default row
counts answers equal to llama-server's own plain greedy ones.
"""
from __future__ import annotations

import http.client
import json
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..runtime.stats import DecodeStats
from ..assembly.profile import PLAIN
from .bench import SERVER, Config, Prompt
from .llama_server_build import ServerBinary

SPEC_DEFAULT = "spec-default"  # the --spec-default configuration's drafter name (plain: PLAIN)
class ServerError(RuntimeError):
    """llama-server did not start, or a request to it failed: the message says which and shows its output."""


READY_TIMEOUT_S = 120.0  # loading a model takes seconds; a server not answering /health by then is stuck
REQUEST_TIMEOUT_S = 600.0


def server_command(binary: Path, gguf: Path, *, port: int, threads: int, ctx: int, spec: bool) -> list[str]:
    """llama-server's command line: the bench's GGUF, threads and context, flash attention on, loopback only."""
    return [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
            "-c", str(ctx), "-fa", "on", *(["--spec-default"] if spec else [])]


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """One llama-server process: started, waited for until /health answers 200, stopped (terminate, then kill)."""

    def __init__(self, cmd: list[str], port: int) -> None:
        from ..models.catalog import _die_with_parent
        self.cmd, self.port = cmd, port
        self.log = tempfile.TemporaryFile()  # its stdout and stderr: the last lines explain a failed start
        # a session of its own: Ctrl-C reaches the bench, which stops the server; killed with the bench (Linux)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True,
                                     preexec_fn=_die_with_parent if sys.platform == "linux" else None)

    def tail(self, n: int = 12) -> str:
        self.log.flush()
        self.log.seek(0)
        lines = self.log.read().decode("utf-8", "replace").splitlines()
        return "\n".join(lines[-n:])

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Poll /health until 200; ServerError with the server's last output when it exits or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"llama-server exited with code {self.proc.returncode} before it was ready "
                                   f"(`{' '.join(self.cmd)}`); its last output:\n{self.tail()}")
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
            try:
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:  # not listening yet
                pass
            finally:
                conn.close()
            time.sleep(0.1)
        self.stop()
        raise ServerError(f"llama-server did not answer /health within {timeout:.0f} s and was stopped "
                           f"(`{' '.join(self.cmd)}`); its last output:\n{self.tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def close(self) -> None:
        self.stop()
        self.log.close()


def start_server(binary: Path, gguf: Path, *, threads: int, ctx: int, spec: bool, stack: ExitStack,
                 timeout: float = READY_TIMEOUT_S) -> LlamaServer:
    """Start one server on a free loopback port and wait until it is ready; `stack` stops it."""
    port = free_port()
    server = LlamaServer(server_command(binary, gguf, port=port, threads=threads, ctx=ctx, spec=spec), port)
    stack.callback(server.close)
    server.wait_ready(timeout)
    return server


@dataclass(frozen=True)
class Answer:
    """One request: its text, client times (wall clock, first streamed token) and llama-server's timings."""

    text: str
    wall_s: float
    first_token_s: float
    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float


GREEDY = {"temperature": 0}
# specedge's order (runtime/sampling.py): penalties, DRY, then temperature before the warpers, as Hugging Face does;
# llama.cpp's default applies temperature last, after top-k/top-p/min-p have chosen the tokens kept
SAMPLER_ORDER = ["penalties", "dry", "temperature", "top_k", "typ_p", "top_p", "min_p"]


def server_sampling(gguf: Path, temperature: float, seed: int, ctx: int) -> dict:
    """llama-server's request fields for the bench's call: greedy at temperature 0; sampled, every value specedge
    resolves for `CallSettings(temperature=..., seed=...)` on this GGUF (its general.sampling.* defaults, then
    CHAT_DEFAULTS: top-p, repeat penalty, DRY), in specedge's order, so both sample the same distribution."""
    if temperature == 0:
        return dict(GREEDY)
    from ..assembly.decoder import CallSettings
    from ..assembly.sampling_defaults import gguf_sampling
    from ..models.gguf_read import read_gguf
    stated = {k: f.value for k, f in read_gguf(gguf).fields.items() if k.startswith("general.sampling.")}
    p = CallSettings(temperature=temperature, seed=seed).sampling(gguf_sampling(stated))
    return {"temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p,
            "typical_p": p.typical_p, "repeat_penalty": p.repeat_penalty, "repeat_last_n": p.repeat_last_n,
            "presence_penalty": p.presence_penalty, "frequency_penalty": p.frequency_penalty,
            "dry_multiplier": p.dry_multiplier, "dry_base": p.dry_base, "dry_allowed_length": p.dry_allowed_length,
            "dry_penalty_last_n": p.dry_last_n or ctx,  # specedge's 0: the whole history (llama-server refuses -1)
            "top_n_sigma": -1, "xtc_probability": 0.0, "samplers": SAMPLER_ORDER, "seed": seed}


def request_body(prompt: Prompt, max_tokens: int, sampling: dict = GREEDY) -> dict:
    """The chat request every configuration answers: the prompt as one user message, greedy (or `sampling`'s
    fields, server_sampling), no prompt cache."""
    return {"messages": [{"role": "user", "content": prompt.text}], "max_tokens": max_tokens, **sampling,
            "stream": True, "cache_prompt": False}


def read_stream(lines, t0: float, clock: Callable[[], float] = time.perf_counter) -> Answer:
    """An SSE stream of chat.completion.chunk objects -> Answer; t0: the request's start on `clock`. The first
    chunk with content marks the first token; llama-server puts `timings` on its last chunk."""
    parts, first, timings = [], None, None
    for raw in lines:
        line = raw.decode("utf-8", "replace").strip() if isinstance(raw, bytes) else raw.strip()
        if line.startswith("error:"):
            raise ServerError(f"llama-server streamed an error: {line[6:].strip()}")
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk:
            raise ServerError(f"llama-server streamed an error: {chunk['error']}")
        for choice in chunk.get("choices") or []:
            content = (choice.get("delta") or {}).get("content")
            if content:
                first = clock() if first is None else first
                parts.append(content)
        timings = chunk.get("timings", timings)
    end = clock()
    if timings is None:
        raise ServerError("llama-server's stream ended without a `timings` object (prompt_n, prompt_ms, "
                           "predicted_n, predicted_ms): is it llama.cpp's server?")
    try:
        return Answer("".join(parts), end - t0, (end if first is None else first) - t0, int(timings["prompt_n"]),
                      float(timings["prompt_ms"]), int(timings["predicted_n"]), float(timings["predicted_ms"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ServerError(f"llama-server's timings {timings} lack a field: {e}") from None


def chat(port: int, prompt: Prompt, max_tokens: int, timeout: float = REQUEST_TIMEOUT_S,
         sampling: dict = GREEDY) -> Answer:
    """One streamed /v1/chat/completions request, timed from before it is sent to its last byte."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        t0 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body=json.dumps(request_body(prompt, max_tokens, sampling)),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise ServerError(f"llama-server answered {resp.status}: {resp.read()[:500].decode('utf-8', 'replace')}")
        return read_stream(resp, t0)
    finally:
        conn.close()


def answer_stats(a: Answer) -> DecodeStats:
    """The request as DecodeStats, timed like bench_llama's baselines: the first token with the prompt (prefill_s =
    time to the first token), the other predicted_n - 1 over the rest of the wall clock."""
    n = a.predicted_n
    return DecodeStats(prefill_s=a.first_token_s, decode_s=a.wall_s - a.first_token_s, n_generated=max(n - 1, 0),
                       n_prefilled=a.prompt_n, n_calls=1, first_token_s=a.first_token_s, first_in_prefill=min(n, 1))


def server_timings(answers: list[Answer]) -> dict:
    """llama-server's own totals over the timed requests, with its rates (tokens per its milliseconds)."""
    pn, pms = sum(a.prompt_n for a in answers), sum(a.prompt_ms for a in answers)
    dn, dms = sum(a.predicted_n for a in answers), sum(a.predicted_ms for a in answers)
    return {"requests": len(answers), "prompt_n": pn, "prompt_ms": pms, "predicted_n": dn, "predicted_ms": dms,
            "prompt_tokens_per_s": 1e3 * pn / pms if pms > 0 else None,
            "decode_tokens_per_s": 1e3 * dn / dms if dms > 0 else None}


def server_configs(binary: ServerBinary, gguf: Path, *, threads: int, ctx: int, max_tokens: int, warmup: int,
                   stack: ExitStack, log: Callable[[str], None] = print, timeout: float = READY_TIMEOUT_S,
                   sampling: dict = GREEDY) -> tuple[list[Config], list[list[str]]]:
    """'llama-server plain' and 'llama-server --spec-default', each its own running server (stopped by `stack`);
    also their command lines. warmup: how many of each configuration's first requests run_bench discards (left out
    of server_timings)."""
    configs, commands = [], []
    for spec in (False, True):
        server = start_server(binary.path, gguf, threads=threads, ctx=ctx, spec=spec, stack=stack, timeout=timeout)
        log(f"llama-server ready on 127.0.0.1:{server.port}: {' '.join(server.cmd)}")
        answers: list[Answer] = []

        def run(p: Prompt, server=server, answers=answers) -> tuple[list[int], DecodeStats]:
            try:
                a = chat(server.port, p, max_tokens, sampling=sampling)
            except (OSError, http.client.HTTPException) as e:  # it died or hung up mid-run
                raise ServerError(f"a request to llama-server failed ({type(e).__name__}: {e}); its last "
                                  f"output:\n{server.tail()}") from None
            answers.append(a)
            return list(a.text.encode("utf-8")), answer_stats(a)  # text compared, not token ids

        configs.append(Config(SERVER, SPEC_DEFAULT if spec else PLAIN, 0, False, run, gguf.stat().st_size,
                              instrumented=False, family=SERVER,
                              name="llama-server --spec-default" if spec else "llama-server plain",
                              extra=lambda answers=answers: {"server_timings": server_timings(answers[warmup:])}))
        commands.append(server.cmd)
    return configs, commands
