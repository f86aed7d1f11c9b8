"""The layered profile: one graph per segment (embedding, each layer, final norm + LM head) over one weights file.

Self-speculative drafters (docs/algorithms.md 2.3 layer skip, 2.4 early exit, 2.5 LoRA-Drop) run the target's own layers
with a LayerPlan and need hidden states between layers; a runtime that owns one session per segment runs any
subset of layers, reads any layer's hidden state, and applies the head anywhere, with no second copy of a weight:

    input_ids ─► embed.onnx ─► h0 ─► layer.0.onnx ─► h1 ─► ... ─► layer.{L-1}.onnx ─► hL ─► head.onnx ─► logits
                                      past/present K/V 0             past/present K/V L-1

Every segment is built by the shared builders (onnx_block.py's `embed` and `block`, onnx_graph.py's attention plumbing
and `head`), so a layer graph is the declared block exactly as the monolithic graph emits it. The hidden
state crosses a segment boundary as a pair (residual r, delta d), h = r + d, and the next segment does the add
fused with its norm, exactly as the monolithic graph fuses each residual Add with the next RMSNorm, so all layers
give the monolithic graph's logits bit for bit (the next layer a plan runs is not known at export time):

    (r, d) ─► SkipRMSNorm(attn_norm) ─► attention ─► SkipRMSNorm(+h, ffn_norm) ─► mlp ─► (r', d')
               └─ h = r + d ──────────────────────────┘ └─ r' = h + attn ──────────────┘
The pad row (onnx_graph.pad_rows: batch invariance) is appended inside each layer and head graph and cut before its
outputs, so hidden states cross segment boundaries as [1, T, D] and the runtime never sees it:

    (r, d) [1, T, D] ─► pad_rows ─► block (T + 1 rows) ─► unpad_rows ─► (r', d') [1, T, D]
All segments share one external-data file; a tensor that several graphs name (the RoPE tables every layer uses,
the embedding a tied float head reads) is stored once at one offset, and the runtime loads it once and hands the
same OrtValue to every session (SessionOptions.add_initializer; runtime/backends/onnx_layered.py).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto
from onnx.external_data_helper import set_external_data

from ..models.config import ModelConfig
from .onnx_block import block, embed
from .onnx_graph import (PAD_ROW, PAD_ROWS, AttnFeeds, DynamicBlocks, GraphIO, check_dynamic, head, pad_rows,
                         padded_lengths, rms_norm, rope_tables_for, skip_rms_norm, unpad_rows, window_biases)
from .onnx_ir import GraphBuilder
from .onnx_linear import ExportOptions, TensorRecord, WeightFormat, WeightSource

LAYERED_DATA = "weights.onnx.data"
EXTERNAL_MIN_BYTES = 1024  # smaller initializers stay inside their graph file
ALIGN = 64  # offsets of tensors in the shared data file


@dataclass(frozen=True)
class LayeredIO:
    """Segment graph names (the manifest's `io`; the KV names are GraphIO's)."""

    hidden_in: str = "hidden_in"  # float32 [1, T, D]: residual part r of a layer's / the head's input h = r + d
    delta_in: str = "delta_in"  # float32 [1, T, D]: delta part d (zeros after the embedding)
    hidden_out: str = "hidden_out"  # float32 [1, T, D]: the embedding's output h0 / a layer's residual r'
    delta_out: str = "delta_out"  # float32 [1, T, D]: a layer's MLP output d' (its h' = r' + d')
    attn_bias: str = "attn_bias"  # float32 [1, 1, T, L + T]: added to a layer's attention scores (0 or -inf);
    #   the new columns carry a tree's ancestor mask, the cached ones mask slots the layer did not write (LoRA-Drop)


@dataclass(frozen=True)
class Segments:
    """File names of the segment graphs (the manifest's `segments`)."""

    embed: str
    layers: tuple[str, ...]
    head: str
    shared: tuple[str, ...]  # initializers more than one graph names (loaded once, shared across sessions)


def build_layered(cfg: ModelConfig, src: WeightSource, opts: ExportOptions, io: GraphIO = GraphIO(),
                  lio: LayeredIO = LayeredIO()) -> tuple[dict[str, onnx.ModelProto], dict[str, TensorRecord]]:
    """{file name: graph} for the embedding, every layer and the head; plus the tensor records."""
    check_dynamic(cfg, "the layered ONNX profile")
    records: dict[str, TensorRecord] = {}
    doc = f"{cfg.arch} {{}}, {opts.fmt.value} weights (layered profile)"
    g = GraphBuilder("embed")
    ids = g.input(io.input_ids, np.int64, [1, "T"])
    h = embed(g, cfg, src, opts, ids, records)
    g.op("Identity", [h], "out", outputs=[lio.hidden_out])
    g.output(lio.hidden_out, np.float32, [1, "T", cfg.d_model])
    graphs = {"embed.onnx": g.model(producer="specedge", doc=doc.format("embedding"))}
    for i in range(cfg.n_layers):
        graphs[f"layer.{i}.onnx"] = _layer_graph(cfg, src, opts, io, lio, i, records).model(
            producer="specedge", doc=doc.format(f"layer {i}"))
    g = GraphBuilder("head")
    h = g.input(lio.hidden_in, np.float32, [1, "T", cfg.d_model])
    d = g.input(lio.delta_in, np.float32, [1, "T", cfg.d_model])
    if cfg.tied_embeddings and opts.fmt in (WeightFormat.FP32, WeightFormat.FP16):
        table = src.float("embed")  # the tied float head reads the embedding table (stored once, shared)
        g.const("embed.weight", table if opts.fmt is WeightFormat.FP32 else table.astype(np.float16))
    with g.scope("norm"):
        x, _ = skip_rms_norm(g, cfg, src, d, h, "norm", "final_norm")
        x = pad_rows(g, cfg, x)
    with g.scope("head"):
        head(g, cfg, src, opts, io, x, records)
    graphs["head.onnx"] = g.model(producer="specedge", doc=doc.format("final norm + LM head"))
    return graphs, records


def _layer_graph(cfg: ModelConfig, src: WeightSource, opts: ExportOptions, io: GraphIO, lio: LayeredIO, i: int,
                 records: dict[str, TensorRecord]) -> GraphBuilder:
    """Layer i alone (the docstring's block): the same onnx_block.block as the monolithic graph."""
    g = GraphBuilder(f"layer.{i}")
    h = g.input(lio.hidden_in, np.float32, [1, "T", cfg.d_model])
    d = g.input(lio.delta_in, np.float32, [1, "T", cfg.d_model])
    seqlens = g.input(io.seqlens_k, np.int32, [1])
    total = g.input(io.total_length, np.int32, [])
    tables = rope_tables_for(g, cfg, [i])
    pos, bias = _attention_feeds(g, io, lio, total)
    seqlens, total = padded_lengths(g, seqlens, total)
    feeds = AttnFeeds(seqlens, total, pos, bias, tables, window_biases(g, cfg, [i], pos, bias))
    em = DynamicBlocks(g, cfg, src, opts, records, io=io, feeds=feeds)
    p = f"layers.{i}"
    with g.scope(p):
        h, d = pad_rows(g, cfg, h, "pad_row_hidden"), pad_rows(g, cfg, d, "pad_row_delta")
        if i == 0:  # d is zero after the embedding: the plain norm the monolithic graph's layer 0 has
            h = g.op1("Add", [h, d], "embed_delta")
            x = rms_norm(g, cfg, src, h, f"{p}.attn_norm", "attn_norm")
        else:
            x, h = skip_rms_norm(g, cfg, src, d, h, f"{p}.attn_norm", "attn_norm")
        h, m = block(em, i, x, h)
        unpad_rows(g, h, 1, "residual", outputs=(lio.hidden_out,))
        unpad_rows(g, m, 1, "delta", outputs=(lio.delta_out,))
    g.output(lio.hidden_out, np.float32, [1, "T", cfg.d_model])
    g.output(lio.delta_out, np.float32, [1, "T", cfg.d_model])
    return g


def _attention_feeds(g: GraphBuilder, io: GraphIO, lio: LayeredIO, total: str) -> tuple[str, str]:
    """position_ids [1, T + 1] and attention_bias [1, 1, T + 1, L + T + 1] as GroupQueryAttention sees them (the pad
    row (onnx_graph.pad_rows) gets position L + T and zero bias). Unlike the monolithic graph's [T, T] tree_bias,
    the bias spans the cached columns too, so the runtime can hide slots a LoRA-Drop drop step left unwritten.

        position_ids [1, T] ───► Concat(L + T) ──────────────────────────► [1, T + 1]
        attn_bias [1, 1, T, L + T] ───► Pad(1 row and 1 column at the end, zeros) ──► [1, 1, T + 1, L + T + 1]
    """
    pos = g.input(io.position_ids, np.int64, [1, "T"])
    bias = g.input(lio.attn_bias, np.float32, [1, 1, "T", "total"])
    with g.scope("attn_feeds"):
        tot = g.op1("Reshape", [g.op1("Cast", [total], "total", to=onnx.TensorProto.INT64),
                                g.const("attn_feeds.one_by_one", np.array([1, 1], np.int64))], "total_2d")
        pos = g.op1("Concat", [pos, tot], "pad_position", axis=1)
        pads = g.const("attn_feeds.pads", np.array([0, 0, 0, 0, 0, 0, PAD_ROWS, PAD_ROWS], np.int64))
        bias = g.op1("Pad", [bias, pads], "pad_bias")  # constant 0
    return pos, bias


def save_layered(graphs: dict[str, onnx.ModelProto], out: Path) -> tuple[list[str], tuple[str, ...]]:
    """Write every graph and one shared data file (each distinct initializer once, 64-byte aligned); returns
    (files written, names of initializers more than one graph holds). Same name, different bytes is an error."""
    seen: dict[str, tuple[int, int, bytes]] = {}  # name -> (offset, length, bytes)
    users: dict[str, int] = {}
    (out / LAYERED_DATA).unlink(missing_ok=True)
    with open(out / LAYERED_DATA, "wb") as f:
        for model in graphs.values():
            for t in model.graph.initializer:
                raw = t.raw_data
                if len(raw) < EXTERNAL_MIN_BYTES:
                    continue
                if t.name in seen:
                    if seen[t.name][2] != raw:
                        raise ValueError(f"initializer {t.name!r} differs between segment graphs; a shared name "
                                         "must hold the same tensor (rename one in export/onnx_layered.py)")
                else:
                    f.seek(-(-f.tell() // ALIGN) * ALIGN)
                    seen[t.name] = (f.tell(), len(raw), raw)
                    f.write(raw)
                users[t.name] = users.get(t.name, 0) + 1
                offset, length, _ = seen[t.name]
                set_external_data(t, LAYERED_DATA, offset, length)
                t.data_location = TensorProto.EXTERNAL
                t.ClearField("raw_data")
    for name, model in graphs.items():
        onnx.save_model(model, str(out / name))
    return [*graphs, LAYERED_DATA], tuple(sorted(n for n, k in users.items() if k > 1))


def layered_fields(cfg: ModelConfig, opts: ExportOptions, graphs: dict[str, onnx.ModelProto],
                   shared: tuple[str, ...], kv_pad_rows: int) -> dict:
    """The manifest's profile-specific fields for a layered artifact."""
    segs = Segments("embed.onnx", tuple(f"layer.{i}.onnx" for i in range(cfg.n_layers)), "head.onnx", shared)
    assert set(graphs) == {segs.embed, *segs.layers, segs.head}
    return {"segments": {**asdict(segs), "layers": list(segs.layers), "shared": list(shared)},
            "accuracy_level": opts.accuracy_level, "exact_mins": opts.exact_mins,
            "io": {**asdict(GraphIO()), **asdict(LayeredIO()), "kv_layout": "BNSH [1, n_kv_heads, max_ctx, head_dim]",
                   "kv_dtype": "float32", "max_positions": cfg.context_length,
                   "attention": "com.microsoft.GroupQueryAttention shared buffers", "kv_pad_rows": kv_pad_rows,
                   "pad_row": PAD_ROW}}
