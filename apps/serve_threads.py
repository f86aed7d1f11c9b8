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

from pathlib import Path

from ..assembly.auto import engine_version
from ..assembly.decoder import Decoder
from ..assembly.measured import Store
from ..assembly.plan import device_fingerprint
from ..assembly.profile import model_fingerprint
from ..models.catalog import model_cache_dir

VERSION = 1  # of runtime/cores.py's probe (a probe cached before it recorded its version and key is probed again)
# whether the logits change with the thread count, which a busy machine does not change: stored as measured
PROBES = Store("thread_probes", "thread probe", VERSION, covers="file, engine version, threads and machine")


def probe_key(decoder: Decoder) -> str:
    s, kind = decoder.model_settings, decoder.model.kind
    return PROBES.key(model_fingerprint(decoder.model.path), kind.value, engine_version(kind),
                      getattr(decoder.model.backend, "threads", None), s.kernels.value, device_fingerprint())


def known_same_logits(decoder: Decoder, cache_dir: Path | None) -> bool | None:
    """The cached probe for this decoder's engine (None: never probed here)."""
    key = probe_key(decoder)
    same, _ = PROBES.load(PROBES.path(model_cache_dir(cache_dir), key), key, lambda obj: bool(obj["same_logits"]))
    return same


def remember_same_logits(decoder: Decoder, cache_dir: Path | None, engine) -> None:
    """Cache what the engine's probe found (only where it ran: more than one thread)."""
    if engine.cores is not None and engine.threads and engine.threads > 1:
        key = probe_key(decoder)
        PROBES.save({"version": VERSION, "key": key, "same_logits": engine.shares_threads, "threads": engine.threads},
                    PROBES.path(model_cache_dir(cache_dir), key))


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
