"""The phi3 family (models/phi3.py) on tiny seeded models (tests/phi3_models.py): fused qkv / gate_up, LongRoPE
(long and short factors, attention factor), partial rotary, transformers' sliding window. NumPy vs transformers on
the Hugging Face checkpoint, NumPy vs llama.cpp on the same weights as an F32 GGUF, every ONNX profile vs NumPy
through verify batches and rollbacks, greedy speculative == plain; unsupported variants refused by name."""
import json

import numpy as np
import pytest

from specedge.models import phi3
from specedge.models.gguf_in import open_gguf
from specedge.models.hf_in import open_hf
from specedge.models.rope import default_rope, inv_freq
from specedge.runtime.backends.numpy_ref import NumpyBackend
from specedge.runtime.decode import decode
from specedge.runtime.request import Request, Speculation
from specedge.runtime.drafters.ngram import NgramDrafter
from phi3_models import CASES, canonical_weights, hf_config, save_hf, write_gguf  # noqa: E402  (tests/ on the path)
from verify_walk import walk_verify_steps  # noqa: E402

TOL = 1e-4
PROMPT_LEN = 30  # past the longrope cases' original context 16: transformers then picks the long factors as we do


def _tokens(n: int = PROMPT_LEN, seed: int = 7) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 300, n).astype(np.int32)


@pytest.fixture(scope="module", params=CASES)
def case(request, tmp_path_factory):
    """(case, transformers model, HFModel, our NumPy backend on its weights) per case."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    d = tmp_path_factory.mktemp(request.param)
    config = hf_config(request.param)
    model = save_hf(d / "hf", config, canonical_weights(config.to_dict()))
    hf = open_hf(d / "hf")
    return request.param, model, hf, NumpyBackend(hf.load_weights())


def test_config_reads_the_family_fields(case):
    name, _, hf, _ = case
    cfg = hf.config
    assert cfg.arch == "phi3" and cfg.block.fused_qkv and cfg.block.fused_gate_up
    rs = cfg.rope_scaling
    if name == "plain":
        assert rs.kind == "none" and cfg.block.windows() == (8,)
    else:
        assert rs.kind == "longrope" and cfg.block.windows() == ()
        long_ = name != "longrope-short"
        assert rs.attn_factor == pytest.approx(np.sqrt(1 + np.log(4) / np.log(16)) if long_ else 1.0)
        # the chosen factors divide the inverse frequencies
        r = default_rope(cfg)
        base = 1.0 / (cfg.rope_theta ** (np.arange(0, r.dim, 2) / r.dim))
        np.testing.assert_allclose(inv_freq(r), base / np.array(rs.long_factor if long_ else rs.short_factor))
    assert cfg.block.rotary_fraction == (0.75 if name == "partial" else 1.0)


def test_numpy_matches_transformers(case):
    import torch
    name, model, _, ours = case
    toks = _tokens()
    got = ours.forward(toks, ours.new_cache(PROMPT_LEN))
    with torch.no_grad():
        want = model(torch.from_numpy(toks[None].astype(np.int64))).logits[0].numpy()
    delta = float(np.abs(got - want).max())
    print(f"phi3 {name}: NumPy vs transformers max |dlogit| {delta:.3g}")
    assert (got.argmax(-1) == want.argmax(-1)).all() and delta < TOL, delta


def test_numpy_matches_llama_cpp_on_the_gguf(case, tmp_path):
    pytest.importorskip("llama_cpp")
    from specedge.runtime.backends.llamacpp import LlamaCppBackend
    name, _, hf, _ = case
    gguf = open_gguf(write_gguf(tmp_path / "m.gguf", hf.load_weights()))
    a, b = gguf.config.rope_scaling, hf.config.rope_scaling  # the GGUF stores factors and attn_factor as float32
    assert (a.kind, a.original_context, gguf.config.block.rotary_fraction) == \
        (b.kind, b.original_context, hf.config.block.rotary_fraction)
    assert (len(a.long_factor), len(a.short_factor)) == (len(b.long_factor), len(b.short_factor))
    assert [a.attn_factor, *a.long_factor, *a.short_factor] == pytest.approx(
        [b.attn_factor, *b.long_factor, *b.short_factor], rel=1e-6)
    ref = NumpyBackend(gguf.load_weights())
    llm = LlamaCppBackend(gguf.path, gguf.config, n_threads=1, f32_kv=True, flash_attn=False)
    toks = _tokens()
    got, want = llm.forward(toks, llm.new_cache(PROMPT_LEN)), ref.forward(toks, ref.new_cache(PROMPT_LEN))
    delta = float(np.abs(got - want).max())
    print(f"phi3 {name}: NumPy vs llama.cpp max |dlogit| {delta:.3g}")
    assert (got.argmax(-1) == want.argmax(-1)).all() and delta < TOL, delta


@pytest.mark.parametrize("profile_name", ["dynamic", "layered", "static"])
def test_onnx_profiles_match_numpy(case, tmp_path, profile_name):
    pytest.importorskip("onnxruntime")
    from specedge.export.onnx_export import LAYERED, ExportProfile, FloatSource, StaticShape, export_onnx
    from specedge.export.onnx_linear import ExportOptions, WeightFormat
    from specedge.runtime.backends import open_onnx
    name, _, hf, ref = case
    profile = {"dynamic": ExportProfile(), "layered": LAYERED,
               "static": ExportProfile.static(StaticShape(4, 48))}[profile_name]
    export_onnx(FloatSource(hf.load_weights()), tmp_path / "onnx", ExportOptions(WeightFormat.FP32), profile=profile)
    got = open_onnx(tmp_path / "onnx", threads=1)
    walk_verify_steps(got, ref, capacity=48, prefill=20, steps=8, max_width=4, tol=TOL)


def test_greedy_speculative_equals_plain(case):
    _, _, _, target = case
    prompt = np.concatenate([_tokens(12), _tokens(12)])  # a repeat, so the n-gram drafter proposes something

    def run(drafter=None):
        return [e.token for e in decode(target, prompt, Speculation(drafter, k=4), Request(max_tokens=20, seed=0))]
    assert run(NgramDrafter()) == run()


def _hf_json(**over):
    return {**hf_config("plain").to_dict(), **over}


@pytest.mark.parametrize("over, field", [
    ({"num_local_experts": 16}, "num_local_experts"),
    ({"blocksparse_block_size": 64}, "blocksparse_block_size"),
    ({"rope_scaling": {"type": "yarn", "factor": 2.0}}, "rope_scaling type 'yarn'"),
    ({"hidden_act": "gelu"}, "activation 'gelu'"),
])
def test_unsupported_hf_variants_are_refused_by_name(over, field):
    pytest.importorskip("transformers")
    with pytest.raises(ValueError, match=field):
        phi3.config_from_hf(_hf_json(**over))


def test_unsupported_gguf_variants_are_refused_by_name(tmp_path):
    meta = {"phi3.block_count": 1, "phi3.embedding_length": 64, "phi3.attention.head_count": 4,
            "phi3.feed_forward_length": 96, "phi3.attention.layer_norm_rms_epsilon": 1e-5, "phi3.expert_count": 16}
    with pytest.raises(ValueError, match="phi3: mixture-of-experts"):
        phi3.config_from_gguf(meta, {"token_embd.weight": (300, 64)})
    meta.pop("phi3.expert_count")
    with pytest.raises(ValueError, match="rope scaling type 'yarn'"):
        phi3.config_from_gguf({**meta, "phi3.rope.scaling.type": "yarn"}, {"token_embd.weight": (300, 64)})


def test_gguf_ignores_the_sliding_window_as_llama_cpp_does(tmp_path):
    pytest.importorskip("transformers")
    weights = canonical_weights(hf_config("plain").to_dict())
    assert weights.config.block.windows() == (8,)  # transformers applies it to the checkpoint
    gguf = open_gguf(write_gguf(tmp_path / "m.gguf", weights))
    assert gguf.metadata["phi3.attention.sliding_window"] == 8 and gguf.config.block.windows() == ()


def test_checkpoint_config_json_round_trips(case):
    _, _, hf, _ = case
    again = phi3.config_from_hf(json.loads((hf.path / "config.json").read_text()))
    assert again.rope_scaling == hf.config.rope_scaling and again.block == hf.config.block
