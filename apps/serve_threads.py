"""The engine threads `specedge serve` runs with, said in one line per model when it loads.

A call that has the cores to itself runs with the plan's thread count (or --threads): the plan measured one request
at a time, and a local server mostly serves one person, whose client sleeps while it waits. Calls that compute at
the same time (several models, an embedding beside a generation) share the cores: each step runs with
max(1, threads // running) (runtime/cores.py; an engine's own calls queue on its lock and do not compute at once),
where the engine's logits are the same at every thread count (probed once per file, engine, version, thread count
and machine, cached at `<model cache>/thread_probes/`; about a second on SmolLM2). No load test decides it: one
whose clients run on the same cores measures the clients too (it chose 1 thread for SmolLM2 on 2 cores, about 30%
slower for every single request, and took ~20 s at every start).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..assembly.auto import engine_version
from ..assembly.decoder import Decoder
from ..assembly.plan import device_fingerprint
from ..assembly.profile import model_fingerprint
from ..assembly.schema import write_json_atomic
from ..models.catalog import model_cache_dir

VERSION = 1  # of runtime/cores.py's probe


def probe_path(decoder: Decoder, cache_dir: Path | None) -> Path:
    s, kind = decoder.model_settings, decoder.model.kind
    key = json.dumps([VERSION, model_fingerprint(decoder.model.path), kind.value, engine_version(kind),
                      getattr(decoder.model.backend, "threads", None), s.kernels.value, device_fingerprint()],
                     sort_keys=True, default=str)
    return model_cache_dir(cache_dir) / "thread_probes" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def known_same_logits(decoder: Decoder, cache_dir: Path | None) -> bool | None:
    """The cached probe for this decoder's engine (None: never probed here)."""
    try:
        return bool(json.loads(probe_path(decoder, cache_dir).read_text())["same_logits"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remember_same_logits(decoder: Decoder, cache_dir: Path | None, engine) -> None:
    """Cache what the engine's probe found (only where it ran: more than one thread)."""
    if engine.cores is not None and engine.threads and engine.threads > 1:
        write_json_atomic({"same_logits": engine.shares_threads, "threads": engine.threads},
                          probe_path(decoder, cache_dir))


def threads_line(engine, model_id: str, given: bool) -> str:
    """'serve: smollm2-135m: 2 engine threads (the plan's: fastest for one request); calls computing at once share
    them, each step max(1, 2 // calls)' and its variants (one engine without a thread setting, one whose logits
    change with the thread count, one thread)."""
    why = "--threads" if given else "the plan's: fastest for one request" if engine.plan is not None else \
        "the engine's default, min(cores, 8)"
    n = engine.threads
    if n is None:
        return f"serve: {model_id}: {engine.backend_kind} sets its own threads when it loads; calls computing at " \
               "once do not change them"
    head = f"serve: {model_id}: {n} engine thread{'s' if n > 1 else ''} ({why})"
    if n == 1:
        return head
    if not engine.shares_threads:
        return f"{head}; kept when calls compute at once: this engine's logits change with its thread count " \
               "(runtime/cores.py), and an answer must not depend on what else runs"
    return f"{head}; calls computing at once share them, each step max(1, {n} // calls)"
