"""Greedy speculative decoding on dev prompts: tokens/s and mean accepted length per backend and drafter.

    python -m specedge.perf.greedy_table --model smollm2-135m --limit 20 --max-tokens 128 \
        --backends numpy llamacpp --drafters none ngram model:smollm2-135m --k 4

All configurations run in one process, each prompt through every configuration in turn, so slow
drift of the machine affects them alike. Writes a markdown table to stdout and JSON to --out.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from ..apps.engine import DrafterSpec, load_model, make_drafter
from ..runtime.backends import BackendKind
from ..runtime.generate import generate
from ..runtime.stats import DecodeStats
from ..runtime.types import SamplingParams
from .devset import load_prompts


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--backends", nargs="+", default=["numpy", "llamacpp"])
    ap.add_argument("--drafters", nargs="+", default=["none", "ngram", "model:smollm2-135m"])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    params = SamplingParams()
    prompts = load_prompts(limit=a.limit)
    rows = []
    for b in a.backends:
        target = load_model(a.model, BackendKind(b), ctx=2048, threads=a.threads)
        configs = [(d, make_drafter(DrafterSpec.parse(d), target, params, ctx=2048, threads=a.threads))
                   for d in a.drafters]
        ids = [target.tokenizer.encode(target.tokenizer.apply_chat_template([{"role": "user", "content": p.text}]))
               for p in prompts]
        agg = {d: DecodeStats() for d, _ in configs}
        outputs = {d: [] for d, _ in configs}
        for pid in ids:
            for d, drafter in configs:
                r = generate(target.backend, target.tokenizer, pid, params, drafter=drafter, k=a.k,
                             max_tokens=a.max_tokens, rng=np.random.default_rng(0), stats=agg[d], ctx=2048)
                outputs[d].append(r.tokens)
        base = agg[configs[0][0]].tokens_per_s
        for d, _ in configs:
            s = agg[d]
            same = sum(o == p for o, p in zip(outputs[d], outputs[configs[0][0]]))
            rows.append(dict(backend=b, drafter=d, k=a.k if d != "none" else 0, tokens_per_s=s.tokens_per_s,
                             mean_accepted_length=s.mean_accepted_length, speedup=s.tokens_per_s / base,
                             identical_to_first=same, n_prompts=len(ids), tokens=s.n_generated))
        del target, configs
    print(f"| backend | drafter | k | tok/s | mean accepted length | speedup vs {a.drafters[0]} | identical |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['backend']} | {r['drafter']} | {r['k']} | {r['tokens_per_s']:.1f} | "
              f"{r['mean_accepted_length']:.2f} | {r['speedup']:.2f}x | {r['identical_to_first']}/{r['n_prompts']} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"args": vars(a), "time": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
