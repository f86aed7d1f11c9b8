"""GGUF reading on tiny seeded models: config, canonical weights, quantized types, and clean errors."""
import numpy as np
import pytest
from gguf import GGUFWriter

from specedge.models import llama, qwen2
from specedge.models.errors import ModelFileError
from specedge.models.families import SUPPORTED_ARCHS, family
from specedge.models.family_base import canonical_to_gguf, gguf_to_canonical
from specedge.models.gguf_in import open_gguf
from specedge.models.tiny import tiny_config, tiny_vocab, tiny_weights, write_tiny_gguf


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("m") / "llama.gguf", arch="llama", seed=3)


def test_llama_config_round_trip(tiny_llama):
    m = open_gguf(tiny_llama)
    want = tiny_config(arch="llama")
    assert m.config == want
    c = m.config
    assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff) == (2, 64, 4, 2, 16, 128)
    assert c.tied_embeddings and not c.qkv_bias and c.rope_scaling.kind == "none"
    tokens, _, _ = tiny_vocab()
    assert c.vocab_size == len(tokens) and c.eos_ids == (tokens.index("<|im_end|>"),)
    assert m.metadata["general.architecture"] == "llama"
    assert "tokenizer.ggml.tokens" not in m.metadata  # long arrays stay out of .metadata
    assert m.chat_template and "<|im_start|>" in m.chat_template


def test_llama_weights_equal_written_after_unpermute(tiny_llama):
    m = open_gguf(tiny_llama)
    w = m.load_weights()
    ref = tiny_weights(m.config, seed=3)
    assert set(w.tensors) == set(ref)
    for name, arr in ref.items():
        assert w[name].dtype == np.float32 and w[name].flags.c_contiguous
        np.testing.assert_array_equal(w[name], arr, err_msg=name)
    assert w.lm_head is w["embed"]
    assert set(m.tensor_types().values()) == {"F32"}


def test_llama_file_stores_q_k_permuted(tiny_llama):
    """The raw GGUF rows differ from canonical for q/k only: llama.cpp's interleaved-RoPE layout."""
    import gguf
    cfg = tiny_config(arch="llama")
    ref = tiny_weights(cfg, seed=3)
    raw = {t.name: np.array(t.data) for t in gguf.GGUFReader(tiny_llama).tensors}
    assert not np.array_equal(raw["blk.0.attn_q.weight"], ref["layers.0.q"])
    permuted = llama.to_gguf_layout("layers.0.q", ref["layers.0.q"], cfg)
    np.testing.assert_array_equal(raw["blk.0.attn_q.weight"], permuted)
    np.testing.assert_array_equal(raw["blk.0.attn_v.weight"], ref["layers.0.v"])


def test_permutation_inverts_for_q_and_k():
    cfg = tiny_config(arch="llama", n_heads=4, n_kv_heads=2)
    rng = np.random.default_rng(0)
    for name, shape in [("layers.0.q", (64, 64)), ("layers.1.k", (32, 64)), ("layers.0.q_bias", (64,))]:
        w = rng.standard_normal(shape)
        p = llama.to_gguf_layout(name, w, cfg)
        assert not np.array_equal(p, w)
        np.testing.assert_array_equal(llama.from_gguf_layout(name, p, cfg), w)
    w = rng.standard_normal((64, 64))
    assert llama.to_gguf_layout("layers.0.v", w, cfg) is w
    assert qwen2.from_gguf_layout("layers.0.q", w, cfg) is w


def test_gguf_permute_matches_llama_cpp_converter():
    """Our permute is exactly convert_hf_to_gguf.py's LlamaModel.permute."""
    def hf_permute(weights, n_head, n_head_kv):
        if n_head_kv is not None and n_head != n_head_kv:
            n_head = n_head_kv
        return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
                .swapaxes(1, 2).reshape(weights.shape))
    cfg = tiny_config(arch="llama")
    w = np.arange(32 * 64, dtype=np.float32).reshape(32, 64)
    np.testing.assert_array_equal(llama.to_gguf_layout("layers.0.k", w, cfg), hf_permute(w, 4, 2))


def test_qwen2_biases_and_untied_head(tmp_path):
    path = write_tiny_gguf(tmp_path / "q.gguf", arch="qwen2", tied=False, seed=1)
    m = open_gguf(path)
    assert m.config.arch == "qwen2" and m.config.qkv_bias and not m.config.tied_embeddings
    w = m.load_weights()
    ref = tiny_weights(m.config, seed=1)
    for name in ("layers.0.q_bias", "layers.1.k_bias", "layers.0.q", "lm_head"):
        np.testing.assert_array_equal(w[name], ref[name])
    assert w.lm_head is w["lm_head"] and w["layers.0.v_bias"].shape == (32,)


@pytest.mark.parametrize("dtype,tol,kind", [("f16", 2e-3, "F16"), ("q8_0", 2e-2, "Q8_0"), ("q4_0", 0.3, "Q4_0")])
def test_quantized_reads(tmp_path, dtype, tol, kind):
    path = write_tiny_gguf(tmp_path / f"{dtype}.gguf", dtype=dtype)
    m = open_gguf(path)
    types = m.tensor_types()
    assert types["layers.0.q"] == kind and types["norm"] == "F32"
    w = m.load_weights()
    ref = tiny_weights(m.config)
    for name, arr in ref.items():
        assert w[name].dtype == np.float32
        np.testing.assert_allclose(w[name], arr, atol=tol * max(1.0, float(np.abs(arr).max())), err_msg=name)


def test_load_weights_float64(tiny_llama):
    w = open_gguf(tiny_llama).load_weights(dtype=np.float64)
    assert w["layers.0.q"].dtype == np.float64


def test_name_table_round_trips():
    cfg = tiny_config(arch="qwen2", tied=False)
    for name in cfg.tensor_names():
        assert gguf_to_canonical(canonical_to_gguf(name)) == name
    assert gguf_to_canonical("blk.3.ffn_gate.weight") == "layers.3.gate"
    assert gguf_to_canonical("rope_freqs.weight") is None


def test_family_registry():
    assert family("llama") is llama and family("qwen2") is qwen2
    with pytest.raises(ValueError, match="'mamba'.*llama, .*qwen2"):
        family("mamba")
    assert {"llama", "phi3", "qwen2", "qwen3", "smollm3", "gemma3"} <= set(SUPPORTED_ARCHS) and SUPPORTED_ARCHS == tuple(
        sorted(SUPPORTED_ARCHS))


def test_config_from_metadata_extras():
    meta = {"llama.block_count": 2, "llama.embedding_length": 64, "llama.feed_forward_length": 128,
            "llama.attention.head_count": 4, "llama.attention.head_count_kv": 1, "llama.context_length": 4096,
            "llama.attention.layer_norm_rms_epsilon": 1e-6, "llama.rope.freq_base": 5e5,
            "llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0,
            "llama.rope.scaling.original_context_length": 1024,
            "tokenizer.ggml.bos_token_id": 7, "tokenizer.ggml.eos_token_id": 8, "tokenizer.ggml.eot_token_id": 9,
            "tokenizer.ggml.eom_token_id": 8}
    cfg = llama.config_from_gguf(meta, {"token_embd.weight": (100, 64), "output.weight": (100, 64)})
    assert cfg.head_dim == 16 and cfg.n_kv_heads == 1 and cfg.vocab_size == 100 and not cfg.tied_embeddings
    assert (cfg.rope_scaling.kind, cfg.rope_scaling.factor, cfg.rope_scaling.original_context) == ("linear", 4.0, 1024)
    assert cfg.bos_id == 7 and cfg.eos_ids == (8, 9) and cfg.rope_theta == 5e5
    with pytest.raises(ValueError, match="rope scaling type 'weird'"):
        llama.config_from_gguf({**meta, "llama.rope.scaling.type": "weird"}, {"token_embd.weight": (100, 64)})
    with pytest.raises(ValueError, match="llama.attention.head_count"):
        llama.config_from_gguf({k: v for k, v in meta.items() if "head_count" not in k},
                               {"token_embd.weight": (100, 64)})


# ---- errors -------------------------------------------------------------------------------------------------------

def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError, match="not found"):
        open_gguf(tmp_path / "nope.gguf")


@pytest.mark.parametrize("content", [b"", b"GG", b"hello world, not a model" * 10, bytes(range(256)) * 4])
def test_garbage_is_not_a_gguf(tmp_path, content):
    p = tmp_path / "junk.gguf"
    p.write_bytes(content)
    with pytest.raises(ModelFileError, match="not a GGUF"):
        open_gguf(p)


@pytest.mark.parametrize("keep", [0.02, 0.3, 0.6, 0.97])
def test_truncated_file(tmp_path, tiny_llama, keep):
    data = tiny_llama.read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[:max(8, int(len(data) * keep))])
    with pytest.raises(ModelFileError, match="truncated|corrupt") as e:
        open_gguf(p)
    assert "cut.gguf" in str(e.value) and "re-download" in str(e.value) and "re-pull" not in str(e.value)


def test_corrupt_header_after_magic(tmp_path, tiny_llama):
    data = bytearray(tiny_llama.read_bytes())
    data[8:24] = b"\xff" * 16  # absurd tensor / kv counts
    p = tmp_path / "bad.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(ModelFileError):
        open_gguf(p)


def _write_minimal(path, arch, extra_tensor=None):
    w = GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.block_count", 1)
    w.add_tensor("token_embd.weight", np.zeros((10, 8), np.float32))
    if extra_tensor is not None:
        w.add_tensor(*extra_tensor)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unsupported_arch(tmp_path):
    p = _write_minimal(tmp_path / "m.gguf", "mamba")
    with pytest.raises(ModelFileError, match="unsupported model architecture 'mamba'.*llama, .*qwen2"):
        open_gguf(p)


def test_unsupported_tensor_type(tmp_path):
    p = _write_minimal(tmp_path / "m.gguf", "llama", ("blk.0.ffn_up.weight", np.zeros((4, 8), np.int32)))
    with pytest.raises(ModelFileError, match=r"blk\.0\.ffn_up\.weight.*unsupported type I32.*Q4_K"):
        open_gguf(p)


def test_unsupported_tokenizer_model(tiny_llama):
    m = open_gguf(tiny_llama)
    fields = m.fields("tokenizer.")
    fields["tokenizer.ggml.model"] = "bert"  # WordPiece: llama.cpp reads it, we build gpt2 BPE and llama SentencePiece
    from specedge.models.tokenizer_gguf import tokenizer_spec_from_gguf
    with pytest.raises(ValueError, match="unsupported tokenizer model 'bert'"):
        tokenizer_spec_from_gguf(fields)
    fields["tokenizer.ggml.model"] = "gpt2"
    fields["tokenizer.ggml.pre"] = "deepseek-coder"
    with pytest.raises(ValueError, match="pre-tokenizer 'deepseek-coder'.*smollm"):
        tokenizer_spec_from_gguf(fields)
