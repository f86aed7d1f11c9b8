"""`specedge pull hf:OWNER/REPO[/FILE.gguf]` against a local server standing in for the Hugging Face Hub
(tests/hub_server.py; HF_ENDPOINT points at it, never at the real hub): GGUF and checkpoint pulls, generate and
export from the cached copies, resume after an interrupted transfer, hash checks on download and on reuse, offline
reuse, and the error messages."""
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("huggingface_hub")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from hub_server import TOKEN, FakeHub, serve  # noqa: E402
from specedge.apps.cli import cli  # noqa: E402
from specedge.models import hub  # noqa: E402
from specedge.models.families import family  # noqa: E402
from specedge.models.tiny import CHATML, tiny_config, tiny_vocab, tiny_weights, write_tiny_gguf  # noqa: E402
from specedge.models.tokenizer_gguf import build_hf_tokenizer  # noqa: E402

GGUF = "tiny-f32.gguf"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{"gguf": bytes of a tiny seeded GGUF, "ckpt": {name: bytes} of a tiny llama Hugging Face checkpoint}."""
    d = tmp_path_factory.mktemp("src")
    gguf = write_tiny_gguf(d / GGUF).read_bytes()
    cfg = tiny_config()
    names = family("llama").NAMES
    tensors = {names.canonical_to_hf(k): v for k, v in tiny_weights(cfg, seed=1).items()}
    tokens, types, merges = tiny_vocab()
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": cfg.d_model,
              "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
              "num_key_value_heads": cfg.n_kv_heads, "vocab_size": cfg.vocab_size, "rms_norm_eps": cfg.rms_eps,
              "rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.context_length, "tie_word_embeddings": True,
              "bos_token_id": cfg.bos_id, "eos_token_id": cfg.eos_ids[0], "hidden_act": "silu",
              "torch_dtype": "float32"}
    ckpt = {"config.json": json.dumps(config).encode(),
            "model.safetensors": safetensors_numpy.save(tensors, metadata={"format": "pt"}),
            "tokenizer.json": build_hf_tokenizer(tokens, types, merges, "smollm").to_str().encode(),
            "tokenizer_config.json": json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                 "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
                                                 "add_bos_token": False, "chat_template": CHATML}).encode(),
            "generation_config.json": json.dumps({"do_sample": False}).encode()}
    return {"gguf": gguf, "ckpt": ckpt}


@pytest.fixture
def fake(tmp_path, monkeypatch, files):
    """A FakeHub with acme/tiny-GGUF (one GGUF), acme/multi-GGUF (two), acme/tiny-llama (a checkpoint plus files
    we must not fetch), acme/bin-only and the gated acme/gated-GGUF; the specedge cache in tmp_path."""
    import huggingface_hub.constants
    fake = FakeHub()
    fake.add("acme/tiny-GGUF", {GGUF: files["gguf"], "README.md": b"# tiny\n"})
    fake.add("acme/multi-GGUF", {"a.gguf": files["gguf"], "q/b.gguf": files["gguf"]})
    fake.add("acme/tiny-llama", {**files["ckpt"], "README.md": b"# tiny\n", "pytorch_model.bin": b"\0" * 64,
                                 "onnx/model.onnx": b"\0" * 64, "tokenizer.model": b"\0" * 8})
    fake.add("acme/bin-only", {"config.json": files["ckpt"]["config.json"], "pytorch_model.bin": b"\0" * 64})
    fake.add("acme/gated-GGUF", {GGUF: files["gguf"]}, gated=True)
    server, url = serve(fake)
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("SPECEDGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no stored login token
    for var in ("HF_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # whatever the environment says
    fake.url, fake.cache, fake.server = url, tmp_path / "cache", server
    yield fake
    server.shutdown()
    server.server_close()


def run(*args, ok=True):
    res = CliRunner().invoke(cli, [str(a) for a in args])
    assert (res.exit_code == 0) == ok, res.output
    return res


def generate(model, *extra):
    res = run("generate", model, "hello world", "--raw", "--backend", "numpy", "--drafter", "ngram", "--k", "2",
              "--max-tokens", "6", "--temperature", "0", "--json", *extra)
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_parse_refs():
    assert hub.HubRef.parse("hf:a/b") == hub.HubRef("a/b")
    assert hub.HubRef.parse("hf:a/b/q/x.gguf@v1") == hub.HubRef("a/b", "q/x.gguf", "v1")
    assert str(hub.HubRef.parse("hf:a/b/x.gguf", "v2")) == "hf:a/b/x.gguf@v2"
    for bad in ("hf:a", "hf:a/b/config.json", "hf:a/../b", "hf:/b"):
        with pytest.raises(ValueError):
            hub.HubRef.parse(bad)


def test_pull_gguf_then_generate_list_and_remove(fake, files, tmp_path):
    spec = f"hf:acme/tiny-GGUF/{GGUF}"
    path = Path(run("pull", spec).stdout.strip().splitlines()[-1])
    commit = fake.repos["acme/tiny-GGUF"].commit
    assert path == fake.cache / "hf" / "acme--tiny-GGUF" / commit / GGUF
    assert path.read_bytes() == files["gguf"]
    record = json.loads((path.parent / hub.RECORD).read_text())
    import hashlib
    assert record["files"][GGUF]["sha256"] == hashlib.sha256(files["gguf"]).hexdigest()
    assert not (path.parent / "README.md").exists()

    fake.log.clear()
    out = generate(spec)
    assert fake.log == []  # the cached copy, without the network
    local = tmp_path / "local.gguf"
    local.write_bytes(files["gguf"])
    assert out["tokens"] == generate(str(local))["tokens"] and len(out["tokens"]) == 6
    assert out["stats"]["model"] == str(path)
    drafted = generate(spec, "--drafter", f"model:{spec}")  # a hub ref as the draft model (here: the target itself)
    assert drafted["tokens"] == out["tokens"] and drafted["stats"]["drafter"].startswith(f"model:{spec}")
    assert fake.log == []

    listing = json.loads(run("models", "--json").stdout)
    assert [(r["name"], r["kind"], r["path"]) for r in listing["hf"]] == [(spec, "gguf", str(path))]
    assert spec in run("models").stdout
    res = run("rm", spec)
    assert str(path) in res.stdout and not path.exists()
    assert json.loads(run("models", "--json").stdout)["hf"] == []
    assert hub.cached(spec) is None


def test_repo_with_one_gguf_and_several(fake, files):
    path = Path(run("pull", "hf:acme/tiny-GGUF").stdout.strip().splitlines()[-1])
    assert path.name == GGUF and path.read_bytes() == files["gguf"]
    assert hub.cached("hf:acme/tiny-GGUF") == path
    res = run("pull", "hf:acme/multi-GGUF", ok=False)
    assert "2 GGUF files" in res.output and "hf:acme/multi-GGUF/q/b.gguf" in res.output
    nested = Path(run("pull", "hf:acme/multi-GGUF/q/b.gguf").stdout.strip().splitlines()[-1])
    assert nested.parts[-2:] == ("q", "b.gguf") and nested.read_bytes() == files["gguf"]


def test_pull_checkpoint_then_export(fake, files):
    spec = "hf:acme/tiny-llama"
    folder = Path(run("pull", spec).stdout.strip().splitlines()[-1])
    assert folder.is_dir()
    got = sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.endswith(".sha256")
                 and p.name != hub.RECORD)
    assert got == sorted(files["ckpt"])  # no .bin, no README, no onnx/, no tokenizer.model
    assert not (folder / "onnx").exists()
    for name, data in files["ckpt"].items():
        assert (folder / name).read_bytes() == data
    res = run("generate", spec, "hi", "--backend", "numpy", "--drafter", "ngram", ok=False)
    assert "specedge export hf:acme/tiny-llama" in res.output
    fake.log.clear()
    res = run("export", spec, "--weights", "fp32")
    assert fake.log == []
    out = fake.cache / "tiny-llama-onnx-fp32"
    assert Path(res.stdout.strip().splitlines()[-1]) == out and (out / "manifest.json").is_file()
    assert "parity gate PASS" in res.output
    rows = json.loads(run("models", "--json").stdout)["hf"]
    assert [(r["name"], r["kind"], r["path"], r["revision"]) for r in rows] == [(spec, "checkpoint", str(folder),
                                                                                 "main")]
    run("rm", spec)
    assert not folder.parent.exists() and (out / "manifest.json").is_file()  # the export is a model of its own
    assert "not in the model cache" in run("rm", spec, ok=False).output


def test_bin_only_checkpoint_is_refused(fake):
    res = run("pull", "hf:acme/bin-only", ok=False)
    assert "only PyTorch weights (pytorch_model.bin)" in res.output


def test_interrupted_download_resumes(fake, files, monkeypatch):
    import huggingface_hub.constants
    # huggingface_hub writes the stream in DOWNLOAD_CHUNK_SIZE pieces (10 MB); our file is 380 KB
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 4096)
    spec = f"hf:acme/tiny-GGUF/{GGUF}"
    fake.cut[GGUF] = 3 * 4096 + 100  # the connection drops mid-file
    res = run("pull", spec, ok=False)
    assert "interrupted" in res.output and f"specedge pull {spec}" in res.output
    folder = fake.cache / "hf" / "acme--tiny-GGUF" / fake.repos["acme/tiny-GGUF"].commit
    partial = list(folder.glob(".cache/huggingface/download/*.incomplete"))
    assert [p.stat().st_size for p in partial] == [3 * 4096] and not (folder / GGUF).exists()
    assert hub.cached(spec) is None
    fake.log.clear()
    path = Path(run("pull", spec).stdout.strip().splitlines()[-1])
    assert path.read_bytes() == files["gguf"]
    url = f"/acme/tiny-GGUF/resolve/{fake.repos['acme/tiny-GGUF'].commit}/{GGUF}"
    assert [r for r in fake.requests("GET") if r[1].endswith(GGUF)] == [("GET", url, f"bytes={3 * 4096}-")]
    assert not list(folder.glob(".cache/huggingface/download/*.incomplete"))


def test_corrupted_download_is_refused(fake):
    spec = f"hf:acme/tiny-GGUF/{GGUF}"
    fake.corrupt.add(GGUF)
    res = run("pull", spec, ok=False)
    assert "does not match the hub's sha256" in res.output
    assert hub.cached(spec) is None
    fake.corrupt.clear()
    run("pull", spec)


def test_tampered_cache_is_detected_and_pulled_again(fake, files):
    spec = f"hf:acme/tiny-GGUF/{GGUF}"
    path = Path(run("pull", spec).stdout.strip().splitlines()[-1])
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    res = run("generate", spec, "hi", "--backend", "numpy", "--drafter", "ngram", "--raw", ok=False)
    assert "does not match the SHA-256 recorded" in res.output and f"specedge pull {spec}" in res.output
    fake.log.clear()
    run("pull", spec)
    assert path.read_bytes() == files["gguf"]
    assert any(r[0] == "GET" and r[1].endswith(GGUF) for r in fake.log)
    fake.log.clear()
    run("pull", spec)  # verified in the cache: nothing downloaded again
    assert not any(r[0] == "GET" and r[1].endswith(GGUF) for r in fake.log)


def test_offline_reuse(fake, files, monkeypatch):
    spec = f"hf:acme/tiny-GGUF/{GGUF}"
    path = Path(run("pull", spec).stdout.strip().splitlines()[-1])
    tokens = generate(spec)["tokens"]
    fake.server.shutdown()
    fake.server.server_close()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert Path(run("pull", spec).stdout.strip().splitlines()[-1]) == path
    assert generate(spec)["tokens"] == tokens
    res = run("pull", "hf:acme/tiny-llama", ok=False)
    assert "HF_HUB_OFFLINE" in res.output
    monkeypatch.delenv("HF_HUB_OFFLINE")
    # The hub unreachable (server gone) without offline mode: a cached ref is used, a new one names the problem.
    assert Path(run("pull", spec).stdout.strip().splitlines()[-1]) == path
    res = run("pull", "hf:acme/tiny-llama", ok=False)
    assert "cannot reach the Hugging Face Hub" in res.output and "HF_ENDPOINT" in res.output


def test_errors_name_the_fix(fake, files, monkeypatch):
    res = run("pull", "hf:acme/nope", ok=False)
    assert "no model repository acme/nope" in res.output and "HF_TOKEN" in res.output
    res = run("pull", "hf:acme/tiny-GGUF/other.gguf", ok=False)
    assert "has no file other.gguf" in res.output and GGUF in res.output
    res = run("pull", f"hf:acme/tiny-GGUF/{GGUF}", "--revision", "v9", ok=False)
    assert "no revision 'v9'" in res.output
    res = run("pull", f"hf:acme/gated-GGUF/{GGUF}", ok=False)
    assert "is gated" in res.output and f"{fake.url}/acme/gated-GGUF" in res.output and "HF_TOKEN" in res.output
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    path = Path(run("pull", f"hf:acme/gated-GGUF/{GGUF}").stdout.strip().splitlines()[-1])
    assert path.read_bytes() == files["gguf"]
    res = run("pull", "smollm2-135m", "--revision", "main", ok=False)
    assert "--revision" in res.output


def test_revision_pins_a_commit(fake, files):
    commit = fake.repos["acme/tiny-GGUF"].commit
    path = Path(run("pull", f"hf:acme/tiny-GGUF/{GGUF}", "--revision", commit).stdout.strip().splitlines()[-1])
    assert path.parent.name == commit
    fake.log.clear()
    assert hub.cached(f"hf:acme/tiny-GGUF/{GGUF}@{commit}") == path
    assert hub.cached(f"hf:acme/tiny-GGUF/{GGUF}") is None  # main was never resolved
    assert fake.log == []
    np.testing.assert_equal(np.frombuffer(path.read_bytes(), np.uint8), np.frombuffer(files["gguf"], np.uint8))
