"""The benchmark scripts run end to end on tiny models (their numbers are meaningless here; the real runs are in the
README and docs/onnx.md)."""
import ctypes
import json

import numpy as np
import pytest

from specedge.models.gguf_in import open_gguf
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


def test_verify_cost_roof_is_measured_each_round_and_reported_per_target(tmp_path, capsys):
    """--roof: one roof reading a round (the best of its reads), and each target's T(1) bandwidth as a share of
    their median, in the table and the json."""
    from specedge.runtime.backends import native_lib
    if native_lib.available() is not None:
        pytest.skip(f"the native engine is not built: {native_lib.available()}")
    path = write_tiny_gguf(tmp_path / "m.gguf", dtype="q8_0", seed=1)
    out = tmp_path / "cost.json"
    verify_cost.main(["--targets", f"native:{path}", "--ctx", "16", "--reps", "2", "--widths", "1", "2",
                      "--decode", "4", "--rounds", "3", "--threads", "1", "--roof", "--out", str(out)])
    got = json.loads(out.read_text())
    roofs, (row,) = got["roof_gb_s"], got["rows"]
    assert len(roofs) == 3 and all(g > 0 for g in roofs)
    assert [r["roof_gb_s"] for r in got["by_round"]] == roofs  # each round: its roof and the target's own times
    assert all(r["round_trip_ns"] > 0 for r in got["by_round"])  # and how far apart the cores were
    assert all(set(r[f"native:{path}"]["ms"]) == {"1", "2"} and r[f"native:{path}"]["tok_s"] > 0
               for r in got["by_round"])
    assert row["roof_pct_at_t1"] == pytest.approx(100 * row["gb_s_at_t1"] / float(np.median(roofs)))
    text = capsys.readouterr().out
    assert "roof" in text and "% of roof |" in text and f"{row['roof_pct_at_t1']:.0f}% |" in text


def test_verify_cost_isa_runs_the_native_engine_on_a_lesser_instruction_set(tmp_path, capsys):
    """--isa portable: the native engine's kernels switch for the run (and the run says so); an ISA this CPU does not
    run is refused with the ones it does."""
    from specedge.runtime.backends import native_lib
    if native_lib.available() is not None:
        pytest.skip(f"the native engine is not built: {native_lib.available()}")
    lib = native_lib.load()
    path = write_tiny_gguf(tmp_path / "m.gguf", dtype="q8_0", seed=1)
    try:
        verify_cost.main(["--targets", f"native:{path}", "--ctx", "16", "--reps", "1", "--widths", "1", "2",
                          "--decode", "2", "--rounds", "1", "--threads", "1", "--isa", "portable"])
        assert lib.se_isa() == 0 and "native isa=portable" in capsys.readouterr().out
        other = "avx2" if native_lib.isa_name(lib.se_cpu_isa()) == "neon" else "neon"
        with pytest.raises(SystemExit, match=f"--isa {other}: this CPU does not run it; it runs portable"):
            verify_cost.main(["--targets", f"native:{path}", "--isa", other])
    finally:
        lib.se_set_isa(lib.se_cpu_isa())


def test_prompt_rate_prefills_every_target(tmp_path, capsys):
    from specedge.perf import prompt_rate
    path = write_tiny_gguf(tmp_path / "m.gguf", dtype="q8_0", seed=1)
    prompt_rate.main(["--targets", f"native:{path}", f"numpy:{path}", "--tokens", "40", "--rounds", "2",
                      "--threads", "1"])
    out = capsys.readouterr().out
    assert f"| native:{path} |" in out and f"| numpy:{path} |" in out and "1.00x |" in out


def test_heap_tree_mask():
    # parents: 1, 2 -> 0; 3, 4 -> 1
    expect = np.array([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 0, 1]], bool)
    np.testing.assert_array_equal(verify_cost.heap_tree_mask(5, 2), expect)


def test_tree_parity_counts_path_nodes_and_flips(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    from specedge.export.onnx_export import export_gguf_to_onnx
    from specedge.export.onnx_linear import WeightFormat
    from specedge.perf import tree_parity
    from specedge.runtime.backends.onnxrt import OnnxBackend

    export_gguf_to_onnx(open_gguf(write_tiny_gguf(tmp_path / "m.gguf", seed=2)), tmp_path / "fp32",
                        WeightFormat.FP32, gate=False)
    backend = OnnxBackend(tmp_path / "fp32", threads=1)
    prompts = [np.arange(3, 12, dtype=np.int32), np.arange(40, 47, dtype=np.int32)]
    r = tree_parity.measure(backend, prompts, tokens=10, depth=3, fanout=2)
    assert r["nodes"] == 2 * len(range(0, 10 - 3, 4)) * 4  # prompts x tree starts x (depth + 1) path nodes
    assert r["argmax_flips"] == 0 and 0 < r["max_abs_dlogit"] < 1e-4  # fp32: rounding only, but not bit-identical
    tree_parity.main(["--target", f"onnx:{tmp_path / 'fp32'}", "--limit", "2", "--tokens", "8", "--depth", "2"])
    assert "argmax flips vs chain 0" in capsys.readouterr().out


def test_parity_compare_all_evaluates_the_reference_once_per_prompt_for_every_backend(tiny_backends):
    """perf/parity.compare_all (test_real_parity's one pass for both llama.cpp comparisons): each backend's counts
    are the ones computed directly from the two backends' logits, and the reference runs once per prompt."""
    from specedge.perf.parity import compare_all
    target, draft, _ = tiny_backends
    prompts = [np.arange(1, 9, dtype=np.int32), np.arange(5, 25, dtype=np.int32)]
    calls = []

    class Counted:  # the reference, counting its forward calls
        def new_cache(self, n):
            return target.new_cache(n)

        def forward(self, ids, cache):
            calls.append(len(ids))
            return target.forward(ids, cache)

    got = compare_all(Counted(), {"self": target, "draft": draft}, prompts)
    assert calls == [8, 20]
    assert got["self"].positions == 28 and got["self"].agree == 28 and got["self"].max_abs_diff == 0.0
    want = [target.forward(p, target.new_cache(len(p))) for p in prompts]
    other = [draft.forward(p, draft.new_cache(len(p))) for p in prompts]
    agree = sum(int((w.argmax(-1) == o.argmax(-1)).sum()) for w, o in zip(want, other))
    assert got["draft"].positions == 28 and got["draft"].agree == agree < 28
    assert got["draft"].max_abs_diff == max(float(np.abs(w - o).max()) for w, o in zip(want, other))


def test_native_ab_times_two_builds_in_one_process(tmp_path, capsys, monkeypatch):
    """An A/A run of the built library (two copies: two loaded libraries, two pools) through every width."""
    import shutil

    from specedge.perf import native_ab
    from specedge.runtime.backends import native_lib as nl
    lib = nl.library_path()
    monkeypatch.setenv("SPECEDGE_NATIVE_LIB", lib)  # restored afterwards: native_ab points it at each build
    old, new = tmp_path / "old.so", tmp_path / "new.so"
    shutil.copy(lib, old)
    shutil.copy(lib, new)
    path = write_tiny_gguf(tmp_path / "m.gguf", dtype="q4_1", seed=1)
    native_ab.main([str(path), str(old), str(new), "--widths", "1", "3", "--ctx", "16", "--rounds", "2",
                    "--calls", "2", "--swap", "--roof", "--split", "1e9"])
    nl.load.cache_clear()
    out = capsys.readouterr().out
    assert "loaded new first" in out and "old: T(3)/T(1)" in out and "new: T(3)/T(1)" in out
    # --roof: both rounds read below a split no roof reaches, none above
    assert "roof below 1e+09 GB/s: 2 rounds" in out and "roof at or above 1e+09 GB/s: no rounds" in out
    assert "GB/s, round trip " in out  # each round's core-to-core round trip, read with its roof
    assert "cores near (round trip < 200 ns)" in out and "cores far (round trip >= 200 ns)" in out  # and split by it
    rows = [line.split("|") for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [int(r[0]) for r in rows] == [1, 3] and all(float(r[3]) > 0 for r in rows)


def test_native_kernels_reports_both_roofs_and_the_dot_roof_counts_its_instructions(tmp_path, capsys):
    """perf.native_kernels: the memory roof and the compute roof in the same run, each row count's share of both;
    se_dot_roof returns exactly the multiply-adds its ISA's chains do (8 chains x 4096 a item: 64 a vpdpbusd, 32 an
    AVX2 maddubs/madd step, 1 in portable C), whichever the machine runs."""
    from specedge.perf import native_kernels
    from specedge.runtime.backends import native_lib
    if native_lib.available() is not None:
        pytest.skip(f"the native engine is not built: {native_lib.available()}")
    lib = native_lib.load()
    pool = lib.se_pool_new(2)
    try:
        dots, before = native_kernels.DotRoof(pool, items=3, reads=1), lib.se_isa()
        width = {"portable": 1, "avx2": 32, "avx512": 64}
        for isa in width:
            if lib.se_set_isa(native_lib.ISA_NAMES.index(isa)) != native_lib.ISA_NAMES.index(isa):
                continue  # not this CPU's
            assert dots.fn(pool, 3, ctypes.byref(dots.check)) == 3 * 8 * 4096 * width[isa], isa
            assert dots.measure() > 0
        lib.se_set_isa(before)
    finally:
        lib.se_pool_free(pool)
    path = write_tiny_gguf(tmp_path / "m.gguf", dtype="q8_0", seed=1)
    native_kernels.main([str(path), "--rows", "1", "3", "--rounds", "2", "--threads", "2"])
    text = capsys.readouterr().out
    assert "compute roof" in text and "G multiply-adds/s" in text and "% of compute roof" in text
    assert "core-to-core round trip" in text
    trip = native_lib.optional_fn("se_round_trip_ns", ctypes.c_double, [ctypes.c_long])
    assert trip(200) > 0 and trip(0) == -1.0
    lines = [ln for ln in text.splitlines() if ln.strip().startswith(("1 |", "3 |"))]
    assert len(lines) == 2 and all(ln.rstrip().endswith("%") for ln in lines)


def test_head_replay_visits_the_roots_a_decode_starts_its_chains_at():
    """A decode drafts from a root, verifies, and starts the next chain after the accepted drafts and the verify's
    own token: root r, then r + run[r] + 1."""
    from specedge.perf.head_replay import decode_roots
    run = np.array([2, 0, 4, 1, 0, 0, 3, 1, 2])  # accepted drafts from each root
    np.testing.assert_array_equal(decode_roots(run), [2, 1, 0, 3])  # roots 0, 3, 5, 6 (then 10: past the end)
    assert len(decode_roots(np.zeros(5, np.int64))) == 5 and len(decode_roots(np.array([], np.int64))) == 0


def test_sampling_cost_times_every_setting_warm_and_after_a_stream(tmp_path, capsys):
    from specedge.perf import sampling_cost

    out = tmp_path / "rows.json"
    sampling_cost.main(["--vocab", "500", "--rows", "2", "--calls", "3", "--stream-mb", "1", "--out", str(out)])
    recs = json.loads(out.read_text())["rows"]
    assert [r["settings"] for r in recs] == list(sampling_cost.SETTINGS)
    assert all(r["vocab"] == 500 and r["warm_ms"] > 0 and r["after_stream_ms"] > 0 for r in recs)
    assert "| 500 | chat defaults |" in capsys.readouterr().out
    x, history = sampling_cost.rows_of(500, 2)
    assert x.shape == (2, 500) and np.array_equal(history[200:260], history[100:160])
