"""The SentencePiece tokenizer cache (models/tokenizer_spm.py) follows the model cache: `--cache-dir` /
`cache_dir=` put it in `<cache>/tokenizers`, like the plans and gates; without one, $SPECEDGE_TOKENIZER_CACHE, else
the default model cache's ($SPECEDGE_CACHE)."""
import dataclasses

import pytest
from click.testing import CliRunner

import specedge
from specedge.apps.cli import cli
from specedge.assembly import engine_gate
from specedge.models import tokenizer_spm
from specedge.models.tiny import tiny_config, tiny_weights, write_model_gguf
from specedge.models.tiny_vocab import tiny_spm_fields
from specedge.runtime.backends import info


@pytest.fixture
def spm_model(tmp_path, monkeypatch):
    """A tiny llama GGUF with a SentencePiece vocabulary, cached as a large one would be; the default caches moved
    under tmp_path."""
    monkeypatch.setattr(tokenizer_spm, "CACHE_MIN_TOKENS", 0)
    monkeypatch.delenv("SPECEDGE_TOKENIZER_CACHE", raising=False)
    monkeypatch.setenv("SPECEDGE_CACHE", str(tmp_path / "default"))
    spm = tiny_spm_fields(seed=3)
    cfg = dataclasses.replace(tiny_config(), vocab_size=len(spm["tokenizer.ggml.tokens"]),
                              bos_id=spm["tokenizer.ggml.bos_token_id"], eos_ids=(spm["tokenizer.ggml.eos_token_id"],))
    return write_model_gguf(tmp_path / "spm.gguf", cfg, tiny_weights(cfg), vocab=spm)


def cached(root):
    return sorted(p.name for p in (root / "tokenizers").glob("spm-*.json"))


def tokenize(path, *extra):
    r = CliRunner().invoke(cli, ["tokenize", str(path), "hello world", *extra])
    assert r.exit_code == 0, r.output
    return r.output


def test_the_cli_and_the_engine_cache_the_tokenizer_under_cache_dir(spm_model, tmp_path, monkeypatch):
    ids = tokenize(spm_model, "--cache-dir", str(tmp_path / "flag"))
    assert len(cached(tmp_path / "flag")) == 1 and cached(tmp_path / "default") == []
    assert tokenize(spm_model, "--cache-dir", str(tmp_path / "flag")) == ids  # read back from the cache
    specedge.Engine.open(str(spm_model), backend="numpy", drafter="none", ctx=64, cache_dir=tmp_path / "api")
    assert cached(tmp_path / "api") == cached(tmp_path / "flag")
    assert tokenize(spm_model) == ids  # no --cache-dir: the default model cache ($SPECEDGE_CACHE)
    assert cached(tmp_path / "default") == cached(tmp_path / "flag")
    monkeypatch.setenv("SPECEDGE_TOKENIZER_CACHE", str(tmp_path / "env"))
    tokenize(spm_model)
    assert len(list((tmp_path / "env").glob("spm-*.json"))) == 1  # the variable still moves the default
    tokenize(spm_model, "--cache-dir", str(tmp_path / "flag2"))
    assert len(cached(tmp_path / "flag2")) == 1  # but an explicit --cache-dir wins


def test_the_engine_gate_child_gets_the_cache_dir(tmp_path, monkeypatch):
    """The gate measures in a child process, which opens the file again: it is told the model cache."""
    cmd = engine_gate._child_command(tmp_path / "m.gguf", info("ik"), 2, "key", tmp_path / "out.json", tmp_path)
    seen = {}
    monkeypatch.setattr(engine_gate, "measure_gate", lambda *a: seen.update(args=a) or {})
    monkeypatch.setattr(engine_gate, "asdict", lambda gate: gate)
    engine_gate.main(cmd[3:])
    assert seen["args"][-1] == tmp_path
    engine_gate.main(engine_gate._child_command(tmp_path / "m.gguf", info("ik"), 2, "key", tmp_path / "o.json")[3:])
    assert seen["args"][-1] is None
