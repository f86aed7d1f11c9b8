"""The shipped head: head.npz (float16 weights, d2t int64; loaded with allow_pickle=False) + head.json, per
docs/train_drafter.md; and the target arrays a head starts from, read through our GGUF reader (no torch here)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .data import file_sha256  # noqa: F401 - the command hashes the target file with it
from .model import HeadConfig

FORMAT = "specedge-draft-head"
VERSION = 1


def target_embedding(gguf) -> np.ndarray:
    """float32 [V, D]: the target's token embedding dequantized, times the family's embedding scale (what the head
    embeds its next token with)."""
    embed = gguf.load_tensor("embed")
    scale = gguf.config.block.embed_scale
    return embed * np.float32(scale) if scale != 1.0 else embed


def output_rows(gguf, embed: np.ndarray):
    """ids -> float32 [n, D]: the target's output head rows (the embedding's when tied) times its final norm's
    scale, so a head whose own final norm is 1 starts with the target's logits over those ids."""
    cfg = gguf.config
    head = embed / np.float32(cfg.block.embed_scale) if cfg.tied_embeddings else gguf.load_tensor("lm_head")
    norm = np.asarray(cfg.block.norm_scale(gguf.load_tensor("norm")), np.float32)

    def rows(ids: np.ndarray) -> np.ndarray:
        return head[np.asarray(ids, np.int64)] * norm[None, :]
    return rows


def head_arrays(head, d2t: np.ndarray) -> dict[str, np.ndarray]:
    """The torch head's weights as head.npz's arrays: float16 weights, d2t int64."""
    arrays = {name: getattr(head, name).detach().cpu().numpy().astype(np.float16) for name in head.cfg.shapes()}
    arrays["d2t"] = np.asarray(d2t, np.int64)
    return arrays


def manifest(cfg: HeadConfig, *, model: str, gguf_sha256: str, config, taps: tuple[int, int, int],
             training: dict) -> dict:
    """head.json (docs/train_drafter.md)."""
    return {"format": FORMAT, "version": VERSION,
            "target": {"model": model, "gguf_sha256": gguf_sha256, "arch": config.arch, "n_layers": config.n_layers,
                       "hidden": config.d_model, "vocab": config.vocab_size},
            "taps": [int(t) for t in taps], "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
            "head_dim": cfg.head_dim, "ffn": cfg.ffn, "rope_theta": cfg.rope_theta, "rms_eps": cfg.rms_eps,
            "vocab_draft": cfg.vocab_draft, "training": training}


def write_head(out: Path, arrays: dict[str, np.ndarray], meta: dict) -> Path:
    """Write head.npz then head.json into `out` (each atomically); the arrays are checked against the shapes
    head.json declares first."""
    cfg = HeadConfig(meta["target"]["hidden"], meta["n_heads"], meta["n_kv_heads"], meta["head_dim"], meta["ffn"],
                     meta["vocab_draft"], meta["rope_theta"], meta["rms_eps"])
    expected = {**cfg.shapes(), "d2t": (cfg.vocab_draft,)}
    wrong = {k: arrays[k].shape if k in arrays else None for k in expected
             if k not in arrays or arrays[k].shape != expected[k]}
    if wrong or set(arrays) != set(expected):
        raise ValueError(f"head arrays do not match head.json's shapes: {wrong or sorted(set(arrays) - set(expected))}")
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "head.tmp.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, out / "head.npz")
    (out / "head.json.tmp").write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(out / "head.json.tmp", out / "head.json")
    return out
