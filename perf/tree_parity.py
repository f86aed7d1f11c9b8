"""How often a tree forward's argmax differs from chain decoding's, on real prompts (docs/algorithms.md 1.4).

    python -m specedge.perf.tree_parity --target onnx:/path/to/smollm2-135m-onnx-int4 --limit 6

For each prompt: plain greedy decoding of --tokens tokens; then at every (depth + 1)-th position s, a tree of --depth levels whose
true continuation greedy[s + 1 ..] is the LAST of --fanout children at each level (the other children are
distractors placed before it, so the true path sits in slots a chain would not use). Reported: path nodes checked,
argmax flips against the chain forward over greedy[s .. s + depth], and the largest |logit difference|. A backend
whose tree forward were bit-identical to its chains would report 0 and 0.
"""
from __future__ import annotations

import argparse

import numpy as np

from ..assembly.load import load_model
from ..assembly.devset import load_prompts
from .greedy_table import parse_target


def last_branch_tree(greedy: list[int], s: int, depth: int, fanout: int, vocab: int
                     ) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(tokens [n], ancestor mask [n, n], indices of the true path) for the tree rooted at greedy[s]."""
    toks, parents, path = [greedy[s]], [-1], [0]
    for level in range(1, depth + 1):
        for f in range(fanout - 1):  # distractors: any other ids
            toks.append((greedy[s + level] + 1 + f) % vocab)
            parents.append(path[-1])
        toks.append(greedy[s + level])
        parents.append(path[-1])
        path.append(len(toks) - 1)
    mask = np.eye(len(toks), dtype=bool)
    for i in range(1, len(toks)):  # parents precede children: BFS order within each level's fan
        mask[i] |= mask[parents[i]]
    return np.array(toks, np.int32), mask, path


def measure(backend, prompts: list[np.ndarray], *, tokens: int, depth: int, fanout: int) -> dict:
    checked = flips = 0
    worst = 0.0
    for ids in prompts:
        cache = backend.new_cache(len(ids) + tokens + depth * fanout + 2)
        greedy = [int(backend.forward(ids, cache)[-1].argmax())]
        for _ in range(tokens):
            greedy.append(int(backend.forward(np.array(greedy[-1:], np.int32), cache)[-1].argmax()))
        # stride depth + 1: each chain forward leaves the cache holding the greedy rows up to the next start
        for s in range(0, tokens - depth, depth + 1):
            toks, mask, path = last_branch_tree(greedy, s, depth, fanout, backend.config.vocab_size)
            cache.rollback(len(ids) + s)
            tree = backend.forward(toks, cache, tree_mask=mask)[path]
            cache.rollback(len(ids) + s)
            chain = backend.forward(np.array(greedy[s:s + depth + 1], np.int32), cache)
            checked += len(path)
            flips += int((tree.argmax(-1) != chain.argmax(-1)).sum())
            worst = max(worst, float(np.abs(tree - chain).max()))
    return dict(prompts=len(prompts), nodes=checked, argmax_flips=flips, max_abs_dlogit=worst)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="onnx:smollm2-135m-onnx-int4", help="backend:model (tree-capable)")
    ap.add_argument("--limit", type=int, default=6, help="dev prompts")
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--fanout", type=int, default=3)
    ap.add_argument("--max-prompt", type=int, default=200, help="prompt tokens kept")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    kind, model = parse_target(a.target, "smollm2-135m")
    m = load_model(model, kind, threads=a.threads, device="cpu")
    prompts = [np.array(m.tokenizer.encode(p.text)[:a.max_prompt], np.int32) for p in load_prompts(limit=a.limit)]
    r = measure(m.backend, prompts, tokens=a.tokens, depth=a.depth, fanout=a.fanout)
    print(f"{a.target}: {r['prompts']} prompts, {r['nodes']} true-path nodes (depth {a.depth}, fan-out "
          f"{a.fanout}), argmax flips vs chain {r['argmax_flips']}, max |dlogit| {r['max_abs_dlogit']:.4f}")


if __name__ == "__main__":
    main()
