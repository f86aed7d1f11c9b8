"""The suffix drafter's memory of past answers (docs/algorithms.md 2.9) on a repeated ask and a multi-turn chat:
tok/s and tau against plain decoding, greedy, each answer checked identical to plain's.

    python -m specedge.perf.suffix_memory [--targets native:smollm2-135m]
        [--drafters none ngram suffix ngram+suffix suffix+tree:16] [--k 8] [--fixed-k] [--prompts 3] [--turns 5]
        [--max-tokens 96] [--threads 2] [--out suffix.json]

Per target one loaded model; per drafter a fresh decoder (so a fresh, empty memory) with one Session, as the
Engine and `specedge chat` run them:
  repeat   each prompt asked twice in a row (chat template, greedy); the table counts the second asks
  chat     one conversation of `turns` user messages (perf/chat_ttft.py's), every answer fed back
Configurations run one after another on each item (prompt or turn), so slow drift of the machine hits them alike.
tok/s = generated tokens / decode seconds (prefill excluded); tau = tokens emitted per target forward.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..assembly.decoder import CallSettings, DecodeSettings, Decoder, ModelSettings
from ..assembly.load import parse_drafter
from ..assembly.open import load
from ..runtime.backends import BackendKind
from ..runtime.session import Session
from .chat_ttft import SYSTEM, TURNS

ASKS = ("Explain speculative decoding in two sentences.",
        "Write a Python function that returns the n-th Fibonacci number.",
        "List five tips for a good night's sleep.",
        "What is the difference between a list and a tuple in Python?")


class Runner:
    """One drafter's decoder and session, and its per-scenario totals."""

    def __init__(self, model, settings: ModelSettings, drafter: str, k: int, adaptive: bool) -> None:
        self.decoder = Decoder(model, settings, DecodeSettings(parse_drafter(drafter), k, adaptive))
        self.session = Session(model.backend, settings.ctx)
        self.totals: dict[str, dict[str, float]] = {}

    def ask(self, messages: list[dict], max_tokens: int, scenario: str | None):
        tok = self.decoder.tokenizer
        ids = tok.encode(tok.apply_chat_template(messages))
        r = self.decoder.run(ids, CallSettings(max_tokens=max_tokens, temperature=0.0, repetition_stop=False),
                             session=self.session)
        if scenario is not None:
            d, t = r.stats.decode, self.totals.setdefault(scenario, dict(tokens=0, decode_s=0.0, forwards=0,
                                                                          emitted=0, identical=0, n=0))
            t["tokens"] += d.n_generated
            t["decode_s"] += d.decode_s
            t["forwards"] += d.n_target_forwards
            t["emitted"] += d.n_emitted
            t["n"] += 1
        return r


def run(runners: dict[str, Runner], prompts: int, turns: int, max_tokens: int) -> None:
    def each(messages, scenario):
        out = {name: rn.ask(messages, max_tokens, scenario) for name, rn in runners.items()}
        plain = out[next(iter(runners))].tokens
        if scenario is not None:
            for name, r in out.items():
                runners[name].totals[scenario]["identical"] += int(r.tokens == plain)
        return out[next(iter(runners))].text

    for p in ASKS[:prompts]:
        messages = [{"role": "user", "content": p}]
        each(messages, None)  # the first ask fills the memory
        each(messages, "repeat")
        print(f"  repeat: {p[:40]}", file=sys.stderr, flush=True)
    for rn in runners.values():
        rn.session.reset()
    messages = [{"role": "system", "content": SYSTEM}]
    for i in range(turns):
        messages.append({"role": "user", "content": TURNS[i % len(TURNS)]})
        messages.append({"role": "assistant", "content": each(messages, "chat")})
        print(f"  chat: turn {i + 1}", file=sys.stderr, flush=True)


def table(target: str, runners: dict[str, Runner]) -> list[dict]:
    rows, base = [], {}
    for name, rn in runners.items():
        for scenario, t in rn.totals.items():
            tps = t["tokens"] / max(t["decode_s"], 1e-9)
            base.setdefault(scenario, tps)
            rows.append(dict(target=target, scenario=scenario, drafter=name, tokens_per_s=tps,
                             tau=t["emitted"] / max(t["forwards"], 1), speedup=tps / base[scenario],
                             identical=f"{t['identical']}/{t['n']}", tokens=t["tokens"]))
    return sorted(rows, key=lambda r: (r["scenario"] != "repeat", list(runners).index(r["drafter"])))


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", nargs="+", default=["native:smollm2-135m"], help="BACKEND:MODEL each")
    ap.add_argument("--drafters", nargs="+", default=["none", "ngram", "suffix", "ngram+suffix", "suffix+tree:16"],
                    help="the first is the baseline (plain: none)")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--fixed-k", action="store_true", help="no adaptive draft length (k drafted every round)")
    ap.add_argument("--prompts", type=int, default=3, help=f"repeated asks (at most {len(ASKS)})")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    rows = []
    for target in a.targets:
        backend, _, model_name = target.partition(":")
        settings = ModelSettings(model_name, BackendKind(backend), ctx=a.ctx, threads=a.threads)
        model = load(settings)
        runners = {d: Runner(model, settings, d, a.k, not a.fixed_k) for d in a.drafters}
        run(runners, a.prompts, a.turns, a.max_tokens)
        rows += table(target, runners)
    k = f"{a.k} fixed" if a.fixed_k else f"<= {a.k} adaptive"
    print(f"| target | scenario | drafter (k {k}) | tok/s | tau | speedup vs {a.drafters[0]} | identical | tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['target']} | {r['scenario']} | {r['drafter']} | {r['tokens_per_s']:.1f} | {r['tau']:.2f} | "
              f"{r['speedup']:.2f}x | {r['identical']} | {r['tokens']} |")
    if a.out is not None:
        a.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
