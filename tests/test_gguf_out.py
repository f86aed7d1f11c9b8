"""write_gguf on the tiny model: exact F32 round trip, close F16, metadata copied, layer subsets that llama.cpp runs."""
import dataclasses

import numpy as np
import pytest

from specedge.export.gguf_out import write_gguf
from specedge.models.gguf_in import open_gguf
from specedge.models.tiny import TINY_ARCHS, write_tiny_gguf
from specedge.runtime.backends.base import LayerPlan
from specedge.runtime.backends.numpy_ref import NumpyBackend
from specedge.runtime.tokenizer import Tokenizer

TEXT = "<|im_start|>user\nThe cat is in the hat, and it is on the mat.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(params=TINY_ARCHS)
def source(request, tmp_path):
    arch = request.param
    return open_gguf(write_tiny_gguf(tmp_path / f"src-{arch}.gguf", arch=arch, tied=arch == "llama"))


def test_f32_round_trip_is_exact(source, tmp_path):
    weights = source.load_weights()
    out = open_gguf(write_gguf(tmp_path / "out.gguf", source, weights))
    assert out.config == source.config
    got = out.load_weights()
    assert set(got.tensors) == set(weights.tensors)
    for name in weights.tensors:
        np.testing.assert_array_equal(got[name], weights[name], err_msg=name)
    assert set(out.tensor_types().values()) == {"F32"}


def test_f16_round_trip_is_close(source, tmp_path):
    weights = source.load_weights()
    out = open_gguf(write_gguf(tmp_path / "out.gguf", source, weights, dtype="f16"))
    assert out.config == source.config
    assert out.metadata["general.file_type"] == 1
    types = out.tensor_types()
    assert types["layers.0.q"] == "F16" and types["layers.0.attn_norm"] == "F32"
    got = out.load_weights()
    for name in weights.tensors:
        np.testing.assert_allclose(got[name], weights[name], rtol=1e-3, atol=1e-4, err_msg=name)


def test_metadata_is_copied_with_types(source, tmp_path):
    out = open_gguf(write_gguf(tmp_path / "out.gguf", source, source.load_weights(), dtype="f16"))
    want, got = source.typed_fields(), out.typed_fields()
    assert set(got) == set(want)
    changed = {k for k in want if want[k] != got[k]}
    assert changed == {"general.file_type"}
    assert len(got["tokenizer.ggml.tokens"].value) == source.config.vocab_size
    assert out.chat_template == source.chat_template and out.chat_template
    ours, theirs = Tokenizer(out.tokenizer_spec()), Tokenizer(source.tokenizer_spec())
    assert ours.fingerprint() == theirs.fingerprint()
    assert ours.encode(TEXT).tolist() == theirs.encode(TEXT).tolist()


def test_layer_subset_renumbers_and_sets_block_count(source, tmp_path):
    weights = source.load_weights()
    out = open_gguf(write_gguf(tmp_path / "sub.gguf", source, weights, layers=[1]))
    assert out.config == dataclasses.replace(source.config, n_layers=1)
    assert out.metadata[f"{source.config.arch}.block_count"] == 1
    got = out.load_weights()
    for name in got.tensors:
        src = name.replace("layers.0.", "layers.1.")
        np.testing.assert_array_equal(got[name], weights[src], err_msg=name)


@pytest.mark.llamacpp
@pytest.mark.parametrize("layers", [(0,), (1,)])
def test_layer_subset_runs_in_llama_cpp_like_a_layer_plan(source, tmp_path, layers):
    pytest.importorskip("llama_cpp")
    from specedge.runtime.backends.llamacpp import LlamaCppBackend
    weights = source.load_weights()
    sub = open_gguf(write_gguf(tmp_path / "sub.gguf", source, weights, layers=layers))
    ids = Tokenizer(source.tokenizer_spec()).encode(TEXT)
    ref = NumpyBackend(weights)
    want = ref.forward(ids, ref.new_cache(64), plan=LayerPlan(layers=layers))
    # With float32 K/V and attention llama.cpp reproduces the plan to ~1e-5; its default (float16 K/V, flash
    # attention) costs ~1e-2.
    for f32_kv, atol in ((True, 1e-3), (False, 3e-2)):
        llm = LlamaCppBackend(sub.path, sub.config, n_ctx=64, n_threads=2, f32_kv=f32_kv,
                             flash_attn=not f32_kv)
        got = llm.forward(ids, llm.new_cache(64))
        np.testing.assert_allclose(got, want, atol=atol, err_msg=f"f32_kv={f32_kv}")
        assert (got.argmax(-1) == want.argmax(-1)).all()


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
def test_keep_copies_quantized_blocks_bit_for_bit(tmp_path, qtype):
    """An early-exit drafter (layers 0..l-1) keeps the source's blocks: same bytes, same dequantized values."""
    src = open_gguf(write_tiny_gguf(tmp_path / "q.gguf", dtype=qtype.lower()))
    out = open_gguf(write_gguf(tmp_path / "exit1.gguf", src, None, dtype="keep", layers=[0]))
    assert out.config == dataclasses.replace(src.config, n_layers=1)
    assert out.metadata["general.file_type"] == src.metadata["general.file_type"]
    for name in out.config.tensor_names():
        (t_out, raw_out), (t_src, raw_src) = out.stored_tensor(name), src.stored_tensor(name)
        assert t_out == t_src and np.array_equal(raw_out, raw_src), name
    assert any(out.stored_tensor(n)[0].name == qtype for n in out.config.tensor_names())


def test_bad_arguments_fail_before_writing(source, tmp_path):
    weights = source.load_weights()
    with pytest.raises(ValueError, match="dtype"):
        write_gguf(tmp_path / "x.gguf", source, weights, dtype="q4_0")
    for bad in ([], [1, 0], [0, 0], [source.config.n_layers]):
        with pytest.raises(ValueError, match="layers"):
            write_gguf(tmp_path / "x.gguf", source, weights, layers=bad)
    other = open_gguf(write_tiny_gguf(tmp_path / "other.gguf", n_layers=3)).load_weights()
    with pytest.raises(ValueError, match="config"):
        write_gguf(tmp_path / "x.gguf", source, other)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["other.gguf", source.path.name])


def test_write_is_atomic_and_overwrites(source, tmp_path):
    weights = source.load_weights()
    target = tmp_path / "out.gguf"
    target.write_bytes(b"old")
    write_gguf(target, source, weights, layers=[0])
    write_gguf(target, source, weights)
    assert open_gguf(target).config == source.config
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out.gguf", source.path.name])


def test_layer_subset_of_a_per_layer_pattern_is_refused(tmp_path):
    """smollm3's NoPE layers come back from a GGUF by llama.cpp's index rule (every 4th layer): renumbered layers would
    run RoPE where the source had none, so a subset is refused with the reason; the whole model is written."""
    from dataclasses import replace

    from specedge.models.smollm3 import nope_block
    from specedge.models.tiny import tiny_config
    cfg = tiny_config(arch="smollm3", n_layers=4)
    cfg = replace(cfg, block=nope_block([True, True, True, False]))
    source = open_gguf(write_tiny_gguf(tmp_path / "sm3.gguf", arch="smollm3", config=cfg))
    assert [lay.rope for lay in source.config.block.layers] == [True, True, True, False]
    weights = source.load_weights()
    with pytest.raises(ValueError, match="derives its per-layer attention .* from the layer index"):
        write_gguf(tmp_path / "sub.gguf", source, weights, layers=[0, 1, 2])
    assert not (tmp_path / "sub.gguf").exists()
    assert open_gguf(write_gguf(tmp_path / "all.gguf", source, weights)).config == source.config

