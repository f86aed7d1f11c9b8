"""BERT sentence encoders (architecture `BertModel`, e.g. all-MiniLM-L6-v2) in NumPy: text -> one normalised vector.

A sentence-transformers folder or zip (the catalogue's `all-minilm-l6-v2` is the zip its package ships) holds:

    config.json              BertModel: hidden size, layers, heads, eps, max positions
    model.safetensors        F32 weights (embeddings.*, encoder.layer.N.*; read here, no torch, no code run)
    tokenizer.json           the WordPiece tokenizer (`tokenizers`), [CLS] ... [SEP]
    1_Pooling/config.json    the pooling mode (mean, cls or max over tokens; mean when absent)
    sentence_bert_config.json  max_seq_length (longer inputs are truncated to it, as sentence-transformers does)

forward: word + position + token-type embeddings, LayerNorm; per layer: self-attention (padding masked), add +
LayerNorm, GELU (erf) feed-forward, add + LayerNorm; then pooling over the real tokens and L2 normalisation (cosine
similarity is a dot product). Batches are padded to their longest input; padding never changes a vector.
"""
from __future__ import annotations

import json
import math
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import ModelFileError

POOLING_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max"}


class _Files:
    """Read members of a folder or a zip by name."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.zip = zipfile.ZipFile(path) if path.is_file() else None

    def has(self, name: str) -> bool:
        return name in self.zip.namelist() if self.zip else (self.path / name).is_file()

    def read(self, name: str) -> bytes:
        try:
            return self.zip.read(name) if self.zip else (self.path / name).read_bytes()
        except (KeyError, FileNotFoundError):
            raise ModelFileError(f"{self.path}: no {name}: not a sentence-transformers model") from None


def read_safetensors(data: bytes) -> dict[str, np.ndarray]:
    """F32/F16 tensors (as float32) of a safetensors file (an 8-byte header length, a JSON header, raw little-endian data)."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base, out = 8 + n, {}
    dtypes = {"F32": np.float32, "F16": np.float16}
    for name, spec in header.items():
        if name == "__metadata__" or name.endswith("position_ids"):  # a buffer (0..n-1), not a weight
            continue
        if spec["dtype"] not in dtypes:
            raise ModelFileError(f"tensor {name}: dtype {spec['dtype']} is not supported (F32, F16)")
        a, b = spec["data_offsets"]
        arr = np.frombuffer(data, dtypes[spec["dtype"]], (b - a) // np.dtype(dtypes[spec["dtype"]]).itemsize,
                            base + a)
        out[name] = arr.reshape(spec["shape"]).astype(np.float32)
    return out


@dataclass(frozen=True)
class BertConfig:
    hidden: int
    layers: int
    heads: int
    eps: float
    max_positions: int
    max_tokens: int  # sentence-transformers' max_seq_length
    pooling: str  # mean | cls | max


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _erf(x: np.ndarray) -> np.ndarray:
    """erf, vectorised, relative error < 1.2e-7 (Numerical Recipes' erfc Chebyshev fit; NumPy has no erf)."""
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    erfc = t * np.exp(poly)
    return np.where(x >= 0, 1.0 - erfc, erfc - 1.0).astype(np.float32)


class BertEncoder:
    """A sentence encoder: `embed(texts)` -> float32 [n, hidden], each row L2-normalised."""

    def __init__(self, path: str | Path, name: str = "") -> None:
        from tokenizers import Tokenizer
        path = Path(path)
        files = _Files(path)
        cfg = json.loads(files.read("config.json"))
        if "BertModel" not in (cfg.get("architectures") or []) and cfg.get("model_type") != "bert":
            raise ModelFileError(f"{path}: architecture {cfg.get('architectures')} is not BertModel")
        if cfg.get("hidden_act", "gelu") != "gelu" or cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ModelFileError(f"{path}: only GELU and absolute positions are supported")
        pooling = "mean"
        if files.has("1_Pooling/config.json"):
            pc = json.loads(files.read("1_Pooling/config.json"))
            modes = [m for k, m in POOLING_MODES.items() if pc.get(k)]
            if len(modes) != 1 or any(pc.get(k) for k in pc if k.startswith("pooling_mode") and k not in POOLING_MODES):
                raise ModelFileError(f"{path}: pooling {pc} is not supported (one of mean, cls, max)")
            pooling = modes[0]
        max_tokens = cfg["max_position_embeddings"]
        if files.has("sentence_bert_config.json"):
            max_tokens = min(max_tokens, json.loads(files.read("sentence_bert_config.json")).get("max_seq_length",
                                                                                                  max_tokens))
        self.config = BertConfig(cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
                                 float(cfg.get("layer_norm_eps", 1e-12)), cfg["max_position_embeddings"], max_tokens,
                                 pooling)
        w = read_safetensors(files.read("model.safetensors"))
        self.w = {k.removeprefix("bert."): v for k, v in w.items()}
        self.tokenizer = Tokenizer.from_str(files.read("tokenizer.json").decode())
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_tokens)
        self.name = name or path.stem
        self.dim, self.pooling = self.config.hidden, self.config.pooling

    def weight_bytes(self) -> int:
        return sum(v.nbytes for v in self.w.values())

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [len(e.ids) for e in self.tokenizer.encode_batch(list(texts))]

    def embed(self, texts: Sequence[str], batch: int = 32) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        out = []
        for i in range(0, len(texts), batch):
            out.append(self._batch(list(texts[i:i + batch])))
        return np.concatenate(out)

    def _batch(self, texts: list[str]) -> np.ndarray:
        c, w = self.config, self.w
        enc = self.tokenizer.encode_batch(texts)
        n, t = len(enc), max(len(e.ids) for e in enc)
        ids = np.zeros((n, t), np.int64)
        types = np.zeros((n, t), np.int64)
        mask = np.zeros((n, t), bool)
        for i, e in enumerate(enc):
            ids[i, :len(e.ids)], types[i, :len(e.ids)], mask[i, :len(e.ids)] = e.ids, e.type_ids, True
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:t][None]
             + w["embeddings.token_type_embeddings.weight"][types])
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], c.eps)
        h, d = c.heads, c.hidden // c.heads
        bias = np.where(mask, 0.0, -1e9).astype(np.float32)[:, None, None, :]
        for li in range(c.layers):
            p = f"encoder.layer.{li}."

            def lin(name, v):
                return v @ w[p + name + ".weight"].T + w[p + name + ".bias"]
            q, k, v = (lin(f"attention.self.{m}", x).reshape(n, t, h, d).transpose(0, 2, 1, 3)
                       for m in ("query", "key", "value"))
            s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + bias
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            a = (s @ v).transpose(0, 2, 1, 3).reshape(n, t, c.hidden)
            x = _layer_norm(lin("attention.output.dense", a) + x, w[p + "attention.output.LayerNorm.weight"],
                            w[p + "attention.output.LayerNorm.bias"], c.eps)
            f = lin("intermediate.dense", x)
            f = 0.5 * f * (1.0 + _erf(f / math.sqrt(2.0)))
            x = _layer_norm(lin("output.dense", f) + x, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"],
                            c.eps)
        m = mask[..., None]
        if c.pooling == "mean":
            pooled = (x * m).sum(1) / m.sum(1)
        elif c.pooling == "cls":
            pooled = x[:, 0]
        else:
            pooled = np.where(m, x, -np.inf).max(1)
        pooled = pooled.astype(np.float32)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
