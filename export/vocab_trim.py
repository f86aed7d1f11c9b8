"""VocabTrim at export (docs/algorithms.md 2.2): calibrate on target-generated text, keep the top-N ids, write
trimmed heads.

    calibrate(target, tokenizer, prompts)  greedy completions of the target for chat-formatted calibration prompts
                                           -> token counts [V]
    top_ids(counts, n, keep)               the N most frequent ids (ties: lower id first), `keep` always in; ascending
    write_drafter_vocab(out, src, ...)     into an exported artifact directory:
        drafter_vocab.json   {"ids": [...]}: drafted index j means token ids[j]
        drafter.onnx (+.data) the whole decoder with the LM head cut to those rows: logits [T, N]
                              (a separate drafter: the same KV inputs and outputs as model.onnx)
        head.onnx (+.data)    final norm + trimmed head on hidden states [T, D] (before the final norm) -> [T, N]
                              (self-speculative drafters: the ONNX twin of logits_from_hidden(h, rows=ids))
      and the manifest's `drafter_vocab` section (files hashed in `files`; models/manifest.py).
The runtime (runtime/vocab_trim.py) scatters the N logits into a full-vocabulary row with -inf elsewhere, so q is zero
off the list and verification stays exact (the residual keeps the off-list mass).
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from ..models.config import ModelConfig
from ..models.manifest import MANIFEST, sha256_file
from .onnx_graph import GraphIO, build_decoder, pad_rows, rms_norm, unpad_rows
from .onnx_ir import GraphBuilder
from .onnx_linear import ExportOptions, WeightSource, linear

VOCAB_FILE = "drafter_vocab.json"
DRAFTER_FILE, DRAFTER_DATA = "drafter.onnx", "drafter.onnx.data"
HEAD_FILE, HEAD_DATA = "head.onnx", "head.onnx.data"
HEAD_IO = {"hidden": "hidden", "logits": "logits"}  # head.onnx: float32 [T, D] -> [T, N]


@dataclass(frozen=True)
class Calibration:
    """Where the counts came from (the manifest's drafter_vocab.calibration)."""

    target: str  # the model that generated the completions
    engine: str  # llamacpp | numpy
    prompts: int
    max_tokens: int  # per prompt
    generated: int  # tokens counted
    source: str  # the prompt set (dev-set path)


def calibrate(target, tokenizer, prompts: Sequence[str], *, max_tokens: int = 64) -> tuple[np.ndarray, int]:
    """Greedy target completions of the chat-formatted prompts (as `specedge generate` formats them).

    target: a runtime Backend; tokenizer: runtime Tokenizer. returns: (counts int64 [V], tokens generated).
    Deterministic: greedy decoding, no RNG.
    """
    from ..runtime.decode import decode
    from ..runtime.request import PLAIN, Request
    counts = np.zeros(target.config.vocab_size, dtype=np.int64)
    n = 0
    for text in prompts:
        ids = tokenizer.chat_ids(text)
        for ev in decode(target, ids, PLAIN, Request(max_tokens=max_tokens, eos_ids=tokenizer.eos_ids)):
            counts[ev.token] += 1
            n += 1
    return counts, n


def top_ids(counts: np.ndarray, n: int, keep: Sequence[int] = ()) -> np.ndarray:
    """The n ids with the highest counts, ties to the lower id, every id of `keep` included; int32 ascending.

    >>> top_ids(np.array([5, 0, 3, 3, 9]), 3, keep=[1]).tolist()
    [0, 1, 4]
    """
    v = len(counts)
    keep = sorted({int(i) for i in keep if 0 <= int(i) < v})
    if not len(keep) <= n <= v:
        raise ValueError(f"--drafter-vocab {n} must be between {len(keep)} (the special ids kept) and the "
                         f"vocabulary size {v}")
    order = np.lexsort((np.arange(v), -np.asarray(counts)))  # by count descending, then id ascending
    chosen = list(keep)
    kept = set(keep)
    for i in order:
        if len(chosen) == n:
            break
        if int(i) not in kept:
            chosen.append(int(i))
    return np.sort(np.array(chosen, dtype=np.int32))


class TrimmedSource:
    """A WeightSource whose "lm_head" is the source's head (or the tied embedding) cut to rows `ids`; GGUF blocks
    are sliced by row, so transcoding stays exact."""

    def __init__(self, src: WeightSource, cfg: ModelConfig, ids: np.ndarray) -> None:
        self.src, self.ids = src, np.asarray(ids, dtype=np.int64)
        self._head = "embed" if cfg.tied_embeddings else "lm_head"

    def _name(self, name: str) -> str:
        return self._head if name == "lm_head" else name

    def float(self, name: str) -> np.ndarray:
        w = self.src.float(self._name(name))
        return np.ascontiguousarray(w[self.ids]) if name == "lm_head" else w

    def blocks(self, name: str) -> tuple[str, np.ndarray] | None:
        raw = self.src.blocks(self._name(name))
        return raw if raw is None or name != "lm_head" else (raw[0], np.ascontiguousarray(raw[1][self.ids]))

    def source_type(self, name: str) -> str:
        return self.src.source_type(self._name(name))


def trimmed_config(cfg: ModelConfig, n: int) -> ModelConfig:
    """The drafter graph's config: an untied head of n rows (the embedding table stays whole)."""
    return dataclasses.replace(cfg, vocab_size=n, tied_embeddings=False)


def build_head(cfg: ModelConfig, src: TrimmedSource, opts: ExportOptions) -> onnx.ModelProto:
    """Final norm + trimmed LM head on hidden states, with the pad row (onnx_graph.pad_rows) so the head's
    MatMulNBits sees >= 2 rows.

        hidden [T, D] ─► pad_rows ─► RMSNorm(norm) ─► lm_head (rows ids) ─► unpad_rows ─► logits [T, N]
    """
    g = GraphBuilder("vocab_trim_head")
    h = pad_rows(g, cfg, g.input(HEAD_IO["hidden"], np.float32, ["T", cfg.d_model]), axis=0)
    x = rms_norm(g, cfg, src, h, "norm", "norm")
    y, _ = linear(g, x, ["lm_head"], src, opts, "lm_head", "lm_head")
    unpad_rows(g, y, 0, "logits", outputs=(HEAD_IO["logits"],))
    g.output(HEAD_IO["logits"], np.float32, ["T", len(src.ids)])
    return g.model(producer="specedge", doc=f"final norm + LM head over {len(src.ids)} vocabulary rows")


def _save(model: onnx.ModelProto, out: Path, name: str, data: str) -> list[str]:
    for stale in (name, data):  # save_model appends to an existing data file
        (out / stale).unlink(missing_ok=True)
    onnx.save_model(model, str(out / name), save_as_external_data=True, all_tensors_to_one_file=True, location=data,
                    size_threshold=1024)
    return [name] + ([data] if (out / data).exists() else [])


def write_drafter_vocab(out: str | Path, src: WeightSource, cfg: ModelConfig, opts: ExportOptions, ids: np.ndarray,
                        calibration: Calibration | None) -> dict:
    """Write the id list, drafter.onnx and head.onnx into the artifact `out` (dynamic profile), hash them into its
    manifest and add the `drafter_vocab` section; returns that section.

    requires: out/manifest.json written by export_onnx for the same weights (src, cfg) and options.
    """
    out = Path(out)
    ids = np.asarray(ids, dtype=np.int32)
    if ids.ndim != 1 or len(ids) == 0 or np.any(np.diff(ids) <= 0) or ids[0] < 0 or ids[-1] >= cfg.vocab_size:
        raise ValueError(f"drafter vocabulary ids must be unique, ascending and in [0, {cfg.vocab_size})")
    trimmed = TrimmedSource(src, cfg, ids)
    (out / VOCAB_FILE).write_text(json.dumps({"ids": ids.tolist()}) + "\n", "utf-8")
    model, _ = build_decoder(trimmed_config(cfg, len(ids)), trimmed, opts, GraphIO())
    files = [VOCAB_FILE, *_save(model, out, DRAFTER_FILE, DRAFTER_DATA)]
    files += _save(build_head(cfg, trimmed, opts), out, HEAD_FILE, HEAD_DATA)
    path = out / MANIFEST
    manifest = json.loads(path.read_text("utf-8"))
    manifest["files"].update({f: {"sha256": sha256_file(out / f), "bytes": (out / f).stat().st_size} for f in files})
    section = {"file": VOCAB_FILE, "n": int(len(ids)), "vocab_size": cfg.vocab_size, "model": DRAFTER_FILE,
               "head": HEAD_FILE, "head_io": HEAD_IO,
               "calibration": None if calibration is None else dataclasses.asdict(calibration)}
    manifest["drafter_vocab"] = section
    path.write_text(json.dumps(manifest, indent=1) + "\n", "utf-8")
    return section
