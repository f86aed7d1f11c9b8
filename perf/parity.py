"""Next-token parity between the NumPy reference and llama.cpp on dev-prompt prefixes.

    python -m specedge.perf.parity --model smollm2-135m --limit 40

Each chat-formatted dev prompt is evaluated once by each backend (one batched call, logits for every
position); a position agrees when both argmaxes match. Two comparisons:
  * `f32`: llama.cpp on an F32 GGUF rewrite of the NumPy backend's own float32 weights (float32 KV cache),
    so both compute the same function and only the arithmetic order differs;
  * `file`: llama.cpp on the original (quantized) file with its default float16 KV cache. Here llama.cpp
    also quantizes activations to 8 bits inside its quantized dot products, which moves near-ties.
"""
from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from ..models.gguf_in import GGUFModel, open_gguf
from ..export.gguf_out import write_gguf
from ..runtime.backends.blas import every_core
from ..runtime.backends.numpy_ref import NumpyBackend
from ..runtime.tokenizer import Tokenizer
from ..assembly.devset import load_prompts


@dataclass(frozen=True)
class Parity:
    positions: int
    agree: int
    max_abs_diff: float
    near_tie_disagreements: int  # disagreements where the reference's top-2 margin is below 0.1

    @property
    def agreement(self) -> float:
        return self.agree / max(self.positions, 1)

    def summary(self) -> str:
        return (f"top-1 agreement {self.agree}/{self.positions} = {self.agreement:.2%}, "
                f"max |dlogit| {self.max_abs_diff:.2e}, disagreements at near-ties (<0.1) "
                f"{self.near_tie_disagreements}/{self.positions - self.agree}")


def prompt_prefixes(tokenizer: Tokenizer, limit: int, max_len: int) -> list[np.ndarray]:
    """Chat-formatted dev prompts, truncated to max_len tokens."""
    return [tokenizer.chat_ids(p.text)[:max_len]
            for p in load_prompts(limit=limit)]


def compare(reference, other, prompts: list[np.ndarray]) -> Parity:
    """Both backends evaluate every prompt in one call; compare argmax at every position."""
    return compare_all(reference, {"other": other}, prompts)["other"]


def compare_all(reference, others: Mapping[str, object], prompts: list[np.ndarray]) -> dict[str, Parity]:
    """`compare` against several backends, the reference evaluating each prompt once for all of them (its logits
    for one prompt at a time are kept, not every prompt's: 40 x 256 positions x 49k vocab would be 2 GB)."""
    counts = {name: [0, 0, 0, 0.0] for name in others}  # positions, agree, near-tie disagreements, max |dlogit|
    for ids in prompts:
        with every_core():  # the slow side, on every core even where an engine set BLAS to one (blas.py)
            want = reference.forward(ids, reference.new_cache(len(ids)))
        top2 = np.partition(want, -2, axis=-1)[:, -2:]  # [T, 2], the larger last (a full sort: 3x longer)
        near_tie = (top2[:, 1] - top2[:, 0]) < 0.1
        for name, other in others.items():
            got = other.forward(ids, other.new_cache(len(ids)))
            same = want.argmax(-1) == got.argmax(-1)
            c = counts[name]
            c[0], c[1], c[2] = c[0] + len(ids), c[1] + int(same.sum()), c[2] + int(near_tie[~same].sum())
            c[3] = max(c[3], float(np.abs(want - got).max()))
    return {name: Parity(p, a, worst, ties) for name, (p, a, ties, worst) in counts.items()}


def f32_rewrite(source: GGUFModel, folder: Path) -> Path:
    """The source's dequantized float32 weights as an F32 GGUF in `folder`."""
    return write_gguf(folder / f"{source.path.stem}.f32.gguf", source, source.load_weights(), dtype="f32")


def run(model_path: Path, *, limit: int = 40, max_len: int = 256, threads: int = 2) -> dict[str, Parity]:
    from ..runtime.backends.llamacpp import LlamaCppBackend
    source = open_gguf(model_path)
    prompts = prompt_prefixes(Tokenizer(source.tokenizer_spec()), limit, max_len)
    n_ctx = max(len(p) for p in prompts)
    reference = NumpyBackend(source.load_weights())
    with tempfile.TemporaryDirectory() as tmp:
        f32 = open_gguf(f32_rewrite(source, Path(tmp)))
        return compare_all(reference, {
            "file": LlamaCppBackend(source.path, source.config, n_ctx=n_ctx, n_threads=threads),
            "f32": LlamaCppBackend(f32.path, f32.config, n_ctx=n_ctx, n_threads=threads, f32_kv=True,
                                   flash_attn=False)}, prompts)


def main(argv=None) -> None:
    from ..models.catalog import resolve_model
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    for name, p in run(resolve_model(a.model), limit=a.limit, max_len=a.max_len, threads=a.threads).items():
        print(f"{name:5s} {p.summary()}")


if __name__ == "__main__":
    main()
