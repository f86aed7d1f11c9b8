"""Time to first token over a multi-turn chat, with and without KV-cache reuse across turns (one decoder and one
runtime/session.py Session, as apps/api.py's Engine and `specedge chat` run them).

    python -m specedge.perf.chat_ttft [--targets llamacpp:smollm2-135m onnx:smollm2-135m-onnx-int4] [--turns 5]
        [--max-tokens 32] [--reps 3] [--threads 2] [--out ttft.json]

Per target: one decoder; a 5-turn conversation (chat template, greedy, so both modes see the same answers),
once reusing the cache (the normal chat) and once with a session reset before each turn (the baseline: every turn
prefills the whole conversation). Modes alternate per repetition so machine-load drift hits both; the table shows
the median TTFT per turn and the prompt tokens each turn prefilled.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from ..assembly.decoder import CallSettings, DecodeSettings, Decoder, ModelSettings
from ..assembly.open import open_decoder
from ..assembly.load import parse_drafter
from ..runtime.backends import BackendKind
from ..runtime.session import Session


class Chat:
    """A decoder and the one KV session its turns share."""

    def __init__(self, decoder: Decoder) -> None:
        self.decoder, self.session = decoder, Session(decoder.model.backend, decoder.model_settings.ctx)

    def reset(self) -> None:
        self.session.reset()

    def chat(self, messages: list[dict], max_tokens: int):
        tok = self.decoder.tokenizer
        ids = tok.encode(tok.apply_chat_template(messages))
        return self.decoder.run(ids, CallSettings(max_tokens=max_tokens, temperature=0.0), session=self.session)

SYSTEM = ("You are a helpful, concise assistant running on a small device. Answer in plain sentences, keep answers "
          "short, and say so when you are not sure about something.")
TURNS = ("What is speculative decoding, in two sentences?",
         "Why does it not change the output?",
         "Give me an example with a draft of three tokens.",
         "What happens when the second token is rejected?",
         "Summarise our conversation in one sentence.",
         "Thanks. One more tip for running models on phones?")


def conversation(engine: Chat, turns: int, max_tokens: int, reuse: bool) -> list[dict]:
    """One conversation of `turns` user messages; per turn: ttft_s, prompt_tokens, n_prefilled, reused."""
    engine.reset()
    messages, rows = [{"role": "system", "content": SYSTEM}], []
    for i in range(turns):
        messages.append({"role": "user", "content": TURNS[i % len(TURNS)]})
        if not reuse:
            engine.reset()
        c = engine.chat(messages, max_tokens)
        rows.append(dict(ttft_s=c.stats.ttft_s, prompt_tokens=c.prompt_tokens, n_prefilled=c.stats.decode.n_prefilled,
                         reused=c.stats.reused_prompt_tokens))
        messages.append({"role": "assistant", "content": c.text})
    return rows


def measure(engine: Chat, turns: int, max_tokens: int, reps: int) -> dict:
    """Median TTFT per turn in both modes over `reps` alternating repetitions (after one warm-up conversation)."""
    conversation(engine, 1, 4, True)  # warm-up: first-call allocations out of turn 1
    runs: dict[str, list[list[dict]]] = {"reuse": [], "reset": []}
    for _ in range(reps):
        for mode in runs:
            runs[mode].append(conversation(engine, turns, max_tokens, mode == "reuse"))
            print(f"  {mode}: TTFT ms " + " ".join(f"{1e3 * r['ttft_s']:.0f}" for r in runs[mode][-1]),
                  file=sys.stderr, flush=True)
    out = {}
    for mode, convs in runs.items():
        out[mode] = [dict(convs[0][t], ttft_s=float(np.median([c[t]["ttft_s"] for c in convs])))
                     for t in range(turns)]
    return out


def table(label: str, r: dict) -> str:
    lines = [f"{label}", "| turn | prompt tokens | reuse: prefilled | reuse: TTFT ms | reset: prefilled | "
             "reset: TTFT ms |", "|---|---|---|---|---|---|"]
    for t, (a, b) in enumerate(zip(r["reuse"], r["reset"]), 1):
        lines.append(f"| {t} | {a['prompt_tokens']} | {a['n_prefilled']} | {1e3 * a['ttft_s']:.1f} | "
                     f"{b['n_prefilled']} | {1e3 * b['ttft_s']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", nargs="+", default=["llamacpp:smollm2-135m", "onnx:smollm2-135m-onnx-int4"],
                    help="BACKEND:MODEL (a catalogue name, GGUF path or ONNX artifact)")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--drafter", default="ngram")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    a = ap.parse_args(argv)
    results = {}
    for target in a.targets:
        backend, _, model = target.partition(":")
        settings = ModelSettings(model, BackendKind(backend), ctx=a.ctx, threads=a.threads)
        engine = Chat(open_decoder(settings, DecodeSettings(parse_drafter(a.drafter)), plan=False))
        results[target] = measure(engine, a.turns, a.max_tokens, a.reps)
        print(table(f"{target} (drafter {a.drafter}, {a.max_tokens} tokens per answer, median of {a.reps})",
                    results[target]), flush=True)
        del engine
    if a.out is not None:
        a.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "results": results}, indent=1))
    return results


if __name__ == "__main__":
    main()
