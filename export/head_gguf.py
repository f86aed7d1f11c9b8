"""One of our draft heads (runtime/drafters/head_model.py) as llama.cpp's `eagle3` GGUF, for
`llama-server -m TARGET.gguf -md HEAD.gguf --spec-type draft-eagle3` (docs/drafters.md "The head in llama.cpp").

Written for llama.cpp build b11434 (the build `specedge bench --baseline llama-server` pins), read from its
src/models/eagle3.cpp, src/llama-arch.cpp and common/speculative.cpp:

    head.npz      GGUF tensor                  how
    fc            fc.weight                    as is: the taps concatenated in target_layers order
    input_norm    blk.0.attn_norm.weight       F32; RMSNorm of the token embedding, weight as is (no +1)
    hidden_norm   blk.0.attn_norm_2.weight     F32; RMSNorm of g
    wq, wk        blk.0.attn_q/attn_k.weight   rows permuted per head (models/llama.py permute_rows): eagle3 runs
                                               LLAMA_ROPE_TYPE_NORM (interleaved pairs), our head rotate-half
    wv, wo        blk.0.attn_v/attn_output     as is
    post_norm     blk.0.ffn_norm.weight        F32
    w_gate/up/down blk.0.ffn_gate/up/down      as is
    norm          output_norm.weight           F32
    lm_head       output.weight                as is: the draft vocabulary's rows
    d2t           d2t                          I64, absolute target ids (eagle3.cpp scatters the draft logits into
                                               the target vocabulary with ggml_set_rows at these rows)

No token_embd: eagle3 then reads the target's (as our head does). Keys: the head's shape under `eagle3.*`,
`eagle3.target_layers` = our taps (llama.cpp's layer id k is the input of target layer k, the hidden after the first
k layers: our tap's meaning, no offset), `eagle3.target_hidden_size` = D, and the target's `tokenizer.*` keys copied
with their stored types (llama-server checks the draft's vocabulary against the target's, and the scatter sizes
the logits by it). llama.cpp runs the pair (x_{t+1}, g_t) at position t where we rotate at t+1; RoPE scores depend
only on position differences, so the two agree.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, LlamaFileType

from ..models.catalog import file_sha256
from ..models.gguf_in import GGUFModel
from ..models.llama import permute_rows
from ..runtime.drafters.head_model import HeadConfig, HeadModel, read_head

ARCH = "eagle3"
BUILD = 11434  # the llama.cpp build this layout was read from
# Target architectures whose llama.cpp graph exposes layer inputs (res->t_layer_inp; b11434 src/models/*.cpp) among
# the families we read: eagle3 aborts on any other target ("layer input tensor is null").
TAPPABLE_ARCHS = frozenset({"llama", "qwen3"})
TENSORS = (("fc", "fc.weight"), ("input_norm", "blk.0.attn_norm.weight"),
           ("hidden_norm", "blk.0.attn_norm_2.weight"), ("wq", "blk.0.attn_q.weight"),
           ("wk", "blk.0.attn_k.weight"), ("wv", "blk.0.attn_v.weight"), ("wo", "blk.0.attn_output.weight"),
           ("post_norm", "blk.0.ffn_norm.weight"), ("w_gate", "blk.0.ffn_gate.weight"),
           ("w_up", "blk.0.ffn_up.weight"), ("w_down", "blk.0.ffn_down.weight"), ("norm", "output_norm.weight"),
           ("lm_head", "output.weight"), ("d2t", "d2t"))
_DTYPES = {"f16": (GGMLQuantizationType.F16, LlamaFileType.MOSTLY_F16),
           "f32": (GGMLQuantizationType.F32, LlamaFileType.ALL_F32)}


def check_exportable(config: HeadConfig, target: GGUFModel) -> None:
    """What llama.cpp b11434's eagle3 can run: three taps, each below the target's layer count (a tap at n_layers
    would be read from the target's nextn output, which these graphs do not produce), a tappable target. ValueError."""
    why = []
    if len(config.taps) != 3:
        why.append(f"it reads {len(config.taps)} taps; eagle3 takes exactly 3")
    if any(t >= config.n_layers for t in config.taps):
        why.append(f"its taps {list(config.taps)} reach {config.n_layers} (the output of the last layer); llama.cpp "
                   f"taps layer inputs 0..{config.n_layers - 1} only")
    arch = target.config.arch
    if arch not in TAPPABLE_ARCHS:
        why.append(f"the target is {arch}, whose llama.cpp graph exposes no layer inputs (eagle3 runs on "
                   f"{', '.join(sorted(TAPPABLE_ARCHS))} targets)")
    if why:
        raise ValueError(f"this head cannot run in llama.cpp b{BUILD}'s eagle3: {'; '.join(why)}; run it in specedge "
                         f"(--drafter head:<dir>) instead")


def gguf_arrays(config: HeadConfig, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GGUF tensor name -> the array to store (float32 weights, Q/K rows permuted, d2t int64); shapes numpy-order."""
    out = {}
    for ours, name in TENSORS:
        a = np.asarray(arrays[ours], dtype=np.int64 if ours == "d2t" else np.float32)
        if ours in ("wq", "wk"):
            a = permute_rows(a, config.n_heads if ours == "wq" else config.n_kv_heads)
        out[name] = np.ascontiguousarray(a)
    return out


def _add_keys(wr: GGUFWriter, config: HeadConfig, target: GGUFModel, file_type: LlamaFileType) -> None:
    wr.add_name(f"{config.model or target.path.stem} draft head (eagle3)")
    wr.add_file_type(int(file_type))
    wr.add_context_length(int(target.config.context_length))
    wr.add_embedding_length(config.hidden)
    wr.add_block_count(1)
    wr.add_feed_forward_length(config.ffn)
    wr.add_head_count(config.n_heads)
    wr.add_head_count_kv(config.n_kv_heads)
    wr.add_key_length(config.head_dim)
    wr.add_value_length(config.head_dim)
    wr.add_rope_dimension_count(config.head_dim)
    wr.add_rope_freq_base(float(config.rope_theta))
    wr.add_layer_norm_rms_eps(float(config.rms_eps))
    wr.add_vocab_size(config.vocab)
    wr.add_array(f"{ARCH}.target_layers", [int(t) for t in config.taps])
    wr.add_uint32(f"{ARCH}.target_hidden_size", config.hidden)
    wr.add_bool(f"{ARCH}.norm_before_residual", False)  # our residual is g itself, as convert_hf_to_gguf's default
    if config.gguf_sha256:
        wr.add_string("specedge.head.target_gguf_sha256", config.gguf_sha256)
    for key, v in target.typed_fields().items():
        if key.startswith("tokenizer.") and not (v.type == GGUFValueType.ARRAY and len(v.value) == 0):
            wr.add_key_value(key, v.value, v.type, v.sub_type)


def write_head_gguf(path: str | Path, head_dir: str | Path, target: GGUFModel, *, dtype: str = "f16") -> Path:
    """Write the head in `head_dir` (head.json + head.npz, read and checked by head_model.read_head) as an eagle3
    GGUF for `target` (the GGUF it was trained on, checked: sizes, and its SHA-256 when head.json names one). dtype
    "f16" or "f32" for the matrices; norms F32, d2t I64. Atomic: a temporary name in the same folder, then renamed.
    Returns the path. FileNotFoundError / ValueError naming the problem and the fix."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r}: use one of {sorted(_DTYPES)}")
    config, arrays = read_head(head_dir)
    HeadModel.from_arrays(config, arrays, Path(head_dir)).check_target(target.config,
                                                                       lambda: file_sha256(target.path))
    check_exportable(config, target)
    qtype, file_type = _DTYPES[dtype]
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    wr = GGUFWriter(None, ARCH)
    try:
        _add_keys(wr, config, target, file_type)
        for name, a in gguf_arrays(config, arrays).items():
            stored = (GGMLQuantizationType.I64 if a.dtype == np.int64 else
                      GGMLQuantizationType.F32 if a.ndim == 1 else qtype)
            data = a.astype(np.float16) if stored == GGMLQuantizationType.F16 else a
            wr.add_tensor(name, data, raw_dtype=stored)
        wr.write_header_to_file(tmp)
        wr.write_kv_data_to_file()
        wr.write_tensors_to_file()
        wr.close()
        os.replace(tmp, path)
    except BaseException:
        wr.close()
        tmp.unlink(missing_ok=True)
        raise
    return path
