"""Embedding models: a name or path -> an object with `embed(texts) -> float32 [n, dim]` (rows L2-normalised),
`count_tokens(texts)`, `dim`, `name` and `pooling`.

    catalogue embedding model (all-minilm-l6-v2)      -> models/bert.py BertEncoder (NumPy; pulled on first use)
    a sentence-transformers folder or zip (BertModel) -> BertEncoder
    a generation model's GGUF (catalogue name, path)  -> runtime/backends/llamacpp_embed.py (llama.cpp, mean pooling)
"""
from __future__ import annotations

from pathlib import Path

from ..models.bert import BertEncoder
from ..models.catalog import CATALOG, resolve_embedding, resolve_model
from ..runtime.backends.llamacpp_embed import LlamaCppEmbedder


def is_embedding_model(model: str) -> bool:
    """A catalogue embedding model, or a sentence-transformers folder / zip."""
    entry = CATALOG.get(model)
    if entry is not None:
        return entry.kind == "embedding"
    p = Path(model)
    return (p.is_dir() and (p / "config.json").is_file() and (p / "1_Pooling").is_dir()) or \
        (p.suffix == ".zip" and p.is_file())


def open_embedder(model: str, *, cache_dir: Path | None = None, threads: int | None = None, ctx: int = 2048):
    """The embedder of `model` (see the module's table)."""
    if model in CATALOG and CATALOG[model].kind == "embedding":
        return _bert(resolve_embedding(model, cache_dir), model)
    if is_embedding_model(model):
        return _bert(Path(model), Path(model).stem)
    return LlamaCppEmbedder(resolve_model(model, cache_dir), n_ctx=ctx, n_threads=threads)


def _bert(path: Path, name: str) -> BertEncoder:
    return BertEncoder(path, name)
