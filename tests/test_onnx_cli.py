"""`specedge export` (onnx with its parity gate, gguf layer subsets) and `specedge generate --backend onnx` on tiny
models: artifacts by path and by cache name, drafters on the ONNX target, and the errors for bad input."""
import dataclasses
import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("onnxruntime")

from specedge.apps.cli import cli  # noqa: E402
from specedge.models.gguf_in import open_gguf  # noqa: E402
from specedge.export.onnx_export import export_gguf_to_onnx  # noqa: E402
from specedge.export.onnx_linear import WeightFormat  # noqa: E402
from specedge.export.parity_gate import Tolerance, check_artifact  # noqa: E402
from specedge.models.tokenizer_gguf import build_hf_tokenizer  # noqa: E402
from specedge.models.manifest import sha256_file  # noqa: E402
from specedge.models.tiny import tiny_vocab, write_tiny_gguf  # noqa: E402
from specedge.runtime.tokenizer import Tokenizer  # noqa: E402


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A 2-layer target GGUF, a 1-layer drafter GGUF (same vocabulary), both exported fp32 through the CLI."""
    d = tmp_path_factory.mktemp("onnx-cli")
    target = write_tiny_gguf(d / "tiny.gguf", seed=0)
    draft = write_tiny_gguf(d / "draft.gguf", seed=1, n_layers=1)
    for src, out in ((target, d / "target-onnx"), (draft, d / "draft-onnx")):
        r = run("export", src, "--format", "onnx", "--weights", "fp32", "--out", out, "--threads", 1)
        assert r.exit_code == 0, r.output
        assert "parity gate PASS" in r.stderr and r.stdout.strip() == str(out)
    return d


def _rehash(root, name):
    """Update the manifest's hash of one file (an artifact edited on purpose, hashes consistent)."""
    m = json.loads((root / "manifest.json").read_text())
    m["files"][name] = {"sha256": sha256_file(root / name), "bytes": (root / name).stat().st_size}
    (root / "manifest.json").write_text(json.dumps(m))


def test_export_records_a_passed_gate(models):
    parity = json.loads((models / "target-onnx" / "manifest.json").read_text())["parity"]
    assert parity["passed"] and parity["top1"] >= 0.99 and parity["max_dlogit"] <= 0.01 and parity["prompts"] == 8


@pytest.mark.parametrize("drafter", ["ngram", "model:{draft}", "none"])
def test_generate_onnx_is_lossless_with_each_drafter(models, drafter):
    r = run("generate", models / "target-onnx", "hello world", "--backend", "onnx", "--device", "cpu", "--threads", 1,
            "--drafter", drafter.format(draft=models / "draft-onnx"), "--max-tokens", 20, "--temperature", 0, "--json",
            "--baseline")
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout.strip().splitlines()[-1])["stats"]
    assert stats["backend"] == "onnx"
    if drafter == "none":  # plain against plain: nothing to compare, and it says so
        assert "identical_to_baseline" not in stats and "nothing to compare" in r.stderr
    else:
        assert stats["identical_to_baseline"] is True


def test_generate_finds_an_exported_name_in_the_cache(models, tmp_path):
    r = run("export", models / "tiny.gguf", "--weights", "fp16", "--cache-dir", tmp_path, "--threads", 1)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "tiny-onnx-fp16" / "manifest.json").is_file()
    mask = os.umask(0)
    os.umask(mask)
    for f in ("model.onnx", "model.onnx.data", "manifest.json"):  # as a plain open() makes them: a shared cache
        assert (tmp_path / "tiny-onnx-fp16" / f).stat().st_mode & 0o777 == 0o666 & ~mask, f
    r = run("generate", "tiny-onnx-fp16", "the cat", "--backend", "onnx", "--cache-dir", tmp_path,
            "--max-tokens", 8, "--threads", 1)
    assert r.exit_code == 0, r.output
    assert "--device auto chose" in r.stderr


def test_gate_fails_a_broken_artifact(models, tmp_path):
    """Weights damaged after export (hashes made consistent again): the gate must see it in the logits."""
    gguf = open_gguf(models / "tiny.gguf")
    out = tmp_path / "broken"
    export_gguf_to_onnx(gguf, out, WeightFormat.FP32, gate=False)
    data = np.memmap(out / "model.onnx.data", dtype=np.float32, mode="r+")
    data[len(data) // 2: len(data) // 2 + 4096] *= 3.0
    data.flush()
    del data
    _rehash(out, "model.onnx.data")
    report = check_artifact(out, gguf.load_weights(), Tokenizer(gguf.tokenizer_spec()), threads=1)
    assert not report.passed and report.max_dlogit > 0.01
    assert "FAIL" in report.summary() and f"{report.max_dlogit:.4g}" in report.summary()
    good = check_artifact(models / "target-onnx", gguf.load_weights(), Tokenizer(gguf.tokenizer_spec()), threads=1)
    assert good.passed and good.tolerance == Tolerance.for_format("fp32")


def test_export_out_of_tolerance_exits_nonzero_and_generate_refuses_it(models, tmp_path):
    out = tmp_path / "strict"
    r = run("export", models / "tiny.gguf", "--weights", "int4", "--out", out, "--max-dlogit", 0, "--threads", 1)
    assert r.exit_code != 0
    assert "parity gate FAIL" in r.output and "max |dlogit|" in r.output and "top-1 agreement" in r.output
    assert json.loads((out / "manifest.json").read_text())["parity"]["passed"] is False
    r = run("generate", out, "hi", "--backend", "onnx", "--max-tokens", 4)
    assert r.exit_code != 0 and "failed its parity gate" in r.output


@pytest.mark.parametrize("case, message", [
    ("missing", "no manifest.json"),
    ("tampered", "does not match the SHA-256"),
    ("not-exported", "no exported ONNX model"),
    ("gguf", "export it first"),
])
def test_generate_onnx_bad_input(models, tmp_path, case, message):
    if case == "missing":
        target = tmp_path / "empty"
        target.mkdir()
    elif case == "tampered":
        target = tmp_path / "tampered"
        export_gguf_to_onnx(open_gguf(models / "tiny.gguf"), target, WeightFormat.FP32, gate=False)
        with open(target / "model.onnx.data", "r+b") as f:
            f.seek(100)
            f.write(b"\x00\x01\x02\x03")
    elif case == "not-exported":
        target = "tiny-onnx-int8"
    else:
        target = models / "tiny.gguf"
    r = run("generate", target, "hi", "--backend", "onnx", "--cache-dir", tmp_path, "--max-tokens", 4)
    assert r.exit_code != 0 and message in r.output, r.output


def test_devices(models):
    r = run("generate", models / "target-onnx", "hi", "--backend", "onnx", "--device", "tpu")
    assert r.exit_code != 0 and "tpu" in r.output
    r = run("generate", models / "target-onnx", "hi", "--backend", "onnx", "--device", "qnn")
    assert r.exit_code != 0 and "QNNExecutionProvider" in r.output and "install" in r.output
    r = run("generate", models / "tiny.gguf", "hi", "--backend", "numpy", "--device", "cuda")
    assert r.exit_code != 0 and "applies to --backend onnx" in r.output


def test_drafter_with_another_tokenizer_is_refused(models, tmp_path):
    other = tmp_path / "other-onnx"
    export_gguf_to_onnx(open_gguf(models / "draft.gguf"), other, WeightFormat.FP32, gate=False)
    tokens, types, merges = tiny_vocab()
    (other / "tokenizer.json").write_text(build_hf_tokenizer(tokens, types, merges[:-1], "smollm").to_str())
    _rehash(other, "tokenizer.json")
    r = run("generate", models / "target-onnx", "hi", "--backend", "onnx", "--drafter", f"model:{other}")
    assert r.exit_code != 0 and "different tokenizer" in r.output


def test_export_gguf_layer_subset(models, tmp_path):
    out = tmp_path / "sub.gguf"
    r = run("export", models / "tiny.gguf", "--format", "gguf", "--weights", "fp16", "--layers", "1", "--out", out)
    assert r.exit_code == 0, r.output
    sub = open_gguf(out)
    assert sub.config.n_layers == 1 and dataclasses.replace(sub.config, n_layers=2) == open_gguf(
        models / "tiny.gguf").config
    for args, message in ((("--layers", "0-7"), "layers must be in 0..1"), (("--weights", "int4"), "fp32 or fp16"),
                          (("--layers", "x"), "indices and ranges")):
        r = run("export", models / "tiny.gguf", "--format", "gguf", "--out", tmp_path / "x.gguf", *args)
        assert r.exit_code != 0 and message in r.output, r.output


def test_export_layered_profile_passes_the_gate_and_generates(models, tmp_path):
    """--profile layered: the parity gate runs the layered backend; generate on it is lossless with a drafter."""
    out = tmp_path / "layered"
    r = run("export", models / "tiny.gguf", "--format", "onnx", "--weights", "fp32", "--profile", "layered", "--out",
            out, "--threads", 1)
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["profile"] == "layered" and manifest["parity"]["passed"]
    assert len(manifest["segments"]["layers"]) == 2
    r = run("generate", out, "hello world", "--backend", "onnx", "--device", "cpu", "--threads", 1, "--drafter",
            "ngram", "--max-tokens", 20, "--temperature", 0, "--json", "--baseline")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["stats"]["identical_to_baseline"] is True
