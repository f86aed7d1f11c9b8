"""The apps' side of LoRA-Drop and the lossy modes: calibration text, `export --lora-drop`, `generate --lossy`.

Calibration text = the dev-set prompts' first turns, chat-formatted ("prompts"), optionally followed by the
model's own greedy completion ("completions"). Held-out evaluation uses the prompts after the first `n`
(perf/loradrop_ppl.py), so the dev set is split by position: [0, n) fit, [n, ...) held out.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from .devset import default_devset, load_prompts
from ..runtime.decode import decode
from ..runtime.request import PLAIN, Request
from ..runtime.loradrop import Corrections, LoRADropFit, fit, require_reuse
from ..runtime.lossy import EntropySwitch, LoRADropLossy, LoRADropLossySpec, LossyMode, LossySpec


def calibration_tokens(loaded, n_prompts: int = 16, completion_tokens: int = 0, offset: int = 0
                       ) -> tuple[list[np.ndarray], dict]:
    """Token sequences of dev prompts [offset, offset + n_prompts) (+ greedy completions) and their provenance."""
    path = default_devset()
    prompts = load_prompts(path, spread=False)[offset:offset + n_prompts]
    tok = loaded.tokenizer
    seqs = []
    for p in prompts:
        ids = np.asarray(tok.chat_ids(p.text), dtype=np.int32)
        if completion_tokens:
            req = Request(max_tokens=completion_tokens, eos_ids=tok.eos_ids)  # greedy
            out = [e.token for e in decode(loaded.backend, ids, PLAIN, req)]
            ids = np.concatenate([ids, np.asarray(out, dtype=np.int32)])
        seqs.append(ids)
    prov = {"source": "completions" if completion_tokens else "prompts", "devset": path.name,
            "devset_sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "prompts": [offset, offset + n_prompts],
            "completion_tokens": completion_tokens, "model": loaded.path.name}
    return seqs, prov


def export_lora_drop(loaded, spec: LoRADropFit, out: Path, n_prompts: int = 16, completion_tokens: int = 0) -> Path:
    """Fit on the calibration text and save lora_drop.npz + lora_drop.json into `out`."""
    seqs, prov = calibration_tokens(loaded, n_prompts, completion_tokens)
    return fit(loaded.backend, seqs, spec, prov).save(out)


def lossy_mode(spec: LossySpec, target, *, cache_dir: Path | None = None, ctx: int | None = None) -> LossyMode:
    """The lossy mode a spec names, with what it needs loaded (corrections, or the small model on the target's
    engine with the target's tokenizer)."""
    from .load import load_model  # load imports this module for the drafter
    if isinstance(spec, LoRADropLossySpec):
        return LoRADropLossy(load_corrections(spec.dir, target))
    small = load_model(spec.model, target.kind, ctx=ctx, cache_dir=cache_dir)
    if small.tokenizer.fingerprint() != target.tokenizer.fingerprint():
        raise ValueError(f"--lossy {spec}: {spec.model} has a different tokenizer from the target; pick one family")
    return EntropySwitch(small.backend, spec.threshold, min_dwell=spec.dwell)


def load_corrections(path: str | None, target) -> Corrections:
    """Fitted corrections from a directory, or pure reuse (rank 0, cycle 4) with None; needs drop steps (the NumPy
    reference or a layered ONNX artifact)."""
    require_reuse(target.backend)
    if path is None:
        from ..runtime.loradrop import droppable_layers, pure_reuse
        cfg = target.backend.config
        return pure_reuse(cfg.d_model, droppable_layers(cfg.n_layers), 4)
    corrections = Corrections.load(Path(path))
    corrections.check(target.backend.config)  # at start-up, not at the first draft
    return corrections

