"""Upstream llama-server (b11434, scripts/build_llama_server.sh) runs a head exported by `specedge export HEAD_DIR
--format gguf` as llama.cpp's eagle3: a 4-layer tiny llama target and a random head, greedy; the answer equals plain
llama-server's, and the first draft round's candidates it logs at -lv 5 (3 positions, top 3 ids and probabilities)
equal our head's on our NumPy reference's taps (a wrong Q/K permutation or tap index fails it).

    python -m specedge.perf.eagle3_check

Not a pytest: CI does not build llama-server (~10 minutes on 2 cores); tests/test_head_gguf.py checks the file.
"""
from __future__ import annotations

import argparse
import json
import re
import tempfile
import urllib.request
from pathlib import Path

import numpy as np

from ..export.head_gguf import write_head_gguf
from ..models.catalog import model_cache_dir
from ..models.gguf_in import open_gguf
from ..models.tiny import write_tiny_gguf
from ..runtime.drafters.head_model import random_head, save_head
from .bench_server import LlamaServer, free_port
from .llama_server_build import find_llama_server, missing_message

TAPS = (1, 2, 3)
SHAPE = dict(n_heads=4, n_kv_heads=2, head_dim=16, ffn=96, vocab_draft=60, seed=5)


CANDIDATE = re.compile(r"draft candidate +(\d+), pos +(\d+): +(\d+) \( *([0-9.]+)\)")


def first_draft_round(log: str) -> dict[tuple[int, int], tuple[int, float]]:
    """{(pos, rank): (token id, p)} of the first draft() call (llama.cpp prints them before 'called impl')."""
    head = log.split("called impl draft-eagle3", 1)[0]
    return {(int(p), int(k)): (int(t), float(q)) for k, p, t, q in CANDIDATE.findall(head)}


def our_first_draft_round(gguf, head_dir, prompt, first, n) -> dict[tuple[int, int], tuple[int, float]]:
    """The same round from our head on our NumPy reference's taps: top 3 of each of n chained steps, p renormalized
    over the top 10 as llama.cpp's top-k sampler shows it."""
    from ..runtime.backends.numpy_ref import NumpyBackend
    from ..runtime.drafters.head import HeadCache, HeadRunner
    from ..runtime.drafters.head_model import HeadModel
    weights = open_gguf(gguf).load_weights()
    backend = NumpyBackend(weights, np.float64)
    _, taps = backend.hidden(np.asarray(prompt), backend.new_cache(64), taps=TAPS)
    head = HeadModel.load(head_dir)
    run, cache, embed = HeadRunner(head), HeadCache(2, 16, 64), np.asarray(weights["embed"], np.float32)
    g, tokens = run.fuse([taps[n] for n in TAPS]), list(prompt) + [first]
    o = run.step(cache, g, embed[tokens[1:]], np.arange(1, len(tokens)))[-1:]
    out = {}
    for pos in range(n):
        logits = run.logits(o)[0].astype(np.float64)
        top = np.argsort(-logits)[:10]
        p = np.exp(logits[top] - logits[top[0]])
        for rank in range(3):
            out[(pos, rank)] = (int(head.d2t[top[rank]]), float(p[rank] / p.sum()))
        drafted = int(head.d2t[top[0]])
        o = run.step(cache, o, embed[[drafted]], np.array([len(tokens) + pos]))
    return out


def complete(port: int, prompt: list[int], n: int) -> dict:
    body = json.dumps({"prompt": prompt, "n_predict": n, "temperature": 0, "cache_prompt": False,
                       "return_tokens": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as res:
        return json.loads(res.read())


def check(tmp_path: Path) -> None:
    """Raises AssertionError naming what differs; prints what it compared."""
    found = find_llama_server(model_cache_dir())
    if found is None:
        raise SystemExit(missing_message(model_cache_dir()))
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", n_layers=4, seed=0)
    cfg, arrays = random_head(open_gguf(gguf).config, TAPS, **SHAPE)
    head_dir = save_head(tmp_path / "head", cfg, arrays)
    path = write_head_gguf(tmp_path / "head.gguf", head_dir, open_gguf(gguf), dtype="f32")
    prompt, answers, logs = [5, 17, 33, 2, 41, 8, 9], {}, {}
    for name, extra in (("plain", []), ("eagle3", ["-md", str(path), "--spec-type", "draft-eagle3",
                                                   "--spec-draft-n-max", "3", "-lv", "5"])):
        port = free_port()
        server = LlamaServer([str(found.path), "-m", str(gguf), "-t", "2", "-c", "256", "--host", "127.0.0.1",
                              "--port", str(port), *extra], port)
        try:
            server.wait_ready()
            answers[name] = complete(port, prompt, 8)
            logs[name] = server.tail(10 ** 6)
        finally:
            server.close()
    plain, spec = answers["plain"], answers["eagle3"]
    assert spec["tokens"] == plain["tokens"] and len(plain["tokens"]) == 8
    assert spec["timings"]["draft_n"] > 0 and "EAGLE3 extract_layers = [1, 2, 3]" in logs["eagle3"]
    theirs = first_draft_round(logs["eagle3"])
    ours = our_first_draft_round(gguf, head_dir, prompt, plain["tokens"][0], 3)
    assert theirs.keys() == ours.keys(), (sorted(theirs), sorted(ours))
    for key, (token, p) in ours.items():
        assert theirs[key][0] == token and abs(theirs[key][1] - p) <= 2e-3, (key, theirs[key], (token, p))
    print(f"llama-server {found.path}: eagle3 answer == plain greedy ({plain['tokens']}), "
          f"{spec['timings']['draft_n']} tokens drafted; its first draft round (3 positions x top 3) == our head's")


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        check(Path(d))


if __name__ == "__main__":
    main()
