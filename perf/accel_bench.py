"""Verify cost T(n)/T(1), plain tokens/s and n-gram speculative speedup of ONNX artifacts on several execution
providers, measured in one process (docs/accelerators.md holds the tables and the commands).

    python -m specedge.perf.accel_bench --targets cuda=ART@cuda cpu=ART@cpu --widths 1 2 4 8 16 32 --prompts 8

A target is LABEL=ARTIFACT@DEVICE[,width=N][,graph=0|1] (DEVICE as --device takes it: cpu, cuda, openvino:CPU, ...;
width: the ONNX backend's fixed_width, rows of every session run, 0 for calls at their own width; graph: its
cuda_graph; left out, the backend's defaults: 16 rows and CUDA graphs for the GPU graph, runtime/backends/onnxrt.py). T(n): wall time of
one forward of n tokens appended at --ctx cached tokens and rolled back (perf/verify_cost.py's definition), the
minimum over --rounds x --reps, targets interleaved by round. tok/s: plain greedy decoding, prefill excluded, best
of --rounds. --prompts N: the first N dev prompts (assembly/data/specbench-dev.jsonl, first turn, chat template),
decoded plainly and with the n-gram drafter at --k (fixed k), --max-tokens each; reports the speedup (sum of plain
decode times / sum of speculative ones), the mean accepted length and whether every speculative output equals the
plain one token for token. --invariance: the largest |difference| between a token's logits from one-token calls and
from verify calls of 2, 5 and 9 tokens (after --ctx cached tokens, 45 tokens teacher-forced), and how many of those
rows change their top-1 token.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from importlib import resources

import numpy as np

from ..assembly.load import load_onnx
from ..assembly.timing import time_forward
from ..runtime.backends.onnxrt import OnnxBackend
from ..runtime.decode import decode
from ..runtime.request import PLAIN, Request, Speculation
from ..runtime.drafters.ngram import NgramDrafter
from ..runtime.stats import DecodeStats
from ..runtime.types import SamplingParams
from .verify_cost import plain_tok_s


def dev_prompts(tokenizer, n: int) -> list[np.ndarray]:
    lines = resources.files("specedge.assembly").joinpath("data/specbench-dev.jsonl").read_text("utf-8").splitlines()
    out = []
    for line in lines[:n]:
        text = json.loads(line)["turns"][0]
        try:
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}])
        except ValueError:  # no chat template: the raw prompt
            pass
        out.append(np.asarray(tokenizer.encode(text), dtype=np.int32))
    return out


def speculative(model, prompts, k: int, max_tokens: int) -> dict:
    """Plain vs n-gram speculative greedy over `prompts`: speedup, tau, identical outputs."""
    params, plain_s, spec_s, same, tau = SamplingParams(), 0.0, 0.0, True, []
    for p in prompts:
        ps, ss = DecodeStats(), DecodeStats()
        plain = [e.token for e in decode(model.backend, p, PLAIN, Request(params, max_tokens=max_tokens, eos_ids=()),
                                         stats=ps)]
        spec = [e.token for e in decode(model.backend, p, Speculation(NgramDrafter(), k=k),
                                        Request(params, max_tokens=max_tokens, eos_ids=()), stats=ss)]
        plain_s += ps.decode_s
        spec_s += ss.decode_s
        same &= plain == spec
        tau.append(ss.mean_accepted_length)
    return dict(speedup=plain_s / spec_s, tau=float(np.mean(tau)), identical=bool(same), prompts=len(prompts),
                plain_tok_s=len(prompts) * max_tokens / plain_s, spec_tok_s=len(prompts) * max_tokens / spec_s)


def invariance(be, rng, ctx: int) -> dict:
    """Verify rows vs one-token rows of the same tokens (the module docstring)."""
    toks = rng.integers(0, be.config.vocab_size, ctx + 45).astype(np.int32)
    one_cache = be.new_cache(len(toks) + 1)
    be.forward(toks[:ctx], one_cache)
    one = np.stack([be.forward(toks[i:i + 1], one_cache)[0] for i in range(ctx, len(toks))])
    worst, flips = 0.0, 0
    for width in (2, 5, 9):
        cache = be.new_cache(len(toks) + 1)
        be.forward(toks[:ctx], cache)
        many = np.concatenate([be.forward(toks[i:i + width], cache) for i in range(ctx, len(toks), width)])
        worst = max(worst, float(np.abs(many - one).max()))
        flips += int((many.argmax(-1) != one.argmax(-1)).sum())
    return dict(max_abs_diff=worst, top1_flips=flips, rows=3 * len(one))


def _args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", nargs="+", required=True, help="LABEL=ARTIFACT@DEVICE each")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32])
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=0)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--invariance", action="store_true")
    ap.add_argument("--out", default=None)
    return ap.parse_args(argv)


def _target(t: str, threads: int | None):
    """LABEL=ARTIFACT@DEVICE[,width=N][,graph=0|1] -> (label, device, loaded model)."""
    label, _, rest = t.partition("=")
    art, _, device = rest.rpartition("@")
    device, *options = device.split(",")
    m = load_onnx(art, device=device, threads=threads)
    if options:  # width=N, graph=0|1: OnnxBackend's fixed_width and cuda_graph
        kw = dict(o.split("=", 1) for o in options)
        unknown = set(kw) - {"width", "graph"}
        if unknown:
            raise SystemExit(f"{t}: unknown target options {sorted(unknown)} (width=N, graph=0|1)")
        m = dataclasses.replace(m, backend=OnnxBackend(
            m.manifest, device=device, threads=threads,
            fixed_width=int(kw["width"]) if "width" in kw else None, cuda_graph=kw.get("graph", "1") != "0"))
    print(f"{label}: {m.backend.choice.note}; session providers {m.backend.session.get_providers()}; fixed width "
          f"{getattr(m.backend, 'fixed_width', 0) or 'none'}, CUDA graphs {getattr(m.backend, 'cuda_graph', False)}",
          flush=True)
    return label, device, m


def _measure(runs, a, rng) -> None:
    """Rounds of T(n) at every width and a plain decode, interleaved over the targets."""
    cap = a.ctx + max(a.widths) + 1
    for _ in range(a.rounds):
        for _, _, m, times, speeds in runs:
            be = m.backend
            cache = be.new_cache(cap)
            be.forward(rng.integers(0, be.config.vocab_size, a.ctx).astype(np.int32), cache)
            for _ in range(3):
                time_forward(be, cache, 1, rng)
            for _ in range(a.reps):
                for n in a.widths:
                    times[n].append(time_forward(be, cache, n, rng))
            speeds.append(plain_tok_s(be, a.decode, rng))


def _report(rows, a) -> None:
    print(f"ctx={a.ctx} reps={a.reps} rounds={a.rounds} stat=min threads={a.threads}")
    print("| target | device | plain tok/s | T(1) ms | " + " | ".join(f"T({n})/T(1)" for n in a.widths[1:]) + " |")
    print("|---|---|---|---|" + "---|" * (len(a.widths) - 1))
    for r in rows:
        print(f"| {r['target']} | {r['device']} | {r['tok_s']:.1f} | {r['ms'][a.widths[0]]:.2f} | "
              + " | ".join(f"{r['ratio'][n]:.2f}" for n in a.widths[1:]) + " |")
    for r in rows:
        if "invariance" in r:
            v = r["invariance"]
            print(f"{r['target']}: verify rows (2, 5, 9 tokens per call) vs one-token rows: max |d| "
                  f"{v['max_abs_diff']:.3g}, top-1 changed in {v['top1_flips']} of {v['rows']}")
        if "spec" in r:
            s = r["spec"]
            print(f"{r['target']}: n-gram k={a.k} over {s['prompts']} dev prompts x {a.max_tokens} tokens: speedup "
                  f"{s['speedup']:.2f}x (plain {s['plain_tok_s']:.1f} tok/s, speculative {s['spec_tok_s']:.1f}), "
                  f"tau {s['tau']:.2f}, identical to plain: {s['identical']}")


def main(argv=None) -> None:
    a = _args(argv)
    rng = np.random.default_rng(0)
    runs = [(*_target(t, a.threads), {n: [] for n in a.widths}, []) for t in a.targets]
    _measure(runs, a, rng)
    rows = []
    for label, device, m, times, speeds in runs:
        ms = {n: 1e3 * min(v) for n, v in times.items()}
        row = dict(target=label, device=device, tok_s=max(speeds), ms=ms, ratio={n: ms[n] / ms[1] for n in ms})
        if a.invariance:
            row["invariance"] = invariance(m.backend, rng, a.ctx)
        if a.prompts:
            row["spec"] = speculative(m, dev_prompts(m.tokenizer, a.prompts), a.k, a.max_tokens)
        rows.append(row)
    _report(rows, a)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"args": vars(a), "time": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
