"""Fast by default, per call (issue 18): answers run to the end of the turn or the context limit (issue 44: at most
DEFAULT_MAX_TOKENS on the CLI and the Engine, where the server still runs to the end), sampling defaults come from the
model (else the chat defaults), and the CLI, the Engine and the server resolve them the same way."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

import specedge
from specedge.apps.cli import cli
from specedge.assembly.decoder import DEFAULT_MAX_TOKENS, CallSettings
from specedge.assembly.sampling_defaults import CHAT_DEFAULTS, SamplingDefaults, resolve
from specedge.models.generation import from_generation_config, from_gguf_metadata
from specedge.models.tiny import tiny_config, tiny_weights, write_tiny_gguf
from specedge.runtime.decode import decode
from specedge.runtime.request import PLAIN, Request
from specedge.runtime.types import SamplingParams

STATED = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """plain: no sampling metadata; stated: general.sampling.temp/top_p/top_k; endless: never picks EOS greedily;
    eos: greedy picks EOS after a few tokens (its EOS head row is 1.2x the row of the 7th greedy token)."""
    d = tmp_path_factory.mktemp("defaults")
    cfg = tiny_config(tied=False)
    w = tiny_weights(cfg, seed=0)
    plain = write_tiny_gguf(d / "plain.gguf", weights=w, tied=False)
    stated = write_tiny_gguf(d / "stated.gguf", weights=w, tied=False, sampling=STATED)
    endless_w = {k: v.copy() for k, v in w.items()}
    endless_w["lm_head"][cfg.eos_ids[0]] = 0.0
    endless = write_tiny_gguf(d / "endless.gguf", weights=endless_w, tied=False)
    engine = specedge.Engine.open(str(plain), backend="numpy", drafter="none", ctx=128)
    greedy = engine.generate(engine.encode("the cat sat on the mat"), temperature=0, max_tokens=12).tokens
    eos_w = {k: v.copy() for k, v in w.items()}
    eos_w["lm_head"][cfg.eos_ids[0]] = 1.2 * w["lm_head"][greedy[6]]
    eos = write_tiny_gguf(d / "eos.gguf", weights=eos_w, tied=False)
    return {"plain": plain, "stated": stated, "endless": endless, "eos": eos, "greedy": greedy}


def cli_json(*args):
    r = CliRunner().invoke(cli, ["generate", *map(str, args), "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---- max_tokens None: to the end of the turn or the context limit (the CLI's and Engine's default: 1024) --------

def test_call_settings_default_to_the_end_and_the_model_default():
    c = CallSettings()
    assert c.max_tokens == DEFAULT_MAX_TOKENS and c.temperature is None and c.top_p is None and c.seed == 0
    assert c.sampling() == SamplingParams(temperature=0.7, top_p=0.9, repeat_penalty=1.1, dry_multiplier=0.8)
    greedy = CallSettings(temperature=0).sampling(SamplingDefaults(0.6, 0.95, 20, repeat_penalty=1.1,
                                                                   dry_multiplier=0.8))
    assert greedy.greedy and greedy.repeat_penalty == 1.0 and greedy.dry_multiplier == 0.0  # exactly greedy
    assert CallSettings(temperature=0, dry_multiplier=0.5).sampling().dry_multiplier == 0.5  # unless asked
    assert CallSettings(dry_multiplier=0).sampling().dry_multiplier == 0.0  # 0 turns it off
    assert CallSettings(temperature=0, repeat_penalty=1.3).sampling().repeat_penalty == 1.3  # unless asked
    assert CallSettings(repeat_penalty=1.0).sampling().repeat_penalty == 1.0  # 1 turns it off
    with pytest.raises(ValueError, match="max_tokens"):
        CallSettings(max_tokens=0)
    with pytest.raises(ValueError, match="top_p"):
        CallSettings(top_p=0)


@pytest.mark.parametrize("drafter", ["none", "ngram", "recycle:8", "model:{endless}"])
def test_no_max_tokens_runs_to_the_context_limit_with_finish_length(models, drafter):
    engine = specedge.Engine.open(str(models["endless"]), backend="numpy", ctx=64,
                             drafter=drafter.format(endless=models["endless"]))
    ids = engine.encode("the cat sat on the mat")
    for _ in range(2):  # the second call reuses the session's prefix: the same room
        c = engine.generate(ids, temperature=0, max_tokens=None)
        assert c.finish_reason == "length" and len(c.tokens) == 64 - len(ids)
    plain = [e.token for e in decode(engine.model.backend, np.asarray(ids, np.int32), PLAIN,
                                     Request(max_tokens=None, max_context=64))]
    assert c.tokens == plain  # lossless to the last position of the context


def test_no_max_tokens_stops_at_eos(models):
    engine = specedge.Engine.open(str(models["eos"]), backend="numpy", drafter="ngram", ctx=128)
    ids = engine.encode("the cat sat on the mat")
    c = engine.generate(ids, temperature=0)
    assert c.finish_reason == "eos" and 0 < len(c.tokens) <= 6
    assert c.tokens == models["greedy"][:len(c.tokens)]
    sampled = engine.generate(ids)  # the chat default, seed 0: ends too, never raises
    assert sampled.finish_reason in ("eos", "length") and sampled.stats.sampling.temperature == 0.7


def test_cli_generate_without_max_tokens_reaches_the_limit_and_reports_length(models):
    r = CliRunner().invoke(cli, ["generate", str(models["endless"]), "the cat", "--backend", "numpy", "--drafter",
                                 "ngram", "--ctx", 48, "--temperature", 0, "--raw", "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout.strip().splitlines()[-1])
    assert obj["finish_reason"] == "length" and obj["stats"]["n_generated"] == 48 - obj["stats"]["n_prefilled"] - 1


# ---- sampling defaults: model, else chat default; 0 is greedy; every front end agrees ---------------------------

def test_gguf_sampling_keys_are_read_and_fall_back_field_by_field(models):
    assert resolve(from_gguf_metadata({"general.sampling.temp": np.float32(0.6)}), "gguf") == SamplingDefaults(
        0.6, 0.9, 0, 0.0, "gguf", repeat_penalty=1.1, dry_multiplier=0.8)
    assert resolve({"temperature": "hot", "top_p": 7}, "x") is CHAT_DEFAULTS  # invalid values do not count
    stated = specedge.Engine.open(str(models["stated"]), backend="numpy", drafter="none", ctx=64)
    assert stated.sampling_defaults == SamplingDefaults(0.6, 0.95, 20, 0.0, "gguf general.sampling", 1.1, 0.8)
    plain = specedge.Engine.open(str(models["plain"]), backend="numpy", drafter="none", ctx=64)
    assert plain.sampling_defaults is CHAT_DEFAULTS
    assert (CHAT_DEFAULTS.temperature, CHAT_DEFAULTS.top_p, CHAT_DEFAULTS.repeat_penalty) == (0.7, 0.9, 1.1)


def test_generation_config_of_a_checkpoint(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.6,
                                                                 "top_p": 0.9, "top_k": 50, "eos_token_id": 2}))
    assert from_generation_config(tmp_path) == {"temperature": 0.6, "top_p": 0.9, "top_k": 50}
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": False, "temperature": 0.6}))
    assert from_generation_config(tmp_path) == {"temperature": 0.0}  # transformers decodes greedily then
    assert from_generation_config(tmp_path / "missing") == {}


def test_temperature_zero_is_greedy_exactly(models):
    engine = specedge.Engine.open(str(models["stated"]), backend="numpy", drafter="ngram", ctx=128)
    ids = engine.encode("the cat sat on the mat")
    c = engine.generate(ids, temperature=0, max_tokens=12)
    assert c.tokens == models["greedy"] and c.stats.sampling.temperature == 0
    assert engine.generate(ids, max_tokens=12).tokens != models["greedy"]  # the model's 0.6 samples


@pytest.mark.parametrize("name, want", [("stated", (0.6, 0.95, 20)), ("plain", (0.7, 0.9, 0))])
def test_cli_engine_and_server_resolve_the_same_defaults(models, name, want):
    from starlette.testclient import TestClient

    from specedge.apps.server import ServerConfig, create_app
    path = models[name]
    engine = specedge.Engine.open(str(path), backend="numpy", drafter="ngram", ctx=128)
    prompt = "the cat sat on the mat"
    by_engine = engine.generate(prompt, max_tokens=16)
    used = by_engine.stats.sampling_dict()
    assert (used["temperature"], used["top_p"], used["top_k"]) == want and used["seed"] == 0
    by_cli = cli_json(path, prompt, "--backend", "numpy", "--drafter", "ngram", "--ctx", 128, "--max-tokens", 16,
                      "--raw")
    assert by_cli["stats"]["sampling"] == used and by_cli["tokens"] == by_engine.tokens
    with TestClient(create_app(engine, ServerConfig("tiny")), base_url="http://127.0.0.1") as client:
        r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 16})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["specedge"]["sampling"] == used and body["choices"][0]["text"] == by_engine.text
        r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 16, "temperature": 0})
        assert r.json()["specedge"]["sampling"]["temperature"] == 0


def test_server_without_max_tokens_runs_to_the_end(models):
    from starlette.testclient import TestClient

    from specedge.apps.server import ServerConfig, create_app
    engine = specedge.Engine.open(str(models["endless"]), backend="numpy", drafter="ngram", ctx=64)
    with TestClient(create_app(engine, ServerConfig("tiny")), base_url="http://127.0.0.1") as client:
        for route, body in (("/v1/completions", {"prompt": "the cat"}),
                            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
            r = client.post(route, json={**body, "temperature": 0})
            assert r.status_code == 200, r.text
            out = r.json()
            assert out["choices"][0]["finish_reason"] == "length"
            assert out["usage"]["total_tokens"] == 64  # the whole context: prompt + answer
    eos = specedge.Engine.open(str(models["eos"]), backend="numpy", drafter="ngram", ctx=128)
    with TestClient(create_app(eos, ServerConfig("tiny")), base_url="http://127.0.0.1") as client:
        out = client.post("/v1/completions", json={"prompt": "the cat sat on the mat", "temperature": 0}).json()
        assert out["choices"][0]["finish_reason"] == "stop" and out["usage"]["completion_tokens"] <= 6


def test_an_exported_artifact_records_and_uses_the_sources_sampling(models, tmp_path):
    pytest.importorskip("onnxruntime")
    from specedge.export.onnx_export import WeightFormat, export_gguf_to_onnx
    from specedge.models.gguf_in import open_gguf
    path = export_gguf_to_onnx(open_gguf(models["stated"]), tmp_path / "stated-onnx", WeightFormat.FP32, gate=False)
    assert json.loads(path.read_text())["generation"] == STATED
    engine = specedge.Engine.open(str(tmp_path / "stated-onnx"), backend="onnx", drafter="none", device="cpu", threads=1,
                             ctx=64)
    assert engine.sampling_defaults == SamplingDefaults(0.6, 0.95, 20, 0.0, "manifest generation", 1.1, 0.8)
    plain = export_gguf_to_onnx(open_gguf(models["plain"]), tmp_path / "plain-onnx", WeightFormat.FP32, gate=False)
    assert "generation" not in json.loads(plain.read_text())  # optional: written only when the source states it


@pytest.mark.real
@pytest.mark.slow
def test_real_model_greeting_ends_at_the_end_of_its_turn():
    from specedge.models.catalog import model_cache_dir
    if not (model_cache_dir(None) / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file():
        pytest.skip("the default model is not pulled: run `specedge pull smollm2-135m`")
    pytest.importorskip("llama_cpp")
    engine = specedge.Engine.open("smollm2-135m", backend="llamacpp", drafter="ngram", ctx=512, threads=1)
    assert engine.sampling_defaults is CHAT_DEFAULTS  # the catalogue GGUF states no general.sampling keys
    hi = [{"role": "user", "content": "Hi! How are you?"}]
    c = engine.chat(hi)  # the defaults: sampled at 0.7 / 0.9, seed 0, to the end of the turn
    assert c.finish_reason == "eos" and 0 < len(c.tokens) < 512 - c.prompt_tokens - 1 and c.text.strip()
    # greedy to the context limit (6 positions past the prompt: no answer ends first): finish length there, and
    # nothing raises (whether greedy SmolLM2 loops on this prompt depends on the CPU's kernels: on an AMD EPYC it
    # does, on an Intel Xeon it says goodbye)
    short = specedge.Engine.open("smollm2-135m", backend="llamacpp", drafter="ngram", ctx=c.prompt_tokens + 6,
                                 threads=1)
    c = short.chat(hi, temperature=0)
    assert c.finish_reason == "length" and c.prompt_tokens + len(c.tokens) == short.context_length


def test_a_sampled_call_gets_dry_with_the_models_breakers_and_a_greedy_call_none(models):
    """DRY's breakers come from the model's tokenizer: tokens whose text holds a newline, ':', '"' or '*', and the
    end-of-generation ids (llama.cpp's default sequence breakers); a greedy call has no DRY at all."""
    engine = specedge.Engine.open(str(models["plain"]), backend="numpy", drafter="none", ctx=64)
    tok, decoder = engine.decoder.model.tokenizer, engine.decoder
    breakers = decoder.dry_breakers()
    assert set(tok.eos_ids) <= breakers and decoder.dry_breakers() is breakers  # read once
    for i in range(tok.vocab_size):
        marked = any(m in tok.token_bytes(i) for m in (b"\n", b":", b'"', b"*"))
        assert (i in breakers) == (marked or i in tok.eos_ids), i
    assert any(b"\n" in tok.token_bytes(i) for i in breakers)
    sampled = decoder.request(CallSettings()).params
    assert sampled.dry_multiplier == 0.8 and sampled.dry_breakers == breakers
    greedy = decoder.request(CallSettings(temperature=0)).params
    assert greedy.dry_multiplier == 0.0 and greedy.dry_breakers == frozenset()
