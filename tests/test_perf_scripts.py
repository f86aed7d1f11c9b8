"""The benchmark scripts run end to end on tiny models (their numbers are meaningless here; the real runs are in the
README and docs/onnx.md)."""
import json

import numpy as np
import pytest

from specedge.export.gguf_in import open_gguf
from specedge.models.tiny import write_tiny_gguf
from specedge.perf import verify_cost


@pytest.mark.parametrize("clock, tree", [("wall", None), ("thread", 2)])  # chains; trees of fan-out 2
def test_verify_cost_measures_every_target_and_width(tmp_path, capsys, clock, tree):
    ort = pytest.importorskip("onnxruntime")  # noqa: F841
    from specedge.export.onnx_export import export_gguf_to_onnx
    from specedge.export.onnx_linear import WeightFormat

    path = write_tiny_gguf(tmp_path / "m.gguf", dtype="q4_1", seed=1)
    export_gguf_to_onnx(open_gguf(path), tmp_path / "int4", WeightFormat.INT4, gate=False)
    out = tmp_path / "cost.json"
    verify_cost.main(["--targets", f"numpy:{path}", f"onnx:{tmp_path / 'int4'}", "--ctx", "16", "--reps", "2",
                      "--widths", "1", "2", "4", "--decode", "4", "--rounds", "1", "--out", str(out),
                      "--clock", clock, "--threads", "1"] + ([] if tree is None else ["--tree", str(tree)]))
    rows = json.loads(out.read_text())["rows"]
    assert [r["target"] for r in rows] == [f"numpy:{path}", f"onnx:{tmp_path / 'int4'}"]
    for r in rows:
        assert set(r["ms"]) == {"1", "2", "4"} and all(v > 0 for v in r["ms"].values())
        assert r["tok_s"] > 0 and r["weight_mb"] > 0
    assert "| onnx:" in capsys.readouterr().out


def test_heap_tree_mask():
    # parents: 1, 2 -> 0; 3, 4 -> 1
    expect = np.array([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 0, 1]], bool)
    np.testing.assert_array_equal(verify_cost.heap_tree_mask(5, 2), expect)
