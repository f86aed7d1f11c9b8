"""Greedy speculative == plain on gemma3-270m for N dev prompts x T tokens on each backend, n-gram drafter.

    python -m specedge.perf.gemma3_check --prompts 20 --tokens 64 [--backend numpy llamacpp onnx] [--onnx DIR]

llama.cpp at 1 thread with flash attention (batch-invariant); onnx needs an exported artifact (--onnx). Prints, per
backend, the prompts whose outputs differ (must be none), mean accepted length and wall time.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from ..assembly.devset import load_prompts
from ..assembly.load import DrafterSpec, load_model, load_onnx, make_drafter
from ..runtime.backends import BackendKind, Opens, info
from ..runtime.decode import decode
from ..runtime.request import Request, Speculation
from ..runtime.stats import DecodeStats
CTX = 1024


def check(model, prompts, tokens: int, **kw) -> tuple[list[int], DecodeStats, float]:
    drafter = make_drafter(DrafterSpec.parse("ngram"), model, ctx=CTX, **kw)
    stats, differ, t0 = DecodeStats(), [], time.perf_counter()
    for i, p in enumerate(prompts):
        run = lambda d, s=None: [e.token for e in decode(model.backend, p, Speculation(d, k=4),
                                                         Request(max_tokens=tokens, eos_ids=(), max_context=CTX),
                                                         stats=s)]
        if run(drafter, stats) != run(None):
            differ.append(i)
    return differ, stats, time.perf_counter() - t0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--backend", nargs="+", default=["numpy", "llamacpp"])
    ap.add_argument("--onnx", default=None, help="exported gemma3-270m artifact (for --backend onnx)")
    a = ap.parse_args(argv)
    for name in a.backend:
        engine = info(BackendKind(name))
        if engine.opens is Opens.ARTIFACT:
            model, kw = load_onnx(a.onnx, device="cpu", threads=2), {"threads": 2, "device": "cpu"}
        else:
            threads = 1 if engine.reference else None  # mainline llama.cpp: exact batches at one thread
            model, kw = load_model("gemma3-270m", BackendKind(name), ctx=CTX, threads=threads), {"threads": threads}
        tok = model.tokenizer
        prompts = [np.asarray(tok.chat_ids(p.text)[:400],
                          np.int32) for p in load_prompts(limit=a.prompts)]
        differ, stats, secs = check(model, prompts, a.tokens, **kw)
        print(f"{name}: {len(prompts)} prompts x {a.tokens} tokens, differing prompts {differ}; {stats.summary()}; "
              f"{secs:.0f} s (speculative + plain)", flush=True)


if __name__ == "__main__":
    main()
