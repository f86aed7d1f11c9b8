"""The engine threads `specedge serve` uses: measured under concurrency, once per model, engine and machine.

A plan measures one request at a time, so its thread count is the fastest for a single user. A server's calls
queue behind one another while its event loop, its clients' tokenization and JSON, and the clients themselves share
the same cores: on 2 cores, 8 concurrent clients on loopback served 1.93 req/s with 1 llama.cpp thread against
1.26 req/s with the plan's 2 (llama.cpp's spinning threads collapse when they do not have their cores). So, unless
`--threads` is given, `serve` runs a short load test (perf/load_test.py: CLIENTS concurrent clients on loopback,
greedy, short answers) against the same engine and drafter at each candidate thread count (1 and the plan's) and
serves with the one that answered the most requests per second; every answer must equal the single-request one
(else that count is refused). The choice is cached beside the plans; one measured while other processes kept the
machine busy is used for this run only and not cached, and said so in one line. With several models, the first is
measured at start; the others load on a request, which must not wait for a measurement: they take their cached
choice (from an earlier `serve` of that model) or the plan's threads, and say which.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from ..assembly.contention import CpuWatch
from ..assembly.decoder import Decoder
from ..assembly.open import open_decoder
from ..assembly.plan import device_fingerprint
from ..assembly.schema import write_json_atomic
from ..assembly.plan_run import resolved_threads
from ..assembly.profile import model_fingerprint
from ..models.catalog import model_cache_dir
from ..perf.load_test import dev_messages, reference, run_load
from .api import Engine
from .serve_cmd import ServerThread
from .server import ServerConfig, create_app

CLIENTS, REQUESTS, MAX_TOKENS, PROMPTS = 6, 2, 24, 4
VERSION = 1


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    requests_per_s: dict  # thread count (as a string) -> req/s
    load: str  # the machine's load while measuring (contention.Load.describe)
    cached: bool  # read from the cache (not measured now)

    def summary(self) -> str:
        rates = ", ".join(f"{t} thread{'s' if t != '1' else ''} {r:.2f} req/s" for t, r in
                          sorted(self.requests_per_s.items()))
        how = "cached" if self.cached else f"measured just now, {self.load}"
        return f"serve: {self.threads} engine thread{'s' if self.threads > 1 else ''} ({rates} with {CLIENTS} " \
               f"concurrent clients; {how}; --threads N chooses)"


def choice_path(decoder: Decoder, cache_dir: Path | None, candidates: tuple[int, ...]) -> Path:
    s, d = decoder.model_settings, decoder.settings
    key = json.dumps([VERSION, model_fingerprint(decoder.model.path), s.backend.value if s.backend else None,
                      str(d.drafter), d.k, d.adaptive_k, list(candidates), CLIENTS, device_fingerprint()],
                     sort_keys=True, default=str)
    return model_cache_dir(cache_dir) / "serve_threads" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def measure(engine: Engine, prompts: list[list[dict]], expected: list[str] | None) -> tuple[float, list[str], int]:
    """(req/s, the single-request answers, answers that differed from `expected`) for one engine behind a server."""
    with ServerThread(create_app(engine, ServerConfig("probe", max_queue=CLIENTS * REQUESTS))) as srv:
        ref = reference(srv.url, prompts, MAX_TOKENS)
        report = run_load(srv.url, prompts, expected or ref, clients=CLIENTS, requests=REQUESTS,
                          max_tokens=MAX_TOKENS)
    if report.errors:
        raise RuntimeError(f"{report.errors} of {report.requests} requests failed")
    return report.requests_per_s, ref, report.mismatches


def cached_threads(decoder: Decoder, cache_dir: Path | None = None) -> ThreadChoice | None:
    """The cached choice for `decoder`'s model (None: never measured here). A model a multi-model server loads on
    a request uses this, not a measurement: the request would wait for it."""
    planned = resolved_threads(decoder.model_settings.threads)
    path = choice_path(decoder, cache_dir, tuple(sorted({1, planned})))
    try:
        got = json.loads(path.read_text())
        return ThreadChoice(int(got["threads"]), got["requests_per_s"], got["load"], True)
    except (OSError, ValueError, KeyError):
        return None


def serve_threads(decoder: Decoder, *, cache_dir: Path | None = None, log: Callable[[str], None] = lambda m: None,
                  refresh: bool = False) -> ThreadChoice:
    """The thread count to serve `decoder`'s model with (see the module)."""
    planned = resolved_threads(decoder.model_settings.threads)
    candidates = tuple(sorted({1, planned}))
    path = choice_path(decoder, cache_dir, candidates)
    if not refresh and (cached := cached_threads(decoder, cache_dir)) is not None:
        return cached
    if len(candidates) == 1:
        return ThreadChoice(planned, {}, "", False)
    log(f"serve: measuring engine threads {' and '.join(map(str, candidates))} under {CLIENTS} concurrent clients "
        "(once per model and machine; about 20 s)")
    prompts = dev_messages(PROMPTS)
    rates, expected = {}, None
    with CpuWatch(planned) as watch:
        for t in candidates:
            engine = Engine(decoder if t == planned else open_decoder(
                replace(decoder.model_settings, threads=t), decoder.settings, plan=False), "probe")
            started = time.perf_counter()
            rate, ref, differed = measure(engine, prompts, expected)
            expected = expected or ref
            if differed:
                log(f"serve: at {t} threads {differed} answers differed from single requests: not used")
                continue
            rates[str(t)] = round(rate, 3)
            log(f"serve: {t} thread{'s' if t > 1 else ''}: {rate:.2f} req/s ({time.perf_counter() - started:.0f} s)")
            engine.reset()
    load = watch.load
    best = max(rates, key=rates.get) if rates else str(planned)
    choice = ThreadChoice(int(best), rates, load.describe(), False)
    if load.busy:
        log(f"serve: measured on a busy machine ({load.describe()}): used for this run, not cached")
    elif rates:
        write_json_atomic({"threads": choice.threads, "requests_per_s": rates, "load": choice.load,
                           "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}, path)
    return choice
