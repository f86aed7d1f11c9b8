"""Greedy speculative decoding on dev prompts: tokens/s and mean accepted length per backend and drafter.

    python -m specedge.perf.greedy_table --model smollm2-135m --limit 20 --max-tokens 128 \
        --targets numpy llamacpp onnx:smollm2-135m-onnx-int4 --drafters none ngram --k 2 4

All configurations (targets x drafters x k) run in one process, each prompt through every configuration in turn,
so slow drift of the machine affects them alike. Speedups are also given per dev-set category and as their
geometric mean (--by-category prints the per-category table). ms/step is decode time per target call (drafting, verification
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


def rss_mb() -> float:
    """Resident set size of this process (Linux /proc; 0 where unavailable)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def geomean(xs) -> float:
    xs = [x for x in xs if x > 0]
    return float(np.exp(np.mean(np.log(xs)))) if xs else float("nan")


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
    ap.add_argument("--by-category", action="store_true",
                    help="also print speedup and mean accepted length per category")
    ap.add_argument("--group", choices=["task", "category"], default="task",
                    help="categories = Spec-Bench's six tasks (MT-Bench subcategories as one) or the raw categories; "
                         "prompts are spread round-robin over them")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    params = SamplingParams()
    prompts = load_prompts(limit=a.limit, by=a.group)
    group = (lambda p: p.task) if a.group == "task" else (lambda p: p.category)
    cats = sorted({group(p) for p in prompts})
    runs = []  # (target label, drafter label, k, adaptive, target, drafter, drafter RSS MB)
    modes = {"off": [False], "on": [True], "both": [False, True]}[a.adaptive]
    for t in a.targets:
        kind, model = parse_target(t, a.model)
        target = load_model(model, kind, ctx=2048, threads=a.threads, device="cpu")
        for d in a.drafters:
            for k, adaptive in ([(0, False)] if d == "none" else [(k, m) for k in a.k for m in modes]):
                before = rss_mb()
                drafter = make_drafter(DrafterSpec.parse(d), target, params, ctx=2048, threads=a.threads, device="cpu")
                runs.append((t, d, k, adaptive, target, drafter, rss_mb() - before))
    agg = [DecodeStats() for _ in runs]
    per_cat = [{c: DecodeStats() for c in cats} for _ in runs]
    outputs = [[] for _ in runs]
    for p in prompts:  # every prompt through every configuration in turn: drift hits them alike
        for i, (t, d, k, adaptive, target, drafter, _) in enumerate(runs):
            tok = target.tokenizer
            ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": p.text}]))
            s = DecodeStats()
            r = generate(target.backend, tok, ids, params, drafter=drafter, k=max(k, 1), max_tokens=a.max_tokens,
                         rng=np.random.default_rng(0), stats=s, ctx=2048, adaptive_k=adaptive)
            agg[i].merge(s)
            per_cat[i][group(p)].merge(s)
            outputs[i].append(r.tokens)
    rows = []
    for i, (t, d, k, adaptive, _, _, mem) in enumerate(runs):
        base = next(j for j, r in enumerate(runs) if r[0] == t)  # the target's first configuration
        s = agg[i]
        by_cat = {c: dict(speedup=per_cat[i][c].tokens_per_s / per_cat[base][c].tokens_per_s,
                          tokens_per_s=per_cat[i][c].tokens_per_s, tau=per_cat[i][c].mean_accepted_length)
                  for c in cats}
        rows.append(dict(target=t, drafter=d, k=f"<={k} adaptive" if adaptive else k, tokens_per_s=s.tokens_per_s,
                         mean_accepted_length=s.mean_accepted_length, speedup=s.tokens_per_s / agg[base].tokens_per_s,
                         geomean_speedup=geomean(v["speedup"] for v in by_cat.values()), by_category=by_cat,
                         identical_to_first=sum(o == b for o, b in zip(outputs[i], outputs[base])),
                         n_prompts=len(prompts), tokens=s.n_generated, memory_mb=mem,
                         step_ms=1e3 * s.decode_s / max(s.n_target_forwards, 1),
                         forward_ms=1e3 * s.forward_s / max(s.n_target_forwards, 1)))
    print(f"| target | drafter | k | tok/s | mean accepted length | speedup vs {a.drafters[0]} | geomean over "
          "categories | identical | ms/step | ms/target call | drafter RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['target']} | {r['drafter']} | {r['k']} | {r['tokens_per_s']:.1f} | "
              f"{r['mean_accepted_length']:.2f} | {r['speedup']:.2f}x | {r['geomean_speedup']:.2f}x | "
              f"{r['identical_to_first']}/{r['n_prompts']} | {r['step_ms']:.2f} | {r['forward_ms']:.2f} | "
              f"{r['memory_mb']:.0f} |")
    if a.by_category:
        print("\nspeedup (mean accepted length) by category\n")
        print("| target | drafter | k | " + " | ".join(cats) + " |")
        print("|---|---|---|" + "---|" * len(cats))
        for r in rows:
            cells = " | ".join(f"{v['speedup']:.2f}x ({v['tau']:.2f})" for v in r["by_category"].values())
            print(f"| {r['target']} | {r['drafter']} | {r['k']} | {cells} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"args": vars(a), "time": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
