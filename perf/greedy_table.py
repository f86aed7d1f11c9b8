"""Greedy speculative decoding on dev prompts: tokens/s and mean accepted length per backend and drafter.

    python -m specedge.perf.greedy_table --model smollm2-135m --limit 20 --max-tokens 128 \
        --targets numpy llamacpp onnx:smollm2-135m-onnx-int4 --drafters none ngram --k 2 4

All configurations (targets x drafters x k) run in one process, each prompt through every configuration in turn,
so slow drift of the machine affects them alike. ms/step is decode time per target call (drafting, verification
and bookkeeping included); ms/target call is the time inside the target's forward. Writes a markdown table to stdout and JSON to --out.
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


def parse_target(text: str, default_model: str) -> tuple[BackendKind, str]:
    """'onnx:/path/to/artifact' | 'llamacpp' | 'numpy:model.gguf' -> (backend kind, model)."""
    kind, _, model = text.partition(":")
    return BackendKind(kind), model or default_model


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="model for targets that do not name one")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--backends", "--targets", nargs="+", default=["numpy", "llamacpp"], dest="targets",
                    help="backend[:model] each, e.g. llamacpp onnx:smollm2-135m-onnx-int4")
    ap.add_argument("--drafters", nargs="+", default=["none", "ngram", "model:smollm2-135m"],
                    help="the first one is the baseline (normally none); a model drafter uses the target's backend")
    ap.add_argument("--k", type=int, nargs="+", default=[4], help="draft lengths (each drafter runs with each)")
    ap.add_argument("--adaptive", choices=["off", "on", "both"], default="off",
                    help="adaptive draft length (runtime/draft_length.py; k is then the maximum)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    params = SamplingParams()
    prompts = load_prompts(limit=a.limit)
    runs = []  # (target label, drafter label, k, adaptive, target, drafter)
    modes = {"off": [False], "on": [True], "both": [False, True]}[a.adaptive]
    for t in a.targets:
        kind, model = parse_target(t, a.model)
        target = load_model(model, kind, ctx=2048, threads=a.threads, device="cpu")
        for d in a.drafters:
            for k, adaptive in ([(0, False)] if d == "none" else [(k, m) for k in a.k for m in modes]):
                runs.append((t, d, k, adaptive, target, make_drafter(DrafterSpec.parse(d), target, params, ctx=2048,
                                                                     threads=a.threads, device="cpu")))
    agg = [DecodeStats() for _ in runs]
    outputs = [[] for _ in runs]
    for p in prompts:  # every prompt through every configuration in turn: drift hits them alike
        for i, (t, d, k, adaptive, target, drafter) in enumerate(runs):
            tok = target.tokenizer
            ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": p.text}]))
            r = generate(target.backend, tok, ids, params, drafter=drafter, k=max(k, 1), max_tokens=a.max_tokens,
                         rng=np.random.default_rng(0), stats=agg[i], ctx=2048,
                         adaptive_k=adaptive)
            outputs[i].append(r.tokens)
    rows = []
    for i, (t, d, k, adaptive, _, _) in enumerate(runs):
        base = next(j for j, r in enumerate(runs) if r[0] == t)  # the target's first configuration
        s = agg[i]
        rows.append(dict(target=t, drafter=d, k=f"<={k} adaptive" if adaptive else k, tokens_per_s=s.tokens_per_s,
                         mean_accepted_length=s.mean_accepted_length, speedup=s.tokens_per_s / agg[base].tokens_per_s,
                         identical_to_first=sum(o == b for o, b in zip(outputs[i], outputs[base])),
                         n_prompts=len(prompts), tokens=s.n_generated, step_ms=1e3 * s.decode_s / max(s.n_target_forwards, 1),
                         forward_ms=1e3 * s.forward_s / max(s.n_target_forwards, 1)))
    print(f"| target | drafter | k | tok/s | mean accepted length | speedup vs {a.drafters[0]} | identical | "
          "ms/step | ms/target call |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['target']} | {r['drafter']} | {r['k']} | {r['tokens_per_s']:.1f} | "
              f"{r['mean_accepted_length']:.2f} | {r['speedup']:.2f}x | {r['identical_to_first']}/{r['n_prompts']} | "
              f"{r['step_ms']:.2f} | {r['forward_ms']:.2f} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"args": vars(a), "time": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
