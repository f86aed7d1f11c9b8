"""Golden greedy outputs: every drafter configuration of every backend, re-decoded token for token against the files
recorded by perf/golden.py (tests/golden/<backend>.json) before issue 17 reassembled the decoders.

SPECEDGE_GOLDEN_PROMPTS=N compares the first N recorded prompts (default 3; 1 for the slow NumPy reference); `all`
compares every recorded one.
The recorded inputs are checked first (catalogue SHA-256, prompt ids, ONNX artifact files), so a mismatch says
whether the inputs or the decoder changed. ONNX artifacts come from the model cache when their files match the
recorded hashes, else they are exported into a temporary directory (15-25 s each) and must match them.
"""
import json
import os
from contextlib import nullcontext
from pathlib import Path

import pytest

from specedge.models.catalog import CATALOG, model_cache_dir
from specedge.perf import golden
from specedge.runtime.backends.blas import every_core

pytestmark = [pytest.mark.real, pytest.mark.slow]
GOLDEN = Path(__file__).resolve().parent / "golden"
DEPENDS = {"onnx": "onnxruntime", "llamacpp": "llama_cpp"}  # importorskip, as the other real tests do
# ONNX Runtime's int4/int8 kernels differ by CPU features (perf/golden.py kernel_signature): its recording is the
# one made on a CPU of this one's signature; where none was made, its cases are skipped saying so
DATA = {b: json.loads(golden.golden_file(b, GOLDEN).read_text()) for b in golden.PLAN
        if golden.golden_file(b, GOLDEN).is_file()}
UNRECORDED = sorted(b for b in golden.PLAN if not golden.golden_file(b, GOLDEN).is_file())
CASES = [pytest.param(b, key, id=f"{b}-{key.replace('{golden}/', '')}") for b, d in DATA.items()
         for key in d["configs"]]
_MODELS: dict = {}  # (backend, target) -> LoadedModel, shared by the configurations
_ARTIFACTS: dict = {}  # artifact name -> directory whose files match the recorded hashes


# The NumPy reference is slow on SmolLM2 (numpy.json's own "seconds": ~1000 s for its 6 prompts over 15
# configurations, 2 cores), so each of its configurations compares one recorded prompt (64 tokens: tens of
# draft/verify/rollback rounds) unless SPECEDGE_GOLDEN_PROMPTS asks for more.
DEFAULT_PROMPTS = {"numpy": 1}


def n_prompts(recorded: int, backend: str) -> int:
    text = os.environ.get("SPECEDGE_GOLDEN_PROMPTS", str(DEFAULT_PROMPTS.get(backend, 3)))
    return recorded if text == "all" else min(int(text), recorded)


def artifact(target, recorded: dict, tmp_path_factory) -> Path:
    if target.name not in _ARTIFACTS:
        cached = model_cache_dir() / target.name
        if (cached / "manifest.json").is_file() and golden.artifact_files(cached) == recorded:
            _ARTIFACTS[target.name] = cached
        else:
            out = golden.export_artifact(target, tmp_path_factory.mktemp("golden-onnx") / target.name)
            assert golden.artifact_files(out) == recorded, (
                f"exporting {target.name} gives other files than the golden outputs were recorded on: the exporter "
                "changed; re-record with perf/golden.py")
            _ARTIFACTS[target.name] = out
    return _ARTIFACTS[target.name]


def loaded(backend: str, target, data: dict, tmp_path_factory):
    if (backend, target.name) not in _MODELS:
        path = None
        if backend == "onnx":
            path = artifact(target, data["targets"][target.name]["files"], tmp_path_factory)
        _MODELS[backend, target.name] = golden.load_target(backend, target, threads=data["threads"],
                                                           artifact_dir=path)
    return _MODELS[backend, target.name]


def test_every_backend_and_planned_configuration_is_recorded():
    recorded = {p.name for p in GOLDEN.glob("*.json")}
    assert all(f"{b}.json" in recorded for b in golden.PLAN)  # every backend, on the first recording's CPU
    for backend, data in DATA.items():
        planned = {golden.config_key(backend, t, c) for t in golden.PLAN[backend] for c in t.configs}
        assert planned == set(data["configs"]) | set(data["refused"]), backend
        assert all(len(seqs) == data["prompts"] for seqs in data["configs"].values()), backend
    if UNRECORDED:
        pytest.skip(f"no golden recording of {UNRECORDED} for this CPU's kernels ({golden.kernel_signature()}): "
                    "record one with `python -m specedge.perf.golden --out tests/golden --backend "
                    f"{' '.join(UNRECORDED)}` on the commit the recordings were made with")


def test_recorded_lossless_configurations_equal_plain():
    for backend, data in DATA.items():
        differ = [k for k, same in data["equals_plain"].items() if not same and not k.startswith("lossy:")]
        assert not differ, f"{backend}: recorded outputs differ from plain decoding: {differ}"


@pytest.mark.parametrize("backend,key", CASES)
def test_golden_output(backend, key, tmp_path_factory):
    if backend in DEPENDS:
        pytest.importorskip(DEPENDS[backend])
    data = DATA[backend]
    assert (data["model_file"], data["model_sha256"]) == (CATALOG[data["model"]].filename,
                                                          CATALOG[data["model"]].sha256), "the catalogue model changed"
    target, config = golden.split_key(backend, key)
    model = loaded(backend, target, data, tmp_path_factory)
    n = n_prompts(data["prompts"], backend)
    qids, prompts = golden.golden_prompts(model.model.tokenizer, n)
    assert qids == data["prompt_qids"][:n], "the benchmark's prompt selection changed"
    assert golden.ids_sha256(prompts) == data["prompt_ids_sha256"][:n], "the prompts' token ids changed (tokenizer, " \
        "chat template or dev set)"
    with every_core() if backend == "numpy" else nullcontext():  # the reference's matmuls: see conftest
        got = golden.decode_config(backend, model, config, prompts, data["tokens"], golden_dir=GOLDEN,
                                   threads=data["threads"], artifacts=_ARTIFACTS)
    diffs = []
    for i, (new, old) in enumerate(zip(got, data["configs"][key])):
        if new != old:
            at = next((j for j, (a, b) in enumerate(zip(new, old)) if a != b), min(len(new), len(old)))
            diffs.append(f"prompt {i} (qid {qids[i]}) from token {at}: {new[at:at + 8]} vs golden {old[at:at + 8]}")
    assert not diffs, f"{backend} {key}: output differs from the golden recording:\n" + "\n".join(diffs)
