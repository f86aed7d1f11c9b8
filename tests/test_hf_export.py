"""Hugging Face checkpoint input: tiny seeded llama / qwen2 (and gpt2 for --via optimum) built with transformers and
saved with save_pretrained, then exported by our builder and by optimum. Four computations must agree on logits for
a prompt and for verify steps after a rollback: our ONNX graph, optimum's graph on the optimum backend, transformers'
own float32 forward, and the NumPy reference on the canonical weights our reader produced."""
import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from specedge.apps.cli import cli  # noqa: E402
from specedge.assembly.load import load_onnx  # noqa: E402
from specedge.models.hf_in import open_hf  # noqa: E402
from specedge.export.onnx_export import export_hf_to_onnx  # noqa: E402
from specedge.export.onnx_linear import WeightFormat  # noqa: E402
from specedge.export.optimum_export import export_via_optimum  # noqa: E402
from specedge.models.tokenizer_gguf import build_hf_tokenizer  # noqa: E402
from specedge.models.errors import ModelFileError  # noqa: E402
from specedge.models.tiny import CHATML, tiny_vocab  # noqa: E402
from specedge.runtime.backends.numpy_ref import NumpyBackend  # noqa: E402
from specedge.runtime.backends.onnx_optimum import OptimumBackend  # noqa: E402
from specedge.runtime.backends.onnxrt import OnnxBackend  # noqa: E402
from specedge.runtime.decode import decode  # noqa: E402
from specedge.runtime.request import PLAIN, Request, Speculation
from specedge.runtime.drafters.ngram import NgramDrafter  # noqa: E402
from specedge.runtime.types import SamplingParams  # noqa: E402

TOL = 1e-4
TOKENS, TYPES, MERGES = tiny_vocab()
BOS, EOS = TOKENS.index("<|endoftext|>"), TOKENS.index("<|im_end|>")
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}  # head_dim 16, theta 5e5: kept, blended and scaled bands
CASES = {
    "llama": dict(model_type="llama"),  # untied head, GQA 4 heads / 2 kv heads, float32
    "llama-bf16-sharded-tied-llama3rope": dict(model_type="llama", tie_word_embeddings=True, dtype=torch.bfloat16,
                                               shard="40KB", rope_theta=500000.0, rope_scaling=LLAMA3_ROPE),
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=True),  # q/k/v biases
}


def write_tokenizer(d, **config):
    """tokenizer.json from the tiny byte-level BPE vocabulary (models/tiny.py) and a tokenizer_config.json."""
    (d / "tokenizer.json").write_text(build_hf_tokenizer(TOKENS, TYPES, MERGES, "smollm").to_str())
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
        "add_bos_token": False, "chat_template": CHATML, **config}))


def randomize(model, seed=0):
    """Seeded weights by HF parameter name (independent of our name table): norms near 1, small random biases
    (transformers initializes them to 1 and 0, which would hide a mix-up), peaked logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if "norm" in name or "ln_" in name:
                p.copy_(1 + 0.1 * r if name.endswith("weight") else 0.1 * r)
            elif p.ndim == 1:
                p.copy_(0.1 * r)
            elif "embed" in name or "wte" in name or "lm_head" in name:
                p.copy_(0.5 * r)
            else:
                fan_in = p.shape[0] if "c_" in name else p.shape[1]  # gpt2's Conv1D stores [in, out]
                p.copy_(r / fan_in ** 0.5)


def save_tiny(d, model_type="llama", *, dtype=torch.float32, shard=None, seed=0, **overrides):
    """save_pretrained a tiny seeded causal LM (hidden 64, 2 layers, 4 heads, 2 kv heads, vocab 301) + tokenizer."""
    common = dict(vocab_size=len(TOKENS), bos_token_id=BOS, eos_token_id=EOS, tie_word_embeddings=False)
    if model_type == "gpt2":
        args = dict(n_embd=64, n_layer=2, n_head=4, n_positions=256, **common)
    else:
        args = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, **common)
    config = transformers.AutoConfig.for_model(model_type, **{**args, **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    randomize(model, seed)
    model.to(dtype).save_pretrained(d, **({"max_shard_size": shard} if shard else {}))
    write_tokenizer(d)
    return d


def load_torch(d):
    return transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()


def torch_logits(model, tokens):
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(tokens, np.int64))[None]).logits[0].numpy()


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    """(checkpoint dir, transformers model, {name: backend}) with our ONNX, optimum's ONNX and the NumPy reference."""
    d = tmp_path_factory.mktemp(request.param)
    src = save_tiny(d / "hf", **CASES[request.param])
    hf = open_hf(src)
    export_hf_to_onnx(hf, d / "onnx", WeightFormat.FP32, threads=1)  # the parity gate runs (fp32: 99%, 0.01)
    export_via_optimum(src, d / "optimum", threads=1)  # gated against transformers
    backends = {"ours": OnnxBackend(d / "onnx", threads=1), "optimum": OptimumBackend(d / "optimum", threads=1),
                "numpy": NumpyBackend(hf.load_weights())}
    return src, load_torch(src), backends


def test_checkpoint_layout(case):
    src, _, _ = case
    files = {p.name for p in src.iterdir()}
    assert "config.json" in files and any(f.endswith(".safetensors") for f in files)
    if "sharded" in src.parent.name:
        assert "model.safetensors.index.json" in files and len([f for f in files if f.endswith(".safetensors")]) > 1


def test_canonical_weights_are_the_checkpoint_tensors(case):
    """HF rows are the canonical (rotate_half) layout: q/k are taken as stored, bf16 widened exactly."""
    src, model, _ = case
    hf = open_hf(src)
    w, layer = hf.load_weights(), model.model.layers[1]
    state = {"layers.1.q": layer.self_attn.q_proj.weight, "layers.1.k": layer.self_attn.k_proj.weight,
             "layers.1.down": layer.mlp.down_proj.weight, "layers.1.ffn_norm": layer.post_attention_layernorm.weight,
             "embed": model.model.embed_tokens.weight, "norm": model.model.norm.weight}
    if hf.config.qkv_bias:
        state["layers.1.k_bias"] = layer.self_attn.k_proj.bias
    for name, t in state.items():
        assert np.array_equal(w[name], t.detach().numpy()), name
    assert hf.config.tied_embeddings == model.config.tie_word_embeddings
    want_type = "BF16" if "bf16" in src.parent.name else "F32"
    assert set(hf.tensor_types().values()) == {want_type}


def test_prompt_and_verify_steps_after_rollback_agree(case):
    """ours, optimum, numpy vs transformers: a 9-token prompt, a 4-token verify step, rollback keeping 2 of it,
    then a 5-token verify step of new tokens (each compared with transformers on the whole committed sequence)."""
    _, model, backends = case
    rng = np.random.default_rng(7)
    caches = {name: b.new_cache(64) for name, b in backends.items()}
    committed: list[int] = []
    for width, keep in ((9, 9), (4, 2), (5, 3)):
        new = [int(t) for t in rng.integers(0, len(TOKENS), width)]
        want = torch_logits(model, committed + new)[len(committed):]
        for name, b in backends.items():
            got = b.forward(np.asarray(new, np.int32), caches[name])
            assert got.shape == want.shape and got.dtype == np.float32
            np.testing.assert_allclose(got, want, atol=TOL, err_msg=name)
            caches[name].rollback(len(committed) + keep)
        committed += new[:keep]


def test_optimum_backend_speculative_greedy_equals_plain_greedy(case):
    backend = case[2]["optimum"]
    params = SamplingParams()
    prompt = np.array([5, 9, 14, 5, 9, 14, 5, 9, 30, 31, 5, 9], dtype=np.int32)
    plain = [e.token for e in decode(backend, prompt, PLAIN, Request(params, max_tokens=40))]
    for k in (1, 3, 5):
        assert [e.token for e in decode(backend, prompt, Speculation(NgramDrafter(), k=k),
                                        Request(params, max_tokens=40))] == plain


def test_optimum_manifest_and_engine(case):
    src, _, backends = case
    root = backends["optimum"].manifest.root
    m = json.loads((root / "manifest.json").read_text())
    assert m["format"] == "optimum-onnx" and m["parity"]["passed"] and m["parity"]["max_dlogit"] <= 0.01
    assert m["io"]["past_key"] == "past_key_values.{i}.key" and m["io"]["present_value"] == "present.{i}.value"
    assert m["config"]["n_layers"] == 2 and m["config"]["n_kv_heads"] == 2 and m["config"]["head_dim"] == 16
    assert isinstance(load_onnx(str(root), device="cpu", threads=1).backend, OptimumBackend)
    assert isinstance(load_onnx(str(root.parent / "onnx"), device="cpu", threads=1).backend, OnnxBackend)


def test_tokenizer_spec_from_checkpoint(tmp_path):
    """bos/eos/template from tokenizer_config; add_bos from the post-processor when the config does not say;
    the template from chat_template.jinja when tokenizer_config has none."""
    from specedge.models.tokenizer_hf import tokenizer_spec_from_hf
    from tokenizers import Tokenizer, processors
    write_tokenizer(tmp_path)
    spec = tokenizer_spec_from_hf(tmp_path, {"eos_token_id": [EOS, BOS]})
    assert (spec.bos_id, spec.eos_ids, spec.add_bos, spec.chat_template) == (BOS, (EOS, BOS), False, CHATML)
    assert (spec.bos_token, spec.eos_token) == ("<|endoftext|>", "<|im_end|>")
    tok = Tokenizer.from_str((tmp_path / "tokenizer.json").read_text())
    tok.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>",
                                                                                                    BOS)])
    (tmp_path / "tokenizer.json").write_text(tok.to_str())
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del cfg["add_bos_token"], cfg["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}{{ messages[0]['content'] }}")
    spec = tokenizer_spec_from_hf(tmp_path, {})
    assert spec.add_bos and spec.chat_template.startswith("{{ bos_token }}")


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("via", ["specedge", "optimum"])
def test_cli_export_then_generate(tmp_path, via):
    src = save_tiny(tmp_path / "tiny-llama", "llama", seed=3)
    out = tmp_path / "artifact"
    r = run("export", src, "--format", "onnx", "--weights", "fp32", "--via", via, "--out", out, "--threads", 1)
    assert r.exit_code == 0, r.output
    assert "parity gate PASS" in r.stderr and r.stdout.strip() == str(out)
    assert json.loads((out / "manifest.json").read_text())["format"] == {"specedge": "specedge-onnx",
                                                                          "optimum": "optimum-onnx"}[via]
    r = run("generate", out, "hello world", "--backend", "onnx", "--device", "cpu", "--threads", 1, "--drafter",
            "ngram", "--max-tokens", 16, "--json", "--baseline", "--temperature", "0")
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["stats"]["identical_to_baseline"] is True and len(result["tokens"]) > 0


def test_cli_unsupported_architecture_then_via_optimum(tmp_path):
    """gpt2 is not built by us: a clear error naming it and --via optimum; with --via optimum it exports, passes the
    gate against transformers, and generates losslessly; its logits match transformers."""
    src = save_tiny(tmp_path / "tiny-gpt2", "gpt2", seed=4)
    r = run("export", src, "--format", "onnx", "--weights", "fp32", "--out", tmp_path / "x", "--threads", 1)
    assert r.exit_code != 0
    assert "model_type 'gpt2'" in r.output and re.search("llama, .*qwen2", r.output) and "--via optimum" in r.output
    out = tmp_path / "gpt2-optimum"
    r = run("export", src, "--via", "optimum", "--out", out, "--threads", 1)
    assert r.exit_code == 0, r.output
    backend = OptimumBackend(out, threads=1)
    toks = np.random.default_rng(1).integers(0, len(TOKENS), 12).astype(np.int32)
    cache = backend.new_cache(32)
    backend.forward(toks[:8], cache)
    np.testing.assert_allclose(backend.forward(toks[8:], cache), torch_logits(load_torch(src), toks)[8:], atol=TOL)
    r = run("generate", out, "the cat", "--backend", "onnx", "--device", "cpu", "--threads", 1, "--max-tokens", 12,
            "--json", "--baseline", "--temperature", "0")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["stats"]["identical_to_baseline"] is True


def test_cli_bad_hf_input(tmp_path):
    src = save_tiny(tmp_path / "m", "llama")
    r = run("export", src, "--via", "optimum", "--weights", "int8", "--out", tmp_path / "o")
    assert r.exit_code != 0 and "fp32 weights only" in r.output
    r = run("export", src, "--format", "gguf", "--out", tmp_path / "o.gguf")
    assert r.exit_code != 0 and "--format onnx" in r.output
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}))
    with pytest.raises(ModelFileError, match="rope scaling 'dynamic'.*--via optimum"):
        open_hf(src)
    (src / "config.json").write_text(json.dumps(cfg))
    (src / "model.safetensors").write_bytes(b"\x10\x00")
    with pytest.raises(ModelFileError, match="not a readable safetensors file"):
        open_hf(src)
