"""Parity gate: an exported artifact must reproduce the NumPy reference on fixed prompts, or the export fails.

    python -m specedge.export.parity_gate ARTIFACT_DIR SOURCE.gguf      (also run by every `specedge export`)

Both backends evaluate each prompt in one call (logits at every position). Measured: max |dlogit| over all
positions, and top-1 agreement (same argmax as the reference). Tolerances are per weight format (Tolerance.for_format,
numbers and reasons in docs/onnx.md): fp32 must be the same function, fp16 only rounds weights, and the 8-bit / 4-bit
formats also quantize activations to int8 inside the matmuls, which moves near-ties.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..models.config import Weights
from ..runtime.backends.numpy_ref import NumpyBackend
from ..runtime.tokenizer import Tokenizer

# Fixed prompts, one per kind of text the dev set holds; chat-formatted when the model has a template.
GATE_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "What is 17 multiplied by 23? Explain the steps.",
    "Summarize in two sentences: The Industrial Revolution began in Britain in the late 18th century and spread "
    "to Europe and North America, changing how goods were made and where people lived.",
    "Translate to French: The library opens at nine o'clock every morning.",
    "Give three tips for staying focused while studying.",
    "Who wrote 'Pride and Prejudice', and in which year was it published?",
    "Explain the difference between a list and a tuple in Python.",
    "Write a short poem about the sea at night.",
)


@dataclass(frozen=True)
class Tolerance:
    min_top1: float  # fraction of positions whose argmax equals the reference's
    max_dlogit: float  # max |logit difference| over all positions

    @classmethod
    def for_format(cls, weight_format: str, kv_dtype: str = "float32") -> "Tolerance":
        """Per-format defaults (docs/onnx.md: what each format measured on SmolLM2 and the tiny models); a float16
        attention and KV cache (the GPU graph) rounds fp32 weights' activations as fp16 weights round the weights."""
        if weight_format == "fp32" and kv_dtype == "float16":
            weight_format = "fp16"
        return {"fp32": cls(0.99, 0.01), "fp16": cls(0.97, 0.5)}.get(weight_format, cls(0.95, 6.0))


@dataclass(frozen=True)
class GateReport:
    weight_format: str
    prompts: int
    positions: int
    top1: float
    max_dlogit: float
    tolerance: Tolerance

    @property
    def passed(self) -> bool:
        return self.top1 >= self.tolerance.min_top1 and self.max_dlogit <= self.tolerance.max_dlogit

    def summary(self) -> str:
        t = self.tolerance
        verdict = "PASS" if self.passed else "FAIL"
        return (f"parity gate {verdict} ({self.weight_format}, {self.prompts} prompts, {self.positions} positions): "
                f"top-1 agreement {self.top1:.2%} (need >= {t.min_top1:.0%}), "
                f"max |dlogit| {self.max_dlogit:.4g} (need <= {t.max_dlogit:g})")

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


class ParityError(RuntimeError):
    """An artifact out of tolerance; the message carries the numbers."""

    def __init__(self, report: GateReport) -> None:
        super().__init__(report.summary())
        self.report = report


def gate_prompts(tokenizer: Tokenizer, max_len: int = 96, texts: Sequence[str] = GATE_PROMPTS) -> list[np.ndarray]:
    """Token ids of the fixed prompts, chat-formatted where the tokenizer has a template, cut to max_len."""
    out = []
    for text in texts:
        if tokenizer.chat_template:
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}])
        out.append(np.asarray(tokenizer.encode(text)[:max_len], dtype=np.int32))
    return [ids for ids in out if len(ids)]


def measure(backend, reference, prompts: Sequence[np.ndarray], weight_format: str,
            tolerance: Tolerance | None = None) -> GateReport:
    """Evaluate every prompt once on both backends; compare logits at every position. `reference` is the NumPy
    backend, or anything with the same new_cache / forward (transformers' forward for `--via optimum` exports)."""
    positions = agree = 0
    worst = 0.0
    for ids in prompts:
        want = reference.forward(ids, reference.new_cache(len(ids)))
        got = backend.forward(ids, backend.new_cache(len(ids)))
        agree += int((want.argmax(-1) == got.argmax(-1)).sum())
        positions += len(ids)
        worst = max(worst, float(np.abs(want - got).max()))
    return GateReport(weight_format, len(prompts), positions, agree / max(positions, 1), worst,
                      tolerance or Tolerance.for_format(weight_format))


def check_artifact(artifact: str | Path, weights: Weights, tokenizer: Tokenizer, *,
                   tolerance: Tolerance | None = None, threads: int | None = None,
                   verify_files: bool = True) -> GateReport:
    """Run the gate on an exported directory against the NumPy reference of `weights` (no exception on failure)."""
    from ..runtime.backends import open_onnx
    backend = open_onnx(artifact, threads=threads, verify=verify_files)
    prompts = gate_prompts(tokenizer, max_len=min(96, backend.caps.max_context or weights.config.context_length))
    m = backend.manifest
    return measure(backend, NumpyBackend(weights), prompts, m.weight_format,
                   tolerance or Tolerance.for_format(m.weight_format, str(m.io.get("kv_dtype", "float32"))))


def main(argv=None) -> None:
    import argparse
    import sys
    from ..models.gguf_in import open_gguf
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact")
    ap.add_argument("source", help="the GGUF the artifact was exported from")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    src = open_gguf(a.source)
    report = check_artifact(a.artifact, src.load_weights(), Tokenizer(src.tokenizer_spec()), threads=a.threads)
    print(report.summary())
    sys.exit(0 if report.passed else 1)


if __name__ == "__main__":
    main()
