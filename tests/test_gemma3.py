"""The gemma3 family on a tiny seeded model (tests/gemma3_tiny.py): Hugging Face checkpoint -> NumPy vs
transformers; the same weights as an F32 GGUF -> NumPy vs llama.cpp; configs refused by field; the default chat
template."""
import dataclasses

import numpy as np
import pytest

from specedge.models import gemma3
from specedge.models.block import Activation, Norm
from specedge.models.errors import ModelFileError
from specedge.models.families import family, family_for_hf
from specedge.models.gguf_in import open_gguf
from specedge.runtime.backends.numpy_ref import NumpyBackend

from gemma3_tiny import WINDOW, build_hf_gemma3, hf_gemma3_config, hf_logits, prompt_tokens, write_gemma3_gguf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma3-hf")
    return path, build_hf_gemma3(path)


def numpy_logits(weights, tokens):
    backend = NumpyBackend(weights)
    return backend.forward(tokens, backend.new_cache(len(tokens)))


def test_registry_maps_hf_model_types():
    assert family("gemma3") is gemma3 and family_for_hf("gemma3_text") is gemma3
    with pytest.raises(ValueError, match="gemma3_texty"):
        family_for_hf("gemma3_texty")


def test_hf_checkpoint_matches_transformers(checkpoint):
    from specedge.models.hf_in import open_hf
    path, model = checkpoint
    hf = open_hf(path)
    cfg = hf.config
    assert cfg.arch == "gemma3" and cfg.tied_embeddings and cfg.block.embed_scale == pytest.approx(8.0)
    assert cfg.block.norm is Norm.RMS_PLUS_ONE and cfg.block.activation is Activation.GELU_TANH
    assert cfg.block.post_norms and cfg.block.qk_norm
    assert [lay.window for lay in cfg.block.layers] == [WINDOW] * 5 + [None]
    assert [lay.rope_theta for lay in cfg.block.layers] == [10000.0] * 5 + [None] and cfg.rope_theta == 1e6
    toks = prompt_tokens(14)  # longer than the window: the sliding layers drop keys
    want, got = hf_logits(model, toks), numpy_logits(hf.load_weights(), toks)
    print(f"\ntiny gemma3 NumPy vs transformers: max |dlogit| {np.abs(want - got).max():.2e}")
    assert np.abs(want - got).max() < 1e-3
    assert (want.argmax(-1) == got.argmax(-1)).all()


def test_gguf_round_trip_and_llamacpp_parity(checkpoint, tmp_path):
    """Same weights as an F32 GGUF: norms stored as 1 + w (llama.cpp's converter), read back as w; llama.cpp's own
    gemma3 (its fixed sliding pattern and local base) agrees with the NumPy reference at every position."""
    from specedge.models.hf_in import open_hf
    path, model = checkpoint
    weights = open_hf(path).load_weights()
    src = open_gguf(write_gemma3_gguf(tmp_path / "g.gguf", weights))
    assert dataclasses.replace(src.config, name="", bos_id=None, eos_ids=()) == \
        dataclasses.replace(weights.config, name="", bos_id=None, eos_ids=())
    stored = src.stored_tensor("layers.0.q_norm")[1]
    np.testing.assert_allclose(stored, weights["layers.0.q_norm"] + 1, rtol=0, atol=1e-6)
    back = src.load_weights()
    for name in weights.tensors:
        np.testing.assert_allclose(back[name], weights[name], rtol=0, atol=1e-6)
    pytest.importorskip("llama_cpp")
    from specedge.runtime.backends.llamacpp import LlamaCppBackend
    toks = prompt_tokens(24, seed=3)
    ref = numpy_logits(back, toks)
    lc = LlamaCppBackend(src.path, src.config, n_ctx=64, n_threads=1, f32_kv=True, flash_attn=False)
    got = lc.forward(toks, lc.new_cache(len(toks)))
    print(f"\ntiny gemma3 NumPy vs llama.cpp (F32): max |dlogit| {np.abs(ref - got).max():.2e}")
    assert (ref.argmax(-1) == got.argmax(-1)).all()
    # llama.cpp's CPU GELU reads a float16 table: 3e-3 measured; every layer global gives 8.6, the global base on
    # one sliding layer 0.55
    assert np.abs(ref - got).max() < 2e-2
    assert np.abs(ref - hf_logits(model, toks)).max() < 1e-3


@pytest.mark.parametrize("field, value", [
    ("final_logit_softcapping", 30.0), ("attn_logit_softcapping", 50.0), ("query_pre_attn_scalar", 24),
    ("attention_bias", True), ("hidden_activation", "gelu"), ("vision_config", {"model_type": "siglip"}),
])
def test_hf_configs_refused_by_field(field, value):
    hf = hf_gemma3_config().to_dict()
    hf[field] = value
    with pytest.raises(ValueError, match=field):
        gemma3.config_from_hf(hf)


def test_hf_pattern_without_layer_types_and_no_window():
    hf = hf_gemma3_config().to_dict()
    del hf["layer_types"]
    hf["sliding_window_pattern"] = 3
    assert [lay.window for lay in gemma3.config_from_hf(hf).block.layers] == [WINDOW, WINDOW, None] * 2
    hf["sliding_window"] = None
    assert gemma3.config_from_hf(hf).block.layers == ()


def test_gguf_softcapping_refused(checkpoint, tmp_path):
    from specedge.models.hf_in import open_hf
    weights = open_hf(checkpoint[0]).load_weights()
    path = write_gemma3_gguf(tmp_path / "g.gguf", weights)
    meta = dict(open_gguf(path).metadata, **{"gemma3.final_logit_softcapping": 30.0})
    shapes = {"token_embd.weight": (weights.config.vocab_size, 64)}
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        gemma3.config_from_gguf(meta, shapes)


def test_gguf_writer_refuses_a_pattern_llamacpp_cannot_run(checkpoint):
    from specedge.models.hf_in import open_hf
    cfg = open_hf(checkpoint[0]).config
    layers = list(cfg.block.layers)
    layers[0] = dataclasses.replace(layers[0], rope_theta=100.0)
    bad = dataclasses.replace(cfg, block=dataclasses.replace(cfg.block, layers=tuple(layers)))
    assert gemma3.gguf_metadata(cfg) == {"gemma3.attention.sliding_window": WINDOW}
    with pytest.raises(ValueError, match="pattern"):
        gemma3.gguf_metadata(bad)


def test_default_chat_template_multi_turn_with_system(checkpoint, tmp_path):
    """A GGUF without a template gets Gemma's turn format (sandboxed like any template) and <end_of_turn>'s id
    among the stop ids; a file's own template wins."""
    from specedge.models.hf_in import open_hf
    from specedge.runtime.tokenizer import Tokenizer
    from specedge.models.tiny import CHATML
    weights = open_hf(checkpoint[0]).load_weights()
    src = open_gguf(write_gemma3_gguf(tmp_path / "g.gguf", weights))
    tok = Tokenizer(src.tokenizer_spec())
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! "}, {"role": "user", "content": "Bye"}]
    assert tok.apply_chat_template(msgs) == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    with pytest.raises(ValueError, match="alternate"):
        tok.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert src.tokenizer_spec().eos_ids == src.config.eos_ids  # the tiny vocab has no <end_of_turn>
    own = open_gguf(write_gemma3_gguf(tmp_path / "own.gguf", weights, chat_template=CHATML))
    assert own.tokenizer_spec().chat_template == CHATML
