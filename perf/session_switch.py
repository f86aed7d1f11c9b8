"""What switching between onnxruntime sessions costs under each thread-pool policy (docs/onnx.md, "Thread pools").

    python -m specedge.perf.session_switch TARGET_DIR DRAFTER_DIR [--threads 2] [--ctx 100] [--reps 20] [--rounds 3]

A speculative step on ONNX Runtime runs the drafter's session k times, then the target's. Each policy runs in a
fresh interpreter (the shared pool is process-wide): `shared` (one pool for every session, specedge's default),
`session` (a pool per session that spins between runs), `session-nospin` (a pool per session, no spinning). Per
policy and round: mean ms of a lone target T=1, a lone drafter T=1, a lone target T=5, and four drafter runs then a
target T=5 alternating, all at a --ctx-token context and rolled back after each run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

POLICIES = ("shared", "session", "session-nospin")  # SPECEDGE_ORT_THREADPOOL values


def _child(args) -> dict:
    from ..runtime.backends import open_onnx, ort_threads

    os.environ[ort_threads.ENV] = args.child
    target, drafter = open_onnx(args.target, threads=args.threads), open_onnx(args.drafter, threads=args.threads)
    ct, cd = target.new_cache(args.ctx + 16), drafter.new_cache(args.ctx + 16)
    prompt = (np.arange(args.ctx) % 500 + 100).astype(np.int32)
    target.forward(prompt, ct)
    drafter.forward(prompt, cd)

    def run(backend, cache, n):
        backend.forward(np.full(n, 7, dtype=np.int32), cache)
        cache.rollback(args.ctx)

    cases = {"target T=1": lambda: run(target, ct, 1), "drafter T=1": lambda: run(drafter, cd, 1),
             "target T=5": lambda: run(target, ct, 5),
             "4 drafter T=1 + target T=5": lambda: [run(drafter, cd, 1) for _ in range(4)] + [run(target, ct, 5)]}
    rounds = []
    for _ in range(args.rounds):
        row = {}
        for name, fn in cases.items():
            fn()
            t0 = time.perf_counter()
            for _ in range(args.reps):
                fn()
            row[name] = (time.perf_counter() - t0) / args.reps * 1e3
        rounds.append(row)
    return {"policy": args.child, "rounds": rounds}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target")
    ap.add_argument("drafter")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=100)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--child", choices=POLICIES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args)))
        return
    results = []
    for policy in args.policies.split(","):
        cmd = [sys.executable, "-m", "specedge.perf.session_switch", args.target, args.drafter, "--threads",
               str(args.threads), "--ctx", str(args.ctx), "--reps", str(args.reps), "--rounds", str(args.rounds),
               "--child", policy]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    names = list(results[0]["rounds"][0])
    print(f"{args.threads} threads, {args.ctx}-token context, mean of {args.reps} runs; min-max over {args.rounds} "
          "rounds, ms\n")
    print("| thread pools | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for r in results:
        cells = [f"{min(x[n] for x in r['rounds']):.1f}-{max(x[n] for x in r['rounds']):.1f}" for n in names]
        print(f"| {r['policy']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
