"""The cost of one sampled row: `logits_to_probs` + `sample` for one row of logits, by vocabulary size and sampling
settings, with the caches warm and, with --stream-mb, right after streaming that much memory (as a forward's weight
stream leaves them: about 0.3 ms more for a gemma3-270m row here, docs/benchmarks.md "Stop 60").

    python -m specedge.perf.sampling_cost --vocab 262144 49152 --stream-mb 256

The rows: seeded normal(0, 2.5) logits with 20 tokens raised by 8-14 (one peaked row, as a chat answer's), a history
of 300 tokens with a repeated span, so the penalties and DRY have work. Medians of --calls calls per row, over --rows
rows; a markdown table, and --out json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from ..runtime.sampling import logits_to_probs, sample
from ..runtime.types import SamplingParams

BREAKERS = frozenset(range(0, 9331, 7))  # 1,333 ids, as many as gemma3-270m's DRY breakers
SETTINGS = {
    "chat defaults": SamplingParams(temperature=0.7, top_p=0.9, repeat_penalty=1.1, repeat_last_n=64,
                                    dry_multiplier=0.8, dry_breakers=BREAKERS),
    "t 0.7, top-p 0.9": SamplingParams(temperature=0.7, top_p=0.9),
    "t 1.0 alone": SamplingParams(temperature=1.0),
    "t 0.8, top-k 40, min-p 0.05": SamplingParams(temperature=0.8, top_k=40, min_p=0.05),
}


def rows_of(vocab: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """[n, vocab] float32 logits and a [300] history (tokens 100-160 repeated at 200-260)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 2.5, (n, vocab)).astype(np.float32)
    for r in x:
        r[rng.integers(0, vocab, 20)] += rng.uniform(8.0, 14.0, 20).astype(np.float32)
    history = rng.integers(0, min(vocab, 2000), 300)
    history[200:260] = history[100:160]
    return x, history


def row_ms(logits: np.ndarray, history: np.ndarray, params: SamplingParams, calls: int,
           stream: np.ndarray | None) -> float:
    """Median ms of one row's logits_to_probs + sample (the stream read before each call, untimed)."""
    rng = np.random.default_rng(1)
    times = []
    for _ in range(calls):
        if stream is not None:
            stream.sum()
        t0 = time.perf_counter()
        sample(logits_to_probs(logits, params, history)[0], rng)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def measure(vocabs: list[int], rows: int, calls: int, stream_mb: int) -> list[dict]:
    stream = np.ones(stream_mb * 2 ** 20 // 8) if stream_mb else None
    out = []
    for vocab in vocabs:
        logits, history = rows_of(vocab, rows)
        for name, params in SETTINGS.items():
            rec = {"vocab": vocab, "settings": name,
                   "warm_ms": statistics.median(row_ms(r, history, params, calls, None) for r in logits)}
            if stream is not None:
                rec["after_stream_ms"] = statistics.median(row_ms(r, history, params, calls, stream) for r in logits)
            out.append(rec)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, nargs="+", default=[262144, 49152])
    ap.add_argument("--rows", type=int, default=8, help="distinct logits rows (default 8)")
    ap.add_argument("--calls", type=int, default=60, help="timed calls per row (default 60)")
    ap.add_argument("--stream-mb", type=int, default=0,
                    help="also time each call right after reading this many MB (a forward's weights; 0: warm only)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    recs = measure(a.vocab, a.rows, a.calls, a.stream_mb)
    streamed = a.stream_mb > 0
    print("| vocabulary | settings | ms a row, warm |" + (f" after {a.stream_mb} MB streamed |" if streamed else ""))
    print("|---|---|---|" + ("---|" if streamed else ""))
    for r in recs:
        after = f" {r['after_stream_ms']:.3f} |" if streamed else ""
        print(f"| {r['vocab']} | {r['settings']} | {r['warm_ms']:.3f} |{after}")
    if a.out is not None:
        a.out.write_text(json.dumps({"stream_mb": a.stream_mb, "rows": recs}, indent=1))


if __name__ == "__main__":
    main()
