"""One onnxruntime thread pool per process (runtime/backends/ort_threads.py). The pool is process-wide and fixed once
created, so every case runs in a fresh interpreter: backends of several thread counts share it, logits equal those of
per-session pools bit for bit, a host session that keeps per-session threads is refused (the documented constraint)
and SPECEDGE_ORT_THREADPOOL=session lifts it; a bad value is an error that names the variable and the choices."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from specedge.models.gguf_in import open_gguf  # noqa: E402
from specedge.export.onnx_export import export_gguf_to_onnx  # noqa: E402
from specedge.export.onnx_linear import WeightFormat  # noqa: E402
from specedge.models.tiny import write_tiny_gguf  # noqa: E402
from specedge.runtime.backends import ort_threads  # noqa: E402

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import onnxruntime as ort
    from specedge.runtime.backends import ort_threads
    from specedge.runtime.backends.onnxrt import OnnxBackend
    art, out = sys.argv[1], sys.argv[2]
    notes = []
    a = OnnxBackend(art, threads=2)
    b = OnnxBackend(art, threads=1, log=notes.append)
    logits = []
    for be in (a, b):
        c = be.new_cache(32)
        logits.append(be.forward(np.array([3, 7, 11, 5], dtype=np.int32), c))
        logits.append(be.forward(np.array([9], dtype=np.int32), c))
    try:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        ort.InferenceSession(a.manifest.model_path.as_posix(), opts, providers=["CPUExecutionProvider"])
        host = "ok"
    except Exception as e:
        host = str(e)
    np.savez(out + ".npz", *logits)
    json.dump({"pool": ort_threads.pool_size(), "threads": [a.threads, b.threads], "notes": notes,
               "host": host}, open(out + ".json", "w"))
""")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    d = tmp_path_factory.mktemp("ort-threads")
    gguf = open_gguf(write_tiny_gguf(d / "m.gguf", arch="llama", n_layers=2, seed=5))
    return export_gguf_to_onnx(gguf, d / "onnx", WeightFormat.INT4, gate=False).parent


def _run(artifact, out: Path, mode: str | None):
    env = dict(os.environ)  # PYTHONPATH, if set, resolves specedge to the tree under test
    env.pop(ort_threads.ENV, None)
    if mode is not None:
        env[ort_threads.ENV] = mode
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(artifact), str(out)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    data = np.load(str(out) + ".npz")
    return json.loads(Path(str(out) + ".json").read_text()), [data[f"arr_{i}"] for i in range(len(data.files))]


def test_shared_pool_is_one_pool_and_changes_no_logit(artifact, tmp_path):
    shared, shared_logits = _run(artifact, tmp_path / "shared", None)  # the default
    per_session, session_logits = _run(artifact, tmp_path / "session", "session")
    assert shared["pool"] == 2 and shared["threads"] == [2, 2]  # the first session fixed the size
    assert any("one pool of 2 threads" in n for n in shared["notes"])  # the second one is told
    assert per_session["pool"] is None and per_session["threads"] == [2, 1]
    for x, y in zip(shared_logits, session_logits):
        np.testing.assert_array_equal(x, y)
    assert "use_per_session_threads must be false" in shared["host"]  # the constraint docs/onnx.md states
    assert per_session["host"] == "ok"


def test_bad_mode_names_the_variable_and_the_choices(monkeypatch):
    monkeypatch.setenv(ort_threads.ENV, "global")
    with pytest.raises(ValueError, match=r"SPECEDGE_ORT_THREADPOOL='global'.*shared, session"):
        ort_threads.mode()
