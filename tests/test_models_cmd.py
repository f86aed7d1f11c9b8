"""Artifacts as first-class models: the engine follows the model (engine_for; generate without --backend),
`specedge models` (catalogue, GGUF files, artifacts, plans, device profiles; --json) and `specedge rm` (a model and
the plans and profiles that reference it, nothing else; refuses paths outside the cache and unknown names), on a
temporary cache holding a tiny GGUF and its exported ONNX artifact."""
import json
import shutil

import pytest
from click.testing import CliRunner

pytest.importorskip("onnxruntime")

from specedge.apps.api import Engine  # noqa: E402
from specedge.apps.cli import cli  # noqa: E402
from specedge.assembly.load import engine_for, load_model  # noqa: E402
from specedge.models.catalog import CATALOG, model_cache_dir, resolve_model  # noqa: E402
from specedge.models.errors import ModelFileError  # noqa: E402
from specedge.models.inventory import scan  # noqa: E402
from specedge.models.tiny import write_tiny_gguf  # noqa: E402
from specedge.runtime.backends import BackendKind  # noqa: E402

ART = "tiny-onnx-fp32"
SMOL = CATALOG["smollm2-135m"]


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A cache with tiny.gguf (not a catalogue file) and its fp32 artifact exported into it by name (gated)."""
    d = tmp_path_factory.mktemp("cache-base")
    write_tiny_gguf(d / "tiny.gguf", seed=0)
    r = run("export", d / "tiny.gguf", "--format", "onnx", "--weights", "fp32", "--cache-dir", d, "--threads", 1)
    assert r.exit_code == 0, r.output
    assert (d / ART / "manifest.json").is_file()
    return d


def _write(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))


@pytest.fixture
def cache(base, tmp_path):
    """A copy of `base` with a fake pulled catalogue file, plans and profiles referencing each model, and a plan
    file that is not JSON."""
    c = tmp_path / "cache"
    shutil.copytree(base, c)
    (c / SMOL.filename).write_bytes(b"GGUF" + b"\0" * 60)
    (c / (SMOL.filename + ".sha256")).write_text("{}")
    art, gguf = c / ART, c / "tiny.gguf"
    plan = {"choice": {"drafter": "ngram", "k": 4}, "created": "2025-01-01 00:00:00"}
    _write(c / "plans" / "by-source.json", {**plan, "model": "something", "sources": [str(art)],
                                            "choice": {"summary": "onnx ngram k=4"}})
    _write(c / "plans" / "by-name.json", {**plan, "model": ART, "sources": []})
    _write(c / "plans" / "gguf.json", {**plan, "model": str(gguf), "sources": [str(gguf)]})
    _write(c / "plans" / "smol.json", {**plan, "model": "smollm2-135m", "sources": []})
    _write(c / "plans" / "broken.json", "{not json")
    _write(c / "profiles" / "art.json", {"model": str(art), "backend": "onnx", "created": "2025-01-02"})
    _write(c / "profiles" / "gguf.json", {"model": str(gguf), "backend": "llamacpp", "created": "2025-01-03"})
    return c


def _files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# -- the engine follows the model -----------------------------------------------------------------------------------

def test_engine_for_each_kind_of_name(cache, tmp_path):
    assert engine_for(str(cache / ART)) is BackendKind.ONNX
    assert engine_for(ART, cache) is BackendKind.ONNX
    assert engine_for("smollm2-135m", cache) is BackendKind.LLAMACPP
    assert engine_for(str(cache / "tiny.gguf")) is BackendKind.LLAMACPP
    assert engine_for("tiny.gguf", cache) is BackendKind.LLAMACPP
    assert resolve_model("tiny.gguf", cache) == cache / "tiny.gguf"  # a GGUF file name in the cache resolves
    hf = tmp_path / "SomeModel"
    _write(hf / "config.json", {"model_type": "llama"})
    with pytest.raises(ModelFileError, match="Hugging Face checkpoint: export it first with `specedge export"):
        engine_for(str(hf))
    with pytest.raises(ModelFileError, match="directory without manifest.json"):
        engine_for(str(tmp_path / "SomeModel" / ".."))
    with pytest.raises(ModelFileError, match=f"catalogue: smollm2-135m.*exported artifacts in .*: {ART}"):
        engine_for("no-such-model", cache)


def test_an_explicit_backend_is_honoured(cache):
    for name in (str(cache / ART), ART):
        with pytest.raises(ValueError, match="use --backend onnx, or leave --backend out"):
            load_model(name, BackendKind.LLAMACPP, cache_dir=cache)
    r = run("generate", ART, "hi", "--backend", "numpy", "--cache-dir", cache, "--max-tokens", 4)
    assert r.exit_code != 0 and "the numpy backend runs GGUF files" in r.output
    r = run("generate", cache / "tiny.gguf", "hi", "--backend", "numpy", "--max-tokens", 4, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["stats"]["backend"] == "numpy"


def test_generate_an_artifact_without_backend(cache):
    r = run("generate", ART, "hi", "--drafter", "ngram", "--cache-dir", cache, "--max-tokens", 8, "--threads", 1,
            "--json", "--baseline")
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout.strip().splitlines()[-1])["stats"]
    assert stats["backend"] == "onnx" and stats["identical_to_baseline"] is True
    assert "[onnx drafter=ngram" in r.stderr


def test_engine_follows_the_model(cache):
    engine = Engine.open(ART, drafter="ngram", cache_dir=cache, threads=1, device="cpu")
    assert engine.backend_kind == "onnx" and engine.decoder.model_settings.backend is BackendKind.ONNX
    assert engine.generate("the cat", max_tokens=4).tokens


@pytest.mark.real
def test_generate_the_real_int4_artifact_without_backend(monkeypatch):
    monkeypatch.delenv("SPECEDGE_CACHE", raising=False)
    if not (model_cache_dir() / "smollm2-135m-onnx-int4" / "manifest.json").is_file():
        pytest.skip("smollm2-135m-onnx-int4 is not exported into the shared cache (specedge export smollm2-135m "
                    "--weights int4)")
    r = run("generate", "smollm2-135m-onnx-int4", "hi", "--drafter", "ngram", "--max-tokens", 16, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["stats"]["backend"] == "onnx"


# -- specedge models ------------------------------------------------------------------------------------------------

def test_models_lists_every_section(cache):
    r = run("models", "--cache-dir", cache)
    assert r.exit_code == 0, r.output
    out = r.output
    for heading in ("catalogue", "GGUF files (not in the catalogue)", "exported artifacts", "plans",
                    "device profiles", "notes"):
        assert heading in out
    assert "Apache-2.0" in out and "qwen2.5-coder-1.5b" in out and "not pulled" in out
    gemma = next(ln for ln in out.splitlines() if ln.strip().startswith("gemma3-270m"))
    assert "Gemma Terms of Use (https://ai.google.dev/gemma/terms)" in gemma
    assert "  tiny.gguf " in out and SMOL.filename not in out.split("GGUF files")[1].split("exported")[0]
    line = next(ln for ln in out.splitlines() if ln.strip().startswith(ART))
    sha = json.loads((cache / ART / "manifest.json").read_text())["provenance"]["source_sha256"][:12]
    assert line.split()[1:3] == ["fp32", "dynamic"] and sha in line and line.endswith("passed")
    assert "onnx ngram k=4" in out and "(no summary)" in out and "2025-01-03" in out
    assert "broken.json" in out and "not readable JSON" in out


def test_models_json(cache):
    r = run("models", "--cache-dir", cache, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert set(doc) == {"cache", "catalogue", "gguf", "hf", "artifacts", "plans", "profiles", "leftovers", "notes",
                        "engines"}
    assert doc["leftovers"] == []
    assert doc["engines"]["numpy"] and "llama.cpp" in doc["engines"]  # name -> installed version (None: missing)
    assert {e["name"]: e["license"] for e in doc["catalogue"]} == {n: CATALOG[n].license for n in CATALOG}
    assert doc["catalogue"][0]["license"] == "Apache-2.0"
    assert [g["name"] for g in doc["gguf"]] == ["tiny.gguf"]
    (art,) = doc["artifacts"]
    assert art["name"] == ART and art["weights"] == "fp32" and art["profile"] == "dynamic" and art["parity"] == "passed"
    assert art["size"] == sum(p.stat().st_size for p in (cache / ART).iterdir())
    assert sorted(p["file"] for p in doc["plans"]) == ["by-name.json", "by-source.json", "gguf.json", "smol.json"]
    assert sorted(p["backend"] for p in doc["profiles"]) == ["llamacpp", "onnx"]
    assert len(doc["notes"]) == 1


def test_models_on_an_empty_cache(tmp_path):
    inv = scan(tmp_path / "absent")
    assert not inv.ggufs and not inv.artifacts and not inv.plans and not any(r.pulled for r in inv.catalogue)


# -- specedge rm ----------------------------------------------------------------------------------------------------

def test_rm_an_artifact_deletes_it_and_its_plans_and_profiles_only(cache):
    before = _files(cache)
    r = run("rm", ART, "--cache-dir", cache)
    assert r.exit_code == 0, r.output
    gone = {str(cache / ART), str(cache / "plans" / "by-source.json"), str(cache / "plans" / "by-name.json"),
            str(cache / "profiles" / "art.json")}
    assert set(r.stdout.replace("deleted ", "").split()) == gone
    assert _files(cache) == [f for f in before if not (str(cache / f) in gone or f.startswith(ART + "/"))]


def test_rm_by_path_inside_the_cache(cache):
    r = run("rm", cache / ART, "--cache-dir", cache)
    assert r.exit_code == 0, r.output
    assert not (cache / ART).exists() and not (cache / "plans" / "by-name.json").exists()


def test_rm_a_gguf_file_and_a_catalogue_model(cache):
    r = run("rm", "tiny.gguf", "--cache-dir", cache)
    assert r.exit_code == 0, r.output
    assert not (cache / "tiny.gguf").exists() and not (cache / "plans" / "gguf.json").exists()
    assert not (cache / "profiles" / "gguf.json").exists() and (cache / ART / "manifest.json").is_file()
    r = run("rm", "smollm2-135m", "--cache-dir", cache)
    assert r.exit_code == 0, r.output
    assert r.stdout.count("deleted ") == 3  # the GGUF, its .sha256 sidecar, the plan naming it
    assert not (cache / SMOL.filename).exists() and not (cache / "plans" / "smol.json").exists()
    assert (cache / "plans" / "by-source.json").exists() and (cache / "plans" / "broken.json").exists()


def test_rm_dry_run_deletes_nothing(cache):
    before = _files(cache)
    r = run("rm", ART, "--cache-dir", cache, "--dry-run")
    assert r.exit_code == 0, r.output
    assert r.stdout.count("would delete ") == 4 and str(cache / ART) in r.stdout
    assert _files(cache) == before


def test_rm_refuses_outside_paths_and_unknown_names(cache, tmp_path):
    outside = tmp_path / "elsewhere.gguf"
    outside.write_bytes(b"GGUF")
    before = _files(cache)
    for name in (outside, cache / ART / "model.onnx", cache / ".." / "elsewhere.gguf"):
        r = run("rm", name, "--cache-dir", cache)
        assert r.exit_code != 0 and "is not in the model cache" in r.output, r.output
    r = run("rm", "no-such-model", "--cache-dir", cache)
    assert r.exit_code != 0 and "not a cached model" in r.output
    assert f"cached: smollm2-135m, tiny.gguf, {ART}" in r.output
    assert outside.exists() and _files(cache) == before
