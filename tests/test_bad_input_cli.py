"""Bad input through the `specedge` CLI: every case exits 1 or 2 with a message naming the problem and the fix.

Tiny seeded models for most cases; the real SmolLM2 (and the Qwen GGUF / the ONNX artifact, when cached) for the
cross-family drafter and the damaged-artifact cases (marked real). tests/test_cli.py and tests/test_onnx_cli.py
hold the cases that existed before (default-context overflow, temperature -1, top_p 0, tampered data file).
"""
import json
import math
import os
import shutil

import pytest
from click.testing import CliRunner
from gguf import GGUFWriter

from specedge.apps.cli import cli
from specedge.models.gguf_in import open_gguf
from specedge.models.catalog import cached_path
from specedge.models.tiny import write_tiny_gguf
from specedge.models.family_base import canonical_to_gguf
from specedge.models.tiny import write_tiny_gguf


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def tiny(tiny_gguf):
    return tiny_gguf  # tests/conftest.py, shared (read-only)


@pytest.mark.parametrize("flag, value, message", [
    ("--temperature", "-0.5", "temperature must be >= 0"),
    ("--temperature", "nan", "temperature must be >= 0"),
    ("--temperature", "inf", "temperature must be >= 0"),
    ("--top-p", "1.5", "top_p must be in (0, 1]"),
    ("--top-p", "nan", "top_p must be in (0, 1]"),
    ("--top-k", "-3", "top_k must be an integer >= 0"),
    ("--min-p", "-0.1", "min_p must be in [0, 1)"),
    ("--min-p", "1.5", "min_p must be in [0, 1)"),
    ("--min-p", "nan", "min_p must be in [0, 1)"),
    ("--repeat-penalty", "0", "repeat_penalty must be > 0"),
    ("--repeat-penalty", "-1", "repeat_penalty must be > 0"),
    ("--repeat-penalty", "nan", "repeat_penalty must be > 0"),
])
def test_invalid_sampling_values(tiny, flag, value, message):
    r = run("generate", tiny, "hi", "--backend", "numpy", flag, value)
    assert r.exit_code == 2, r.output
    assert message in r.output and "invalid sampling parameter" in r.output


def test_prompt_longer_than_ctx(tiny):
    r = run("generate", tiny, "the cat sat on the mat " * 20, "--backend", "numpy", "--ctx", 32, "--raw")
    assert r.exit_code == 1, r.output
    assert "context holds 32" in r.output and "shorten the prompt" in r.output and "--ctx" in r.output


def _other_tokenizer(src, dst):
    """`src` re-written with its last BPE merge dropped: same vocabulary size, a different tokenizer."""
    m = open_gguf(src)
    wr = GGUFWriter(str(dst), m.config.arch)
    for key, v in m.typed_fields().items():
        if key == "general.architecture":
            continue
        value = v.value[:-1] if key == "tokenizer.ggml.merges" else v.value
        wr.add_key_value(key, value, v.type, v.sub_type)
    for name in m.config.tensor_names():
        qtype, raw = m.stored_tensor(name)
        wr.add_tensor(canonical_to_gguf(name), raw, raw_dtype=qtype)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return dst


def test_drafter_with_another_tokenizer(tiny, tmp_path):
    other = _other_tokenizer(write_tiny_gguf(tmp_path / "d.gguf", seed=1, n_layers=1), tmp_path / "other.gguf")
    r = run("generate", tiny, "hi", "--backend", "numpy", "--drafter", f"model:{other}")
    assert r.exit_code == 1, r.output
    assert "different tokenizer" in r.output and "pick a drafter from the same family" in r.output


@pytest.mark.parametrize("damage, message", [
    ("truncate", "truncated"),
    ("count", "claims"),
    ("magic", "not a GGUF file"),
])
def test_damaged_gguf(tiny, tmp_path, damage, message):
    data = bytearray(tiny.read_bytes())
    if damage == "truncate":
        data = data[:len(data) // 3]
    elif damage == "count":
        data[16:24] = (2**63).to_bytes(8, "little")  # the metadata key count
    else:
        data[:4] = b"GGML"
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    r = run("generate", bad, "hi", "--backend", "numpy")
    assert r.exit_code == 1 and message in r.output and "bad.gguf" in r.output, r.output
    assert "re-pull" in r.output or "re-download" in r.output


# ---- real models -------------------------------------------------------------------------------------------------

def _cached(name):
    path = cached_path(name)
    if path is None:
        pytest.skip(f"{name} is not in the model cache (specedge pull {name})")
    return path


@pytest.mark.real
def test_real_cross_family_drafter_is_refused(tmp_path):
    """SmolLM2 with a drafter of another vocabulary: Qwen2.5-Coder-0.5B where it is pulled (opt-in), else a tiny
    model whose tokenizer differs (the check compares tokenizer fingerprints either way)."""
    pytest.importorskip("llama_cpp")
    smol = _cached("smollm2-135m")
    other = cached_path("qwen2.5-coder-0.5b") or write_tiny_gguf(tmp_path / "other.gguf", seed=3)
    r = run("generate", smol, "hi", "--backend", "llamacpp", "--drafter", f"model:{other}", "--max-tokens", 4)
    assert r.exit_code == 1, r.output
    assert "different tokenizer" in r.output and "same family" in r.output


@pytest.fixture(scope="module")
def onnx_source(tmp_path_factory):
    """The cached smollm2-135m-onnx-int4 artifact; where this cache has none yet, one exported here (about a
    minute), so the tests run on a fresh CI cache too."""
    pytest.importorskip("onnxruntime")
    gguf = _cached("smollm2-135m")
    src = gguf.parent / "smollm2-135m-onnx-int4"
    if not (src / "manifest.json").is_file():
        from specedge.export.onnx_export import export_gguf_to_onnx
        from specedge.export.onnx_linear import WeightFormat
        src = tmp_path_factory.mktemp("onnx") / "smollm2-135m-onnx-int4"
        export_gguf_to_onnx(open_gguf(gguf), src, WeightFormat.INT4, threads=2)
    return src


@pytest.fixture
def onnx_copy(onnx_source, tmp_path):
    """The artifact as a tmp directory: the weight data symlinked (never written by the tests), everything else
    copied, so that editing a copy cannot damage the cached artifact through a link."""
    src = onnx_source
    dst = tmp_path / "art"
    dst.mkdir()
    for f in src.iterdir():
        if f.name.endswith(".data"):
            os.symlink(f, dst / f.name)
        else:
            shutil.copy(f, dst / f.name)
    return dst


@pytest.mark.real
@pytest.mark.parametrize("damage, message", [
    ("missing data", "artifact file model.onnx.data is missing; re-export"),
    ("missing tokenizer", "artifact file tokenizer.json is missing; re-export"),
    ("edited tokenizer", "does not match the SHA-256"),
    ("manifest", "re-export"),
])
def test_real_damaged_onnx_artifact(onnx_copy, damage, message):
    if damage == "missing data":
        (onnx_copy / "model.onnx.data").unlink()
    elif damage == "missing tokenizer":
        (onnx_copy / "tokenizer.json").unlink()
    elif damage == "edited tokenizer":
        text = (onnx_copy / "tokenizer.json").read_text()
        (onnx_copy / "tokenizer.json").write_text(text.replace('"Ġthe"', '"Ġthx"', 1))
    else:
        m = json.loads((onnx_copy / "manifest.json").read_text())
        m["config"]["n_layers"] = math.inf
        (onnx_copy / "manifest.json").write_text(json.dumps(m))
    r = run("generate", onnx_copy, "hi", "--backend", "onnx", "--max-tokens", 4, "--threads", 1)
    assert r.exit_code == 1, r.output
    assert message in r.output and str(onnx_copy) in r.output, r.output
