"""The engine threads `specedge serve` runs with, said in one line per model when it loads.

A call that has the cores to itself runs with the plan's thread count (or --threads): the plan measured one request
at a time, and a local server mostly serves one person, whose client sleeps while it waits. Calls that compute at
the same time (several models, an embedding beside a generation) share the cores: each step runs with
max(1, threads // running) (runtime/cores.py; an engine's own calls queue on its lock and do not compute at once).
No load test decides it: one whose clients run on the same cores measures the clients too (it chose 1 thread for
SmolLM2 on 2 cores, about 30% slower for every single request, and took ~20 s at every start).
"""
from __future__ import annotations


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
