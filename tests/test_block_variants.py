"""Block variants a family declares (models/block.py) on tiny seeded models: the NumPy reference's identities, its
semantics against transformers' Gemma3, the manifest round trip, and the variants refused by name. The ONNX profiles
against the NumPy reference: test_block_variants_onnx.py."""
import dataclasses

import numpy as np
import pytest

from specedge.models.block import Activation, BlockSpec, LayerSpec, Norm, UnsupportedVariant
from specedge.models.config import ModelConfig, RopeScaling, Weights
from specedge.models.manifest import config_from_dict, config_to_dict
from specedge.runtime.backends.numpy_ref import NumpyBackend
from block_variants import GEMMA_LIKE, PARTIAL, PHI_LIKE, TOL, tokens, variant_weights  # (tests/ is on the path)


@pytest.mark.parametrize("spec", [GEMMA_LIKE, PHI_LIKE, PARTIAL], ids=["gemma-like", "phi-like", "partial"])
def test_numpy_batched_equals_incremental_and_trees_match_chains(spec):
    b = NumpyBackend(variant_weights(spec), dtype=np.float64)
    toks = tokens(12)
    full = b.forward(toks, b.new_cache(32))
    cache = b.new_cache(32)
    np.testing.assert_allclose(full, np.stack([b.forward(toks[i:i + 1], cache)[0] for i in range(12)]), atol=1e-9)
    cache = b.new_cache(32)
    b.forward(toks[:6], cache)
    out = b.forward(np.array([7, 8, 9], np.int32), cache, tree_mask=np.array([[1, 0, 0], [1, 1, 0], [1, 0, 1]], bool))
    for child, row in ((8, 1), (9, 2)):  # window and RoPE follow positions, not slots
        ref = b.forward(np.concatenate([toks[:6], [7, child]]).astype(np.int32), b.new_cache(32))[-1]
        np.testing.assert_allclose(out[row], ref, atol=1e-9)


def _same_logits(a: Weights, b: Weights, n=10):
    x, y = NumpyBackend(a, dtype=np.float64), NumpyBackend(b, dtype=np.float64)
    np.testing.assert_allclose(x.forward(tokens(n), x.new_cache(16)), y.forward(tokens(n), y.new_cache(16)), atol=1e-9)


def test_numpy_variants_reduce_to_the_llama_block():
    """Each variant, undone by its weights or its parameter, is the plain block."""
    base = variant_weights(BlockSpec(qkv_bias=True))
    t, cfg = dict(base.tensors), base.config
    # (1 + w) norms over w - 1
    plus = dataclasses.replace(cfg, block=BlockSpec(qkv_bias=True, norm=Norm.RMS_PLUS_ONE))
    _same_logits(base, Weights(plus, {n: w - 1 if n.endswith("norm") else w for n, w in t.items()}))
    # fused q|k|v and gate|up tensors
    fused = dataclasses.replace(cfg, block=BlockSpec(qkv_bias=True, fused_qkv=True, fused_gate_up=True))
    ft = {n: w for n, w in t.items() if not n.endswith((".q", ".k", ".v", "_bias", ".gate", ".up"))}
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        ft[p + "qkv"] = np.concatenate([t[p + "q"], t[p + "k"], t[p + "v"]])
        ft[p + "qkv_bias"] = np.concatenate([t[p + "q_bias"], t[p + "k_bias"], t[p + "v_bias"]])
        ft[p + "gate_up"] = np.concatenate([t[p + "gate"], t[p + "up"]])
    _same_logits(base, Weights(fused, ft))
    # embedding scale over a pre-divided table (untied head)
    scaled = dataclasses.replace(cfg, block=BlockSpec(qkv_bias=True, embed_scale=4.0))
    _same_logits(base, Weights(scaled, {**t, "embed": t["embed"] / 4}))
    # a window wider than the sequence, a per-layer RoPE base equal to the config's: no change
    wide = BlockSpec(qkv_bias=True, layers=(LayerSpec(window=64), LayerSpec(rope_theta=10000.0), LayerSpec(),
                                            LayerSpec(window=10)))
    _same_logits(base, Weights(dataclasses.replace(cfg, block=wide), t))


def test_numpy_window_and_nope_change_the_logits():
    """The window, the NoPE layer and the per-layer base each act (the equalities above are not vacuous)."""
    plain = variant_weights(BlockSpec())
    b = NumpyBackend(plain, dtype=np.float64)
    base = b.forward(tokens(10), b.new_cache(16))
    for lay in (LayerSpec(window=3), LayerSpec(rope=False), LayerSpec(rope_theta=50.0)):
        cfg = dataclasses.replace(plain.config, block=BlockSpec(layers=(lay,) * 4))
        b = NumpyBackend(Weights(cfg, dict(plain.tensors)), dtype=np.float64)
        assert np.abs(b.forward(tokens(10), b.new_cache(16)) - base).max() > 1e-3, lay


def test_declared_variants_without_an_implementation_are_refused_by_name():
    cfg = variant_weights(BlockSpec()).config
    yarn = dataclasses.replace(cfg, rope_scaling=RopeScaling(kind="yarn", factor=4.0, original_context=32))
    w = variant_weights(BlockSpec())
    with pytest.raises(UnsupportedVariant, match="'yarn'"):
        NumpyBackend(Weights(yarn, dict(w.tensors)))
    with pytest.raises(ValueError, match="layers"):
        dataclasses.replace(cfg, block=BlockSpec(layers=(LayerSpec(),)))  # 1 layer declared, 4 in the model
    with pytest.raises(ValueError, match="window"):
        BlockSpec(layers=(LayerSpec(window=0),))


@pytest.mark.parametrize("spec", [BlockSpec(), GEMMA_LIKE, PHI_LIKE], ids=["llama", "gemma-like", "phi-like"])
def test_manifest_round_trip_of_the_block(spec):
    cfg = variant_weights(spec).config
    d = config_to_dict(cfg)
    assert d["block"]["norm"] == spec.norm.value and "qkv_bias" not in d
    assert config_from_dict(d) == cfg
    legacy = {k: v for k, v in d.items() if k != "block"}  # manifests written before the block existed
    assert config_from_dict({**legacy, "qkv_bias": True}).block == BlockSpec(qkv_bias=True)
    assert config_from_dict(legacy).block == BlockSpec()
    with pytest.raises(ValueError, match="block"):
        config_from_dict({**d, "block": {**d["block"], "norm": "layernorm"}})


@pytest.mark.slow
def test_numpy_gemma3_like_block_matches_transformers():
    """The declaration's semantics against an independent implementation: transformers' Gemma3 text model ((1 + w)
    norms, pre+post norms, q/k norms, GELU-tanh, embedding scale, q/k/v/o biases, sliding layers with their own RoPE
    base) equals the NumPy reference on the same weights under the declared BlockSpec."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    kinds = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
    hf_cfg = transformers.Gemma3TextConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, max_position_embeddings=128, rms_norm_eps=1e-6,
        rope_theta=1e6, rope_local_base_freq=100.0, sliding_window=3, layer_types=kinds, attention_bias=True,
        final_logit_softcapping=None, attn_logit_softcapping=None, tie_word_embeddings=True)
    model = transformers.Gemma3ForCausalLM(hf_cfg).eval()
    model.config._attn_implementation = "eager"
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.1 if "norm" in name or "bias" in name else 0.3))
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attn_norm",
             "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffn_norm",
             "self_attn.q_norm": "q_norm", "self_attn.k_norm": "k_norm", "mlp.gate_proj": "gate", "mlp.up_proj": "up",
             "mlp.down_proj": "down", **{f"self_attn.{x}_proj": x for x in "qkvo"}}
    tensors = {}
    for name, p in model.state_dict().items():
        a = p.float().numpy().copy()
        if name == "model.embed_tokens.weight":
            tensors["embed"] = a
        elif name == "model.norm.weight":
            tensors["norm"] = a
        elif name.startswith("model.layers."):
            i, rest = name[len("model.layers."):].split(".", 1)
            stem, kind = rest.rsplit(".", 1)
            tensors[f"layers.{i}.{names[stem]}" + ("_bias" if kind == "bias" else "")] = a
    spec = BlockSpec(norm=Norm.RMS_PLUS_ONE, post_norms=True, qk_norm=True, activation=Activation.GELU_TANH,
                     embed_scale=8.0, qkv_bias=True, o_bias=True,
                     layers=tuple(LayerSpec(window=3, rope_theta=100.0) if k.startswith("sliding") else LayerSpec()
                                  for k in kinds))
    cfg = ModelConfig(arch="gemma3-like", n_layers=4, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=96,
                      vocab_size=97, rms_eps=1e-6, rope_theta=1e6, context_length=128, tied_embeddings=True,
                      block=spec)
    toks = tokens(12)
    with torch.no_grad():
        want = model(torch.tensor(toks[None].astype(np.int64))).logits[0].numpy()
    b = NumpyBackend(Weights(cfg, tensors), dtype=np.float64)
    np.testing.assert_allclose(b.forward(toks, b.new_cache(16)), want, atol=TOL * np.abs(want).max())
