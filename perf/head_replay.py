"""A trained head's tau replayed over the target's own answers (docs/train_drafter.md, "What holds the SmolLM2 head
back on chat"): from every answer position (the trainer's tau_eval) and from the positions a decode starts its chains
at (after each verify: the root, then root + accepted + 1, ...), by task, with the share of answer tokens inside the
head's draft vocabulary. The same teacher-forced torch head the trainer evaluates, so a decode's measured tau can be
told apart from the trainer's: the two differ by where chains start, not by what is drafted. Extra `train` (torch).

    python -m specedge.perf.head_replay HEAD_DIR [--prompts dev|FILE] [--skip 12] [--limit 18] [--drafts 4]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def decode_roots(run: np.ndarray) -> np.ndarray:
    """The drafts accepted at the roots a decode visits, given run[r] (accepted from root r): r = 0, then
    r + run[r] + 1 (the accepted drafts and the verify's own token)."""
    out, r = [], 0
    while r < len(run):
        out.append(int(run[r]))
        r += int(run[r]) + 1
    return np.array(out, dtype=np.int64)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("head", type=Path, help="a train-drafter output folder (head.json, train/checkpoint.pt)")
    ap.add_argument("--prompts", default="dev", help="dev (the shipped dev set) or a .jsonl / text file")
    ap.add_argument("--skip", type=int, default=12)
    ap.add_argument("--limit", type=int, default=18)
    ap.add_argument("--drafts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    import torch
    from ..assembly.load import load_model
    from ..export.train_head.artifact import target_embedding
    from ..export.train_head.data import Sequences, answer_with_taps
    from ..export.train_head.model import HeadConfig, build_head
    from ..export.train_head.train import accepted_runs
    from ..runtime.backends import BackendKind
    from .bench import read_prompts
    torch.set_num_threads(a.threads)
    meta = json.loads((a.head / "head.json").read_text())
    model = load_model(meta["target"]["model"], BackendKind.NATIVE, threads=a.threads)
    prompts = read_prompts(None if a.prompts == "dev" else Path(a.prompts), limit=a.skip + a.limit)[a.skip:]
    tokens, taps, lens, plens = [], [], [], []
    for p in prompts:
        ids = np.asarray(model.tokenizer.chat_ids(p.text), np.int32)
        reply, tapped = answer_with_taps(model.backend, ids, a.max_tokens, model.tokenizer.eos_ids, tuple(meta["taps"]))
        tokens.append(np.concatenate([ids, reply]))
        taps.append(tapped)
        lens.append(len(ids) + len(reply))
        plens.append(len(ids))
    seqs = Sequences(np.concatenate(tokens), np.concatenate(taps), np.concatenate([[0], np.cumsum(lens)]),
                     np.array(plens), "")
    state = torch.load(a.head / "train" / "checkpoint.pt", weights_only=False)  # our own checkpoint
    head = build_head(HeadConfig(**state["config"]), target_embedding(model.gguf))
    head.load_state_dict(state["head"])
    head.eval()
    d2t = np.asarray(state["d2t"], np.int64)
    t2d = np.full(model.gguf.config.vocab_size, -1, np.int64)
    t2d[d2t] = np.arange(len(d2t))
    rows: dict[str, list] = {}
    for i, p in enumerate(prompts):
        with torch.no_grad():
            run = accepted_runs(head, seqs, i, t2d, a.drafts)
        answer = seqs.tokens[seqs.offsets[i] + plens[i]:seqs.offsets[i + 1]]
        rows.setdefault(p.task, []).append((run, decode_roots(run), (t2d[answer] >= 0).mean()))
    print(f"{a.head}: {len(prompts)} prompts, chains of up to {a.drafts} drafts")
    print("| task | prompts | tau, every position | tau, a decode's positions | answer tokens in the draft vocabulary |")
    print("|---|---|---|---|---|")
    every = [r for rs in rows.values() for r in rs]
    for name, rs in sorted(rows.items()) + [("all", every)]:
        print(f"| {name} | {len(rs)} | {1 + np.concatenate([r[0] for r in rs]).mean():.2f} | "
              f"{1 + np.concatenate([r[1] for r in rs]).mean():.2f} | {100 * np.mean([r[2] for r in rs]):.1f}% |")


if __name__ == "__main__":
    main()
