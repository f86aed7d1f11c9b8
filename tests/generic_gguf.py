"""Test double: a tiny seeded GGUF of an architecture no family module implements ("gpt2": learned position
embeddings, LayerNorm with biases, fused QKV, GELU MLP), which llama.cpp loads.

Tensor names and shapes follow llama.cpp's LLM_ARCH_GPT2 loader (src/llama-model.cpp): token_embd [V, D],
position_embd [ctx, D], output_norm(.bias), per layer attn_norm(.bias), attn_qkv [3D, D](+bias),
attn_output [D, D](+bias), ffn_norm(.bias), ffn_up [F, D](+bias), ffn_down [D, F](+bias), and output [V, D]
(optional in llama.cpp; untied here, so greedy text does not just repeat its input token).
The vocabulary is models/tiny.py's byte-level BPE one.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

from specedge.models.tiny import CHATML, tiny_vocab

ARCH = "gpt2"


def gpt2_tensors(*, n_layers: int, d_model: int, d_ff: int, context: int, vocab: int, seed: int
                 ) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array (numpy row-major, i.e. the reverse of GGUF's ne order)."""
    rng = np.random.default_rng(seed)
    D, F = d_model, d_ff

    def mat(out: int, inp: int, scale: float = 1.0) -> np.ndarray:
        return (scale / np.sqrt(inp) * rng.standard_normal((out, inp))).astype(np.float32)

    def vec(n: int, base: float = 0.0) -> np.ndarray:
        return (base + 0.1 * rng.standard_normal(n)).astype(np.float32)

    out = {"token_embd.weight": (0.5 * rng.standard_normal((vocab, D))).astype(np.float32),  # peaked logits
           "position_embd.weight": (0.1 * rng.standard_normal((context, D))).astype(np.float32),
           "output_norm.weight": vec(D, 1.0), "output_norm.bias": vec(D),
           "output.weight": (0.5 * rng.standard_normal((vocab, D))).astype(np.float32)}  # untied: varied text
    for i in range(n_layers):
        p = f"blk.{i}."
        out.update({p + "attn_norm.weight": vec(D, 1.0), p + "attn_norm.bias": vec(D),
                    p + "attn_qkv.weight": mat(3 * D, D), p + "attn_qkv.bias": vec(3 * D),
                    p + "attn_output.weight": mat(D, D, 3.0), p + "attn_output.bias": vec(D),
                    p + "ffn_norm.weight": vec(D, 1.0), p + "ffn_norm.bias": vec(D),
                    p + "ffn_up.weight": mat(F, D), p + "ffn_up.bias": vec(F),
                    p + "ffn_down.weight": mat(D, F, 3.0), p + "ffn_down.bias": vec(D)})
    return out


def write_gpt2_gguf(path: str | Path, *, seed: int = 0, n_layers: int = 2, d_model: int = 64, n_heads: int = 4,
                    d_ff: int = 128, context: int = 256, chat_template: str | None = CHATML,
                    pre: str = "gpt-2", name: str = "tiny-gpt2") -> Path:
    """Write the tiny gpt2-architecture model (F32) with the tiny byte-level vocabulary; returns the path."""
    tokens, types, merges = tiny_vocab()
    path = Path(path)
    wr = GGUFWriter(str(path), ARCH)
    wr.add_string("general.name", name)
    wr.add_uint32(f"{ARCH}.block_count", n_layers)
    wr.add_uint32(f"{ARCH}.context_length", context)
    wr.add_uint32(f"{ARCH}.embedding_length", d_model)
    wr.add_uint32(f"{ARCH}.feed_forward_length", d_ff)
    wr.add_uint32(f"{ARCH}.attention.head_count", n_heads)
    wr.add_float32(f"{ARCH}.attention.layer_norm_epsilon", 1e-5)
    wr.add_string("tokenizer.ggml.model", "gpt2")
    wr.add_string("tokenizer.ggml.pre", pre)
    wr.add_array("tokenizer.ggml.tokens", tokens)
    wr.add_array("tokenizer.ggml.token_type", types)
    wr.add_array("tokenizer.ggml.merges", merges)
    wr.add_uint32("tokenizer.ggml.bos_token_id", tokens.index("<|endoftext|>"))
    wr.add_uint32("tokenizer.ggml.eos_token_id", tokens.index("<|im_end|>"))
    wr.add_bool("tokenizer.ggml.add_bos_token", False)
    if chat_template is not None:
        wr.add_string("tokenizer.chat_template", chat_template)
    wr.add_file_type(0)
    for tname, value in gpt2_tensors(n_layers=n_layers, d_model=d_model, d_ff=d_ff, context=context,
                                     vocab=len(tokens), seed=seed).items():
        wr.add_tensor(tname, value, raw_dtype=GGMLQuantizationType.F32)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path
