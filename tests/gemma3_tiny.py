"""A tiny seeded Gemma 3 text model built twice from the same weights: a Hugging Face checkpoint (transformers'
Gemma3TextConfig + Gemma3ForCausalLM, CPU, save_pretrained) and an F32 GGUF (models/tiny.py, llama.cpp's gemma3
layout). Reusable builders for test_gemma3.py and the shared family runner.

Six layers, so llama.cpp's fixed gemma3 pattern (every 6th layer global) has one global layer; a window of 5 so
prompts of a dozen tokens slide; local RoPE base 10000 (llama.cpp's for gemma3's sliding layers), global 1e6.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from specedge.models.config import Weights
from specedge.models.tiny import tiny_config, tiny_vocab, write_tiny_gguf

N_LAYERS, D, HEADS, KV, FF, WINDOW, CTX = 6, 64, 4, 2, 96, 5, 128
SLIDING = ["sliding_attention"] * 5 + ["full_attention"]


def hf_gemma3_config(**overrides):
    """transformers' Gemma3TextConfig of the tiny model (overrides: any of its fields)."""
    import transformers
    tokens, _, _ = tiny_vocab()
    cfg = dict(vocab_size=len(tokens), hidden_size=D, intermediate_size=FF, num_hidden_layers=N_LAYERS,
               num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=D // HEADS, query_pre_attn_scalar=D // HEADS,
               max_position_embeddings=CTX, rms_norm_eps=1e-6, rope_theta=1e6, rope_local_base_freq=10000.0,
               sliding_window=WINDOW, layer_types=SLIDING, final_logit_softcapping=None, attn_logit_softcapping=None,
               tie_word_embeddings=True, bos_token_id=tokens.index("<|endoftext|>"),
               eos_token_id=tokens.index("<|im_end|>"), pad_token_id=0)
    cfg.update(overrides)
    return transformers.Gemma3TextConfig(**cfg)


def build_hf_gemma3(path: str | Path, seed: int = 0):
    """Seeded Gemma3ForCausalLM saved to `path` (safetensors, F32); returns the model (eval, eager attention)."""
    import torch
    import transformers
    model = transformers.Gemma3ForCausalLM(hf_gemma3_config()).eval()
    model.config._attn_implementation = "eager"
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # norms near 0 (the (1 + w) multiplier near 1); embeddings large enough for a peaked distribution
            scale = 0.1 if "norm" in name else 0.5 if "embed" in name else 1.0 / np.sqrt(p.shape[-1])
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    model.save_pretrained(str(path), safe_serialization=True)
    return model


def hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    """[T, V] float32 logits of transformers' model for one sequence."""
    import torch
    with torch.no_grad():
        return model(torch.tensor(np.asarray(tokens, np.int64)[None])).logits[0].float().numpy()


def write_gemma3_gguf(path: str | Path, weights: Weights, chat_template: str | None = None) -> Path:
    """The canonical `weights` (e.g. open_hf(...).load_weights()) as an F32 gemma3 GGUF with the tiny vocabulary;
    no chat template by default, as in the real gemma3-270m file."""
    base = tiny_config(arch="gemma3")
    cfg = replace(weights.config, bos_id=base.bos_id, eos_ids=base.eos_ids, name="tiny-gemma3")
    return write_tiny_gguf(path, arch="gemma3", config=cfg, weights=dict(weights.tensors), dtype="f32",
                           chat_template=chat_template)


def prompt_tokens(n: int = 14, seed: int = 1) -> np.ndarray:
    """Random ids over the tiny vocabulary's ordinary tokens (no control tokens)."""
    n_vocab = len(tiny_vocab()[0]) - 3
    return np.random.default_rng(seed).integers(0, n_vocab, n).astype(np.int32)
