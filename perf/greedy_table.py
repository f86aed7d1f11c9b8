"""Greedy speculative decoding on dev prompts: tokens/s and mean accepted length per backend and drafter.

    python -m specedge.perf.greedy_table --model smollm2-135m --limit 20 --max-tokens 128 \
        --targets numpy llamacpp onnx:smollm2-135m-onnx-int4 --drafters none ngram --k 2 4

All configurations (targets x drafters x k) run in one process, each prompt through every configuration in turn,
so slow drift of the machine affects them alike. Speedups are also given per dev-set category and as their
geometric mean (--by-category prints the per-category table). ms/step is decode time per target call (drafting,
verification and bookkeeping included); ms/target call is the time inside the target's forward. Writes a markdown
table to stdout and JSON to --out. The loop and metrics are perf/bench.py's, shared with `specedge bench` (which
adds trials, warm-up, the llama.cpp baselines and the report files).
"""
from __future__ import annotations

import argparse
import json
import time

from .bench import geomean, parse_target, read_prompts, rss_mb, run_bench, specedge_configs, summarize  # noqa: F401

__all__ = ["main", "parse_target", "rss_mb", "geomean"]  # parse_target: perf/verify_cost.py, perf/tree_parity.py


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="model for targets that do not name one")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--backends", "--targets", nargs="+", default=["numpy", "llamacpp"], dest="targets",
                    help="backend[:model] each, e.g. llamacpp onnx:smollm2-135m-onnx-int4")
    ap.add_argument("--drafters", nargs="+", default=["none", "ngram", "model:smollm2-135m"],
                    help="plain decoding (none) always runs first; a model drafter uses the target's backend")
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
    prompts = read_prompts(limit=a.limit, by=a.group)
    modes = {"off": [False], "on": [True], "both": [False, True]}[a.adaptive]
    configs = specedge_configs(a.targets, a.drafters, a.k, modes, model=a.model, max_tokens=a.max_tokens,
                               threads=a.threads)
    rows = summarize(run_bench(configs, prompts, by=a.group))  # the loop `specedge bench` runs (perf/bench.py)
    print("| target | drafter | k | tok/s | mean accepted length | speedup vs none | geomean over "
          "categories | identical | ms/step | ms/target call | drafter RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s = r["stats"]
        k = f"<={r['k']} adaptive" if r["adaptive"] else r["k"]
        print(f"| {r['target']} | {r['drafter']} | {k} | {r['tokens_per_s']['mean']:.1f} | "
              f"{r['mean_accepted_length']:.2f} | {r['speedup_vs_plain']:.2f}x | "
              f"{r['geomean_speedup_over_categories']:.2f}x | {r['identical_to_plain']}/{r['n_prompts']} | "
              f"{1e3 * s['decode_s'] / max(s['n_target_forwards'], 1):.2f} | "
              f"{1e3 * s['forward_s'] / max(s['n_target_forwards'], 1):.2f} | {r['load_mb']:.0f} |")
    if a.by_category:
        cats = list(rows[0]["by_category"])
        print("\nspeedup (mean accepted length) by category\n")
        print("| target | drafter | k | " + " | ".join(cats) + " |")
        print("|---|---|---|" + "---|" * len(cats))
        for r in rows:
            cells = " | ".join(f"{v['speedup_vs_plain']:.2f}x ({v['mean_accepted_length']:.2f})"
                               for v in r["by_category"].values())
            print(f"| {r['target']} | {r['drafter']} | {r['k']} | {cells} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"args": vars(a), "time": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
