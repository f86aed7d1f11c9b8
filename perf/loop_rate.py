"""How often `specedge chat`-style answers run away: the loop rate of sampling settings on the dev prompts.

    python -m specedge.perf.loop_rate [--models smollm2-135m gemma3-270m] [--prompts 20] [--ctx 4096]
        [--configs "t0.7 p0.9 rp1" "t0.7 p0.9"] [--seeds 1] [--max-tokens N] [--out loops.json]

Each dev prompt (spread over the categories) is asked as a first chat turn, with no max_tokens, as `specedge chat`
asks it, once per config and seed. An answer **loops** when a 16-token span occurs 3 times in it (the answer is
stopped there), or **runs away** when it reaches the context limit (with --max-tokens, an answer cut there is
**capped**: what `specedge chat` does for a base model); the table shows, per model and config, how many
answers ended by themselves, looped, or ran away, and their median length. Speed is not measured (other work may
share the CPU). Config tokens: tN temperature, pN top_p, kN top_k, mN min_p, rpN repeat_penalty, dryN
dry_multiplier (DRY with llama.cpp's base 1.75 and allowed length 2), "greedy"; what a
config leaves out takes the chat defaults (a sampled call's repeat_penalty is 1.1 and its DRY multiplier 0.8: "rp1"
and "dry0" turn them off; docs/algorithms.md has the table that chose them).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from ..assembly.decoder import CallSettings, Decoder, DecodeSettings, ModelSettings
from ..assembly.devset import load_prompts
from ..assembly.load import parse_drafter
from ..assembly.open import open_decoder
from ..runtime.backends import BackendKind

SPAN, TIMES = 16, 3  # a 16-token span seen 3 times: a loop


def loops(tokens: list[int]) -> bool:
    """Whether some SPAN-token window occurs TIMES times in `tokens` (overlaps allowed)."""
    if len(tokens) < SPAN * TIMES:
        return False
    seen = Counter(tuple(tokens[i:i + SPAN]) for i in range(len(tokens) - SPAN + 1))
    return max(seen.values()) >= TIMES


def parse_config(text: str) -> dict:
    """'t0.7 p0.9 k40 rp1.1' -> CallSettings keywords."""
    names = {"t": "temperature", "p": "top_p", "k": "top_k", "m": "min_p", "rp": "repeat_penalty",
             "dry": "dry_multiplier"}
    out = {}
    for part in text.split():
        if part == "greedy":
            out["temperature"] = 0.0
            continue
        key = next((k for k in ("dry", "rp") if part.startswith(k)), part[0])
        value = part[len(key):]
        out[names[key]] = int(value) if key == "k" else float(value)
    return out


def answer(decoder: Decoder, prompt: str, call: CallSettings) -> tuple[str, int]:
    """(outcome, tokens): outcome 'ended', 'loop', 'capped' (max_tokens) or 'context'."""
    tok = decoder.tokenizer
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": prompt}]))
    tokens: list[int] = []
    stream = decoder.stream(ids, call)
    try:
        for r in stream:
            if r.token is not None:
                tokens.append(int(r.token))
            if len(tokens) % SPAN == 0 and loops(tokens):
                return "loop", len(tokens)
            if r.finish_reason is not None:
                if r.finish_reason.value == "length":
                    return ("capped" if call.max_tokens is not None and len(tokens) >= call.max_tokens
                            else "context"), len(tokens)
                return "ended", len(tokens)
    finally:
        stream.close()
    return "ended", len(tokens)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--configs", nargs="+", default=["t0.7 p0.9 rp1 dry0", "t0.7 p0.9 dry0", "t0.7 p0.9"])
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=None, help="cap each answer (default: none, as chat)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    prompts = load_prompts(limit=a.prompts)
    rows = []
    for model in a.models:
        settings = ModelSettings(model, BackendKind.LLAMACPP, ctx=a.ctx, threads=a.threads)
        decoder = open_decoder(settings, DecodeSettings(parse_drafter("none")), plan=False)
        for config in a.configs:
            kw = parse_config(config)
            outcomes, lengths = Counter(), []
            for seed in range(a.seeds):
                for p in prompts:
                    outcome, n = answer(decoder, p.text, CallSettings(seed=seed, max_tokens=a.max_tokens, **kw))
                    outcomes[outcome] += 1
                    lengths.append(n)
                    print(f"{model} [{config}] seed {seed} q{p.qid}: {outcome} after {n} tokens", file=sys.stderr)
            rows.append({"model": model, "config": config, "answers": sum(outcomes.values()), **outcomes,
                         "median_tokens": float(np.median(lengths))})
    print(f"{'model':14s} {'config':24s} {'answers':>7s} {'ended':>6s} {'loop':>5s} {'context':>7s} {'capped':>6s} "
          f"{'median':>7s}")
    for r in rows:
        print(f"{r['model']:14s} {r['config']:24s} {r['answers']:7d} {r.get('ended', 0):6d} {r.get('loop', 0):5d} "
              f"{r.get('context', 0):7d} {r.get('capped', 0):6d} {r['median_tokens']:7.0f}")
    if a.out:
        a.out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
