"""Fuzz the artifact manifest loader (models/manifest.py read_manifest) and the artifact's tokenizer.json.

Base: a tiny model exported to ONNX (fp32, no gate: only the manifest and tokenizer are under test). Each case
writes a damaged manifest.json next to the real files: random JSON values at random places (wrong types, huge and
non-finite numbers, deep nesting), deleted keys, truncated text, non-UTF-8 bytes. read_manifest and the tokenizer
load must succeed or raise ModelFileError naming the file and the fix (re-export). The tokenizer.json harness
mutates that file the same way: Tokenizer() must work or raise ValueError naming the fix.
CI: 1500 + 800 cases; SPECEDGE_FUZZ_EXAMPLES=N for a long run.
"""
import json
import shutil

import pytest
from hypothesis import given, strategies as st

pytest.importorskip("onnx")

from fuzz_util import fuzz_settings, time_limit  # noqa: E402
from specedge.models.gguf_in import open_gguf  # noqa: E402
from specedge.export.onnx_export import export_gguf_to_onnx  # noqa: E402
from specedge.export.onnx_linear import WeightFormat  # noqa: E402
from specedge.models.errors import ModelFileError  # noqa: E402
from specedge.models.manifest import read_manifest, sha256_file  # noqa: E402
from specedge.models.tiny import write_tiny_gguf  # noqa: E402
from specedge.models.tokenizer_spec import TokenizerSpec  # noqa: E402
from specedge.runtime.tokenizer import Tokenizer  # noqa: E402


class Artifact(tuple):
    def __repr__(self):
        return "Artifact(<tiny fp32 export>)"


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """(the exported directory, its manifest as a dict, a scratch copy whose manifest each case overwrites)."""
    d = tmp_path_factory.mktemp("fuzz_manifest")
    src = write_tiny_gguf(d / "tiny.gguf", n_layers=1, d_model=32, n_heads=2, n_kv_heads=1, d_ff=64)
    out = d / "art"
    export_gguf_to_onnx(open_gguf(src), out, WeightFormat.FP32, gate=False)
    case = d / "case"
    shutil.copytree(out, case)
    return Artifact((out, json.loads((out / "manifest.json").read_text()), case))


# JSON values that break readers: wrong types, huge / negative / non-finite numbers, long strings, nesting.
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.sampled_from([0, -1, 2**63, 10**400]),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
                     st.sampled_from(["../../etc/passwd", "/etc/passwd", "model.onnx", "tokenizer.json", "", "a" * 300]))
_json = st.recursive(_scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                     max_leaves=12)


def _paths(obj, prefix=()):
    """Every path (tuple of keys / indices) into a JSON value."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:8]):
            yield from _paths(v, prefix + (i,))


def _set(obj, path, value, delete=False):
    if not path:
        return value
    parent = obj
    for key in path[:-1]:
        parent = parent[key]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return obj


class Text(bytes):
    def __repr__(self):
        return f"Text({len(self)} bytes: {bytes(self[:60])!r}...)"


@st.composite
def damaged_json(draw, base: dict, paths: list) -> bytes:
    doc = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths))
        try:
            if draw(st.booleans()) and path:
                doc = _set(doc, path, None, delete=True)
            else:
                doc = _set(doc, path, draw(_json))
        except (KeyError, IndexError, TypeError):  # an earlier edit removed or replaced this path
            pass
    text = json.dumps(doc, indent=1).encode()
    op = draw(st.sampled_from(["as is", "as is", "truncate", "bytes", "nest"]))
    if op == "truncate":
        text = text[:draw(st.integers(0, len(text)))]
    elif op == "bytes":
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.binary(min_size=1, max_size=6)) + text[at:]
    elif op == "nest":  # deep nesting: the stdlib parser recurses
        text = b"[" * draw(st.sampled_from([10, 1000, 100_000])) + text
    return Text(text)


def _check_manifest(case, text: bytes) -> str:
    (case / "manifest.json").write_bytes(text)
    try:
        with time_limit():
            m = read_manifest(case, verify=True)
            _ = (m.format, m.profile, m.model_path, m.weight_format, m.io, m.tensors)
            Tokenizer(m.tokenizer_spec())
    except ModelFileError as e:
        msg = str(e)
        assert str(case) in msg and ("re-export" in msg or "upgrade specedge" in msg or "specedge export" in msg), msg
        return "error"
    return "ok"


@pytest.mark.slow
@fuzz_settings(ci=1500)
@given(data=st.data())
def test_damaged_manifest_is_a_clean_error(artifact, data):
    root, base, case = artifact
    paths = list(_paths(base))
    _check_manifest(case, data.draw(damaged_json(base, paths)))


def test_the_base_manifest_loads(artifact):
    root, base, case = artifact
    assert _check_manifest(case, json.dumps(base).encode()) == "ok"


# ---- pinned cases the fuzzer found or the issue names -------------------------------------------------------------

@pytest.mark.parametrize("edit, match", [
    (lambda m: [], "JSON list, not an object"),
    (lambda m: {**m, "files": {"../../outside": m["files"]["model.onnx"]}}, "outside the artifact"),
    (lambda m: {**m, "files": {**m["files"], "/etc/passwd": m["files"]["model.onnx"]}}, "outside the artifact"),
    (lambda m: {**m, "files": {k: {"sha256": v["sha256"]} for k, v in m["files"].items()}}, "must be"),
    (lambda m: {**m, "config": {**m["config"], "n_layers": "2"}}, "positive integers"),
    (lambda m: {**m, "config": {**m["config"], "n_kv_heads": 0}}, "positive integers"),
    (lambda m: {**m, "config": {**m["config"], "rope_scaling": 7}}, "rope_scaling"),
    (lambda m: {**m, "config": {**m["config"], "rms_eps": float("nan")}}, "NaN is not a JSON number"),
    (lambda m: {k: v for k, v in m.items() if k != "files"}, "files must be"),
    (lambda m: {**m, "tokenizer": {**m["tokenizer"], "file": "nope.json"}}, "tokenizer.file"),
    (lambda m: {**m, "model": 3}, "model 3 must name"),
])
def test_manifest_schema_errors_name_the_problem(artifact, edit, match):
    root, base, case = artifact
    with pytest.raises(ModelFileError, match=match) as e:
        (case / "manifest.json").write_text(json.dumps(edit(json.loads(json.dumps(base)))))
        read_manifest(case)
    assert "re-export" in str(e.value)


def test_deeply_nested_manifest_is_not_a_recursion_error(artifact):
    root, base, case = artifact
    (case / "manifest.json").write_bytes(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(ModelFileError, match="not valid JSON.*re-export"):
        read_manifest(case)


@pytest.mark.parametrize("damage", ["delete", "flip", "truncate"])
def test_missing_or_changed_artifact_file(artifact, tmp_path, damage):
    root, base, _ = artifact
    case = tmp_path / "a"
    shutil.copytree(root, case)
    target = case / "tokenizer.json"
    if damage == "delete":
        target.unlink()
    elif damage == "flip":
        data = bytearray(target.read_bytes())
        data[10] ^= 0xFF
        target.write_bytes(bytes(data))
    else:
        target.write_bytes(target.read_bytes()[:-5])
    with pytest.raises(ModelFileError, match="tokenizer.json.*(missing|does not match).*re-export"):
        read_manifest(case)


def test_tokenizer_file_not_utf8_is_a_clean_error(artifact, tmp_path):
    root, base, _ = artifact
    case = tmp_path / "a"
    shutil.copytree(root, case)
    (case / "tokenizer.json").write_bytes(b"\xff\xfe" + (case / "tokenizer.json").read_bytes())
    m = json.loads((case / "manifest.json").read_text())
    m["files"]["tokenizer.json"] = {"sha256": sha256_file(case / "tokenizer.json"),
                                    "bytes": (case / "tokenizer.json").stat().st_size}
    (case / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ModelFileError, match="cannot read the tokenizer.*re-export"):
        read_manifest(case).tokenizer_spec()


# ---- tokenizer.json ----------------------------------------------------------------------------------------------

@pytest.mark.slow
@fuzz_settings(ci=800)
@given(data=st.data())
def test_damaged_tokenizer_json_is_a_clean_error(artifact, data):
    root, _, _ = artifact
    base = json.loads((root / "tokenizer.json").read_text())
    paths = [p for p in _paths(base) if len(p) <= 3]
    text = data.draw(damaged_json(base, paths)).decode("utf-8", errors="replace")
    spec = TokenizerSpec(hf_json=text, bos_id=0, eos_ids=(1,))
    try:
        with time_limit():
            tok = Tokenizer(spec)
            tok.decode(tok.encode("hello <|im_end|> world"))
    except ValueError as e:
        assert "re-export or re-download" in str(e), str(e)
