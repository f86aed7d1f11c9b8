"""Family configs without transformers: llama3's rope_freqs (read, applied, round-tripped, written back), qwen3 and
smollm3 declarations from GGUF metadata, and the variants refused at load by field and family."""
import dataclasses

import numpy as np
import pytest
from gguf import GGUFWriter

from specedge.models import llama, qwen3, smollm3
from specedge.models.config import RopeScaling
from specedge.models.errors import ModelFileError
from specedge.models.family_base import hf_rope
from specedge.models.families import family
from specedge.models.gguf_in import open_gguf
from specedge.models.manifest import config_from_dict, config_to_dict
from specedge.models.rope import default_rope, inv_freq, rope_inv_freq
from specedge.models.tiny import tiny_config, tiny_weights, write_model_gguf

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def _llama3_config():
    _, scaling = hf_rope({"rope_theta": 10000.0, "rope_scaling": LLAMA3})
    return dataclasses.replace(tiny_config(), rope_scaling=scaling)


def test_llama3_gguf_carries_rope_freqs_that_reproduce_the_hf_rule(tmp_path):
    cfg = _llama3_config()
    path = write_model_gguf(tmp_path / "l3.gguf", cfg, tiny_weights(cfg))
    model = open_gguf(path)
    rs = model.config.rope_scaling
    assert rs.kind == "freq_factors" and len(rs.freq_factors) == cfg.head_dim // 2
    f = np.asarray(rs.freq_factors)
    assert f[0] == 1.0 and f[-1] == 8.0 and (1 < f[1] < 8) and (1 < f[2] < 8)  # kept, blended, scaled
    np.testing.assert_allclose(rope_inv_freq(model.config), rope_inv_freq(cfg), rtol=1e-6)
    assert not np.allclose(rope_inv_freq(model.config), rope_inv_freq(tiny_config()))
    assert "rope_freqs.weight" in model.config_tensors() and "llama.rope.scaling.type" not in model.metadata
    assert set(model.load_weights().tensors) == set(cfg.tensor_names())  # configuration, not a weight
    assert config_from_dict(config_to_dict(model.config)) == model.config  # manifest round trip
    again = open_gguf(write_model_gguf(tmp_path / "again.gguf", model.config, dict(model.load_weights().tensors)))
    assert again.config.rope_scaling == rs  # the divisors are written back as read


def test_rope_freqs_with_linear_scaling_and_bad_tensors():
    cfg = _llama3_config()
    divisors = llama.gguf_config_tensors(cfg)["rope_freqs.weight"]
    rs = RopeScaling(kind="freq_factors", factor=2.0, freq_factors=tuple(divisors))
    got = inv_freq(dataclasses.replace(default_rope(cfg), scaling=rs))
    np.testing.assert_allclose(got, rope_inv_freq(cfg) / 2, rtol=1e-6)
    meta = _meta("llama")
    shapes = {"token_embd.weight": (300, 64), "rope_freqs.weight": (8,)}
    with pytest.raises(ValueError, match="rope_freqs.weight has 4 factors"):
        llama.config_from_gguf(meta, shapes, lambda n: np.ones(4, np.float32))
    with pytest.raises(ValueError, match="non-positive"):
        llama.config_from_gguf(meta, shapes, lambda n: np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="yarn"):
        llama.config_from_gguf({**meta, "llama.rope.scaling.type": "yarn"}, shapes, lambda n: np.ones(8, np.float32))
    with pytest.raises(ValueError, match="qwen3 family"):  # only llama reads it
        qwen3.config_from_gguf(_meta("qwen3"), shapes, lambda n: np.ones(8, np.float32))


def _meta(arch: str, **extra) -> dict:
    return {f"{arch}.block_count": 4, f"{arch}.embedding_length": 64, f"{arch}.attention.head_count": 4,
            f"{arch}.attention.head_count_kv": 2, f"{arch}.feed_forward_length": 128,
            f"{arch}.attention.layer_norm_rms_epsilon": 1e-5, f"{arch}.context_length": 256, **extra}


def test_qwen3_and_smollm3_from_gguf_metadata():
    shapes = {"token_embd.weight": (300, 64)}
    q = qwen3.config_from_gguf(_meta("qwen3", **{"qwen3.attention.key_length": 32}), shapes)
    assert q.head_dim == 32 and q.block.qk_norm and not q.block.qkv_bias
    assert "layers.0.q_norm" in q.tensor_names() and q.tensor_names()["layers.0.q"] == (128, 64)
    assert qwen3.NAMES.gguf_to_canonical("blk.1.attn_k_norm.weight") == "layers.1.k_norm"
    assert qwen3.NAMES.hf_to_canonical("model.layers.1.self_attn.q_norm.weight") == "layers.1.q_norm"
    s = smollm3.config_from_gguf(_meta("smollm3", **{"smollm3.block_count": 8}), shapes)
    assert [s.block.layer(i).rope for i in range(8)] == [True, True, True, False] * 2
    hf = {"model_type": "smollm3", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 4,
          "intermediate_size": 128, "vocab_size": 300, "rms_norm_eps": 1e-6, "no_rope_layers": [1, 0, 1, 1]}
    h = smollm3.config_from_hf(hf)
    assert [h.block.layer(i).rope for i in range(4)] == [True, False, True, True] and h.tied_embeddings
    with pytest.raises(ValueError, match="llama.cpp's fixed pattern"):
        smollm3.gguf_metadata(h)  # llama.cpp could not run it
    with pytest.raises(ValueError, match="no_rope_layers must list 4"):
        smollm3.config_from_hf({**hf, "no_rope_layers": [1, 1]})


@pytest.mark.parametrize("arch, key, family_name", [
    ("llama", "llama.expert_count", "llama"), ("qwen3", "qwen3.expert_count", "qwen3"),
    ("smollm3", "smollm3.ssm.state_size", "smollm3")])
def test_gguf_variants_are_refused_by_field_and_family(arch, key, family_name):
    with pytest.raises(ValueError, match=rf"{key} = 8: .* {family_name} family"):
        family(arch).config_from_gguf(_meta(arch, **{key: 8}), {"token_embd.weight": (300, 64)})


def test_variant_architectures_are_refused_at_load(tmp_path):
    path = tmp_path / "moe.gguf"
    wr = GGUFWriter(str(path), "qwen3moe")
    wr.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    with pytest.raises(ModelFileError, match="'qwen3moe'.*mixture of experts variant of the qwen3 family"):
        open_gguf(path)
    from specedge.models.hf_in import open_hf
    for cfg, pattern in (({"model_type": "qwen3_moe"}, "mixture of experts variant of the qwen3 family"),
                         ({"model_type": "mixtral"}, "variant of the llama family"),
                         ({"model_type": "llama", "num_local_experts": 8}, "num_local_experts.*llama family"),
                         ({"model_type": "qwen3", "vision_config": {"depth": 2}}, "vision_config.*qwen3 family")):
        d = tmp_path / cfg["model_type"]
        d.mkdir(exist_ok=True)
        (d / "config.json").write_text(__import__("json").dumps({**cfg, "hidden_size": 64}))
        with pytest.raises(ModelFileError, match=pattern):
            open_hf(d)


def test_gguf_out_drafters_keep_rope_freqs(tmp_path):
    from specedge.export.gguf_out import write_gguf
    cfg = _llama3_config()
    src = open_gguf(write_model_gguf(tmp_path / "l3.gguf", cfg, tiny_weights(cfg)))
    out = open_gguf(write_gguf(tmp_path / "exit1.gguf", src, src.load_weights(), layers=[0]))
    assert out.config.rope_scaling == src.config.rope_scaling and out.config.n_layers == 1
