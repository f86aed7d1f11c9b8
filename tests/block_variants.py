"""Tiny seeded models whose block declarations (models/block.py) turn the variants on; shared by
test_block_variants.py (NumPy) and test_block_variants_onnx.py (the ONNX profiles)."""
import numpy as np

from specedge.models.block import Activation, BlockSpec, LayerSpec, Norm
from specedge.models.config import ModelConfig, Weights

# gemma3-like: (1 + w) norms, pre+post norms, q/k norms, GELU-tanh, embedding scale; qwen2's q/k/v biases and an o
# bias; per layer a local window with its own RoPE base, a NoPE layer (smollm3), a global layer, a narrow window.
GEMMA_LIKE = BlockSpec(norm=Norm.RMS_PLUS_ONE, post_norms=True, qk_norm=True, activation=Activation.GELU_TANH,
                       embed_scale=64 ** 0.5, qkv_bias=True, o_bias=True,
                       layers=(LayerSpec(window=4, rope_theta=100.0), LayerSpec(rope=False), LayerSpec(),
                               LayerSpec(window=2)))
PHI_LIKE = BlockSpec(fused_qkv=True, fused_gate_up=True, qkv_bias=True)  # fused tensors
PARTIAL = BlockSpec(rotary_fraction=0.5)  # rot 8 of 16: NumPy and static only (GroupQueryAttention needs rot/2 % 8)
SPECS = {"gemma-like": GEMMA_LIKE, "phi-like": PHI_LIKE}
TOL = 1e-4


def variant_weights(spec: BlockSpec, seed: int = 0, tied: bool = False, **cfg_kw) -> Weights:
    cfg = ModelConfig(arch="llama", n_layers=4, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=96,
                      vocab_size=97, rms_eps=1e-5, rope_theta=10000.0, context_length=128, tied_embeddings=tied,
                      block=spec, **cfg_kw)
    rng = np.random.default_rng(seed)
    t = {n: (rng.standard_normal(s) / np.sqrt(s[-1])).astype(np.float32) for n, s in cfg.tensor_names().items()}
    for n in t:
        if n.endswith("norm"):
            t[n] = (0.1 * rng.standard_normal(t[n].shape)).astype(np.float32) + (
                0 if spec.norm is Norm.RMS_PLUS_ONE else 1)
    t["embed"] *= 4 / spec.embed_scale
    return Weights(cfg, t)


def tokens(n, seed=1):
    return np.random.default_rng(seed).integers(0, 97, n).astype(np.int32)
