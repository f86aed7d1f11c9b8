"""Speculation under a JSON-schema constraint on dev prompts: tokens/s of plain and n-gram decoding, free and
constrained, and the grammar mask's cost per token.

    python -m specedge.perf.constrained --model smollm2-135m --backend llamacpp --limit 20 --max-tokens 256

Each prompt asks (system message) for a JSON answer; the constrained runs give the model SCHEMA through llguidance
(runtime/constraint.py). Every configuration runs each prompt in turn in one process; speedups are ratios of
summed decode time for the same prompts. `identical` counts prompts whose n-gram output equals plain decoding's
(greedy: it must be all of them). Mask cost = time in Constraint.allowed per committed token (masks are computed
for the committed position and each verified draft position, so speculation computes more of them per token).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from ..assembly.decoder import DecodeSettings, ModelSettings
from ..assembly.open import open_decoder
from ..assembly.environment import cpu_info
from ..assembly.load import parse_drafter
from ..runtime.backends import BackendKind
from ..runtime.generate import stream
from ..runtime.request import Request
from ..runtime.stats import DecodeStats
from .bench import read_prompts

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["title", "category", "steps", "difficulty"],
          "properties": {"title": {"type": "string", "maxLength": 40},
                         "category": {"enum": ["writing", "reasoning", "math", "coding", "knowledge", "other"]},
                         "steps": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 40}},
                         "difficulty": {"type": "integer", "minimum": 1, "maximum": 5}}}
SYSTEM = ("You answer with one JSON object with the keys title, category, steps (a list of short strings) and "
          "difficulty (1 to 5) describing how to answer the user's request.")


def main(argv=None) -> None:
    from ..runtime.constraint import JsonSchema
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--backend", default="llamacpp", choices=[k.value for k in BackendKind])
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    settings = ModelSettings(a.model, BackendKind(a.backend), threads=a.threads)
    plain = open_decoder(settings, DecodeSettings(parse_drafter("none"), a.k, False), plan=False)
    decoders = {"none": plain, "ngram": plain.with_decode(DecodeSettings(parse_drafter("ngram"), a.k, False))}
    model = plain.model
    compiler = decoders["none"].grammar_compiler()
    tok = model.tokenizer
    prompts = read_prompts(limit=a.limit)
    configs = [(c, d) for c in ("free", "json") for d in ("none", "ngram")]
    acc = {cfg: {"s": 0.0, "n": 0, "fwd": 0, "mask_s": 0.0, "masks": 0, "out": []} for cfg in configs}
    for p in prompts:
        ids = tok.encode(tok.apply_chat_template([{"role": "system", "content": SYSTEM},
                                                  {"role": "user", "content": p.text}]))
        for c, d in configs:
            constraint = compiler.compile(JsonSchema(SCHEMA)) if c == "json" else None
            st, dec = DecodeStats(), decoders[d]
            toks = [r.token for r in stream(model.backend, tok, ids, dec.spec,
                                            Request(max_tokens=a.max_tokens, constraint=constraint), stats=st)]
            r = acc[(c, d)]
            r["s"] += st.decode_s
            r["n"] += st.n_generated
            r["fwd"] += st.n_target_forwards
            r["out"].append(toks)
            if constraint is not None:
                r["mask_s"] += constraint.mask_s
                r["masks"] += constraint.n_masks
    cpu = cpu_info()
    rows = []
    print(f"CPU: {cpu[0]}, {a.threads} threads; {a.model} on {a.backend}; {len(prompts)} dev prompts x "
          f"<= {a.max_tokens} tokens, greedy, k={a.k}")
    print("| output | drafter | tok/s | tokens per target call | speedup vs plain (same output) | identical to plain "
          "| mask ms per token | masks per token |")
    print("|---|---|---|---|---|---|---|---|")
    for c, d in configs:
        r, base = acc[(c, d)], acc[(c, "none")]
        same = sum(x == y for x, y in zip(r["out"], base["out"]))
        tps = r["n"] / r["s"]
        row = {"output": c, "drafter": d, "tokens_per_s": tps, "tau": r["n"] / max(r["fwd"], 1),
               "speedup": tps / (base["n"] / base["s"]), "identical": same, "n_prompts": len(prompts),
               "mask_ms_per_token": 1e3 * r["mask_s"] / max(r["n"], 1), "masks_per_token": r["masks"] / max(r["n"], 1)}
        rows.append(row)
        print(f"| {c} | {d} | {tps:.1f} | {row['tau']:.2f} | {row['speedup']:.2f}x | {same}/{len(prompts)} | "
              f"{row['mask_ms_per_token']:.3f} | {row['masks_per_token']:.2f} |")
    valid = sum(_valid(tok.decode([t for t in o if t not in tok.eos_ids])) for o in acc[("json", "ngram")]["out"])
    print(f"constrained outputs that parse and validate against the schema: {valid}/{len(prompts)}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"cpu": cpu[0], "rows": rows, "valid": valid, "args": vars(a)}, f, indent=1)


def _valid(text: str) -> bool:
    try:
        import jsonschema
        jsonschema.validate(json.loads(text), SCHEMA)
        return True
    except Exception:  # a cut-off answer (max tokens) does not parse
        return False


if __name__ == "__main__":
    main()
