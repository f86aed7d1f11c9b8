"""`specedge bench`: metric computations on known inputs, the results schema, and an end-to-end run on tiny models
(NumPy, ONNX and llama.cpp backends; the numbers are meaningless here, the files and their structure are not)."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from specedge.apps.cli import cli
from specedge.models.tiny import write_tiny_gguf
from specedge.perf import bench
from specedge.perf.bench_report import RESULTS_SCHEMA, SCHEMA_VERSION, check_schema
from specedge.assembly.devset import Prompt
from specedge.runtime.stats import DecodeStats
from specedge.runtime.types import StepStats


def assert_valid_results(results: dict) -> None:
    """results.json passes our checker and, independently, a JSON Schema validator (jsonschema: the dev extra)."""
    import jsonschema
    assert check_schema(results) == []
    jsonschema.validate(results, RESULTS_SCHEMA)


def stats_of(rounds, *, decode_s=1.0, generated=None, draft_s=0.0, forward_s=0.0):
    s = DecodeStats()
    for k, n in rounds:
        s.record(StepStats(k=k, n_accepted=n))
    s.decode_s, s.draft_s, s.forward_s = decode_s, draft_s, forward_s
    s.n_generated = s.n_emitted if generated is None else generated
    return s


def test_trials_summary():
    assert bench.trials_summary([1, 2, 6]) == {"mean": 3.0, "median": 2.0, "min": 1.0, "max": 6.0, "n": 3}
    assert bench.trials_summary([4, 1])["median"] == 2.5
    with pytest.raises(ValueError, match="at least one trial"):
        bench.trials_summary([])


def test_accepted_length_histogram_and_positions():
    s = stats_of([(4, 4), (4, 1), (2, 0)])  # the DecodeStats docstring example
    assert s.mean_accepted_length == pytest.approx(8 / 3)
    assert s.accepted_hist.tolist() == [1, 1, 0, 0, 1]
    np.testing.assert_allclose(s.acceptance_by_position, [2 / 3, 1 / 3, 1 / 2, 1 / 2])


def test_mbsu_and_bytes_per_token():
    s = stats_of([(3, 3), (3, 1)])  # tau (4 + 2) / 2 = 3; 3 drafted tokens per round
    assert bench.mbsu_of(s, target_bytes=300, draft_bytes_per_token=10) == pytest.approx(3 / (1 + 30 / 300))
    assert bench.mbsu_of(s, target_bytes=300, draft_bytes_per_token=0) == pytest.approx(3.0)  # n-gram
    assert bench.mbsu_of(DecodeStats(), 300, 10) == 0.0
    # 2 forwards x 300 B + 6 drafted x 10 B over 6 tokens
    assert bench.bytes_per_token(s, 300, 10) == pytest.approx((600 + 60) / 6)
    assert bench.bytes_per_token(stats_of([(0, 0)] * 5), 100, 0) == pytest.approx(100)  # plain: B_target per token


def test_time_split():
    ts = bench.time_split(stats_of([(2, 1)], decode_s=2.0, draft_s=0.5, forward_s=1.0))
    assert (ts["draft_s"], ts["verify_s"], ts["overhead_s"]) == (0.5, 1.0, 0.5)
    assert ts["draft_frac"] + ts["verify_frac"] + ts["overhead_frac"] == pytest.approx(1.0)


def _fixed(tokens, rounds, decode_s):
    return lambda p: (tokens[p.qid], stats_of(rounds, decode_s=decode_s))


def test_summarize_speedups_identity_and_schema():
    prompts = [Prompt(0, "summarization", "a"), Prompt(1, "translation", "b")]
    outs = {0: [1, 2], 1: [3]}
    plain = bench.Config("numpy", "none", 0, False, _fixed(outs, [(0, 0)] * 4, 2.0), target_bytes=100)
    spec = bench.Config("numpy", "ngram", 2, False,
                        _fixed({0: [1, 2], 1: [4]}, [(2, 2), (2, 1)], 1.0), target_bytes=100)
    measured = bench.run_bench([plain, spec], prompts, trials=2, warmup=1)
    rows = bench.summarize(measured)
    assert [r["label"] for r in rows] == ["numpy plain", "numpy ngram k=2"]
    assert rows[0]["tokens_per_s"]["mean"] == pytest.approx(2.0)  # 2 x 4 tokens in 2 x 2 s per trial
    assert rows[1]["tokens_per_s"] == {"mean": 5.0, "median": 5.0, "min": 5.0, "max": 5.0, "n": 2}
    assert rows[1]["speedup_vs_plain"] == pytest.approx(2.5) and rows[1]["speedup_vs_llamacpp"] is None
    assert rows[1]["mean_accepted_length"] == pytest.approx(2.5) and rows[1]["identical_to_plain"] == 1
    assert rows[1]["by_category"]["summarization"]["speedup_vs_plain"] == pytest.approx(2.5)
    assert rows[1]["accepted_hist"] == [0, 4, 4]  # 2 prompts x 2 trials x one round each of 1 and 2 accepted
    results = {"schema_version": SCHEMA_VERSION, "command": "specedge bench x",
               "categories": ["summarization", "translation"],
               "environment": {"packages": {}, "threads": 1, "cpu_model": "x", "cpu_flags": [], "git_commit": None},
               "settings": {}, "prompts": [{"qid": 0, "category": "summarization"}], "configs": rows}
    assert check_schema(json.loads(json.dumps(results))) == []
    broken = json.loads(json.dumps(results))
    del broken["configs"][1]["mbsu"]
    broken["configs"][0]["k"] = "two"
    errors = check_schema(broken)
    assert any("missing 'mbsu'" in e for e in errors) and any("configs[0].k" in e for e in errors)


def test_the_plan_row_is_compared_with_its_engine_s_plain_row():
    """bench --plan labels the chosen configuration `plan: <engine>:<path>`: its speedup and identity are against
    that engine's plain row."""
    prompts = [Prompt(0, "summarization", "a")]
    plain = bench.Config("onnx:/m/int4", "none", 0, False, _fixed({0: [1, 2]}, [(0, 0)] * 4, 2.0), target_bytes=100)
    chosen = bench.Config(f"{bench.PLAN_PREFIX}onnx:/m/int4", "ngram", 4, True,
                          _fixed({0: [1, 2]}, [(2, 2), (2, 1)], 1.0), target_bytes=100)
    rows = bench.summarize(bench.run_bench([plain, chosen], prompts, trials=1, warmup=0))
    assert rows[1]["speedup_vs_plain"] == pytest.approx(2.5) and rows[1]["identical_to_plain"] == 1


def test_timed_configurations_on_another_target_start_after_a_settling_pause(monkeypatch):
    """An engine that ran last may still spin its threads (ONNX Runtime's pool does): run_bench pauses SETTLE_S,
    untimed, wherever the next configuration is on another target, and not between a target's own configurations."""
    log = []
    monkeypatch.setattr(bench.time, "sleep", lambda s: log.append(("sleep", s)))

    def runner(name):
        def run(p):
            log.append(name)
            return [1], DecodeStats(n_generated=1, decode_s=0.1)
        return run
    configs = [bench.Config(t, d, 0, False, runner(f"{t} {d}"), target_bytes=1)
               for t, d in (("onnx:/m", "none"), ("onnx:/m", "ngram"), ("native:/m", "none"))]
    bench.run_bench(configs, [Prompt(0, "qa", "a"), Prompt(1, "qa", "b")], trials=1, warmup=1)
    pause = ("sleep", bench.SETTLE_S)
    assert log[3:] == [pause, "onnx:/m none", "onnx:/m ngram", pause, "native:/m none"] * 2  # after the warm-up


def test_bench_plan_runs_plain_on_every_engine_the_plan_measured_even_on_one_file():
    """llama.cpp and ik_llama.cpp plan the same GGUF: both plain rows run, so the plan's ik row has its baseline
    (a per-path dedup once dropped ik's, leaving the chosen row without a speedup or identity check)."""
    from specedge.apps.bench_cmd import plain_targets
    from specedge.assembly.plan import PLAIN, Plan, PlanRow
    rows = [PlanRow("llama.cpp q4_k_m", "llamacpp", "/m/g.gguf", PLAIN, 0, False, 70.0, 70.0),
            PlanRow("ik_llama.cpp q4_k_m", "ik", "/m/g.gguf", PLAIN, 0, False, 69.0, 69.0),
            PlanRow("ik_llama.cpp q4_k_m", "ik", "/m/g.gguf", "ngram", 6, False, 120.0, None),
            PlanRow("onnx int4", "onnx", "/m/g-onnx-int4", PLAIN, 0, False, 60.0, 60.0)]
    plan = Plan("key", "gemma3-270m", ["/m/g.gguf"], rows, chosen=2, reference=0, threads=2)
    assert plain_targets(plan) == ["llamacpp:/m/g.gguf", "ik:/m/g.gguf", "onnx:/m/g-onnx-int4"]


def test_read_prompts_text_and_categories(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("first prompt\n\nsecond prompt\nthird\n")
    ps = bench.read_prompts(f, limit=2)
    assert [p.text for p in ps] == ["first prompt", "second prompt"] and {p.category for p in ps} == {"text"}
    ps = bench.read_prompts(limit=4, categories=["translation", "mt_bench"])
    assert len(ps) == 4 and {p.task for p in ps} == {"translation", "mt_bench"}
    with pytest.raises(ValueError, match="no prompt has a category"):
        bench.read_prompts(limit=4, categories=["nope"])


def test_bench_end_to_end_writes_the_reports(tmp_path):
    """2 prompts x 8 tokens on a tiny GGUF (NumPy and, where installed, ONNX and the llama.cpp baselines)."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf", seed=0)
    targets, extra = ["numpy"], ["--no-baselines"]
    try:
        import onnxruntime  # noqa: F401
        from specedge.models.gguf_in import open_gguf
        from specedge.export.onnx_export import export_gguf_to_onnx
        from specedge.export.onnx_linear import WeightFormat
        export_gguf_to_onnx(open_gguf(path), tmp_path / "onnx", WeightFormat.FP32, gate=False)
        targets.append(f"onnx:{tmp_path / 'onnx'}")
    except ImportError:
        pass
    try:
        import llama_cpp  # noqa: F401
        extra = []
    except ImportError:
        pass
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the cat sat on the mat\nhello world hello world\n")
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["bench", str(path), "--targets", ",".join(targets), "--drafters", "ngram",
                                 "--k", "2", "--prompts", str(prompts), "--max-tokens", "8", "--warmup", "1",
                                 "--trials", "2", "--threads", "1", "--ctx", "256", "--out", str(out), *extra],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    results = json.loads((out / "results.json").read_text())
    assert_valid_results(results)
    labels = [c["label"] for c in results["configs"]]
    assert labels[:2] == ["numpy plain", "numpy ngram k=2"]
    if not extra:
        assert labels[-2:] == ["llama.cpp plain", "llama.cpp prompt-lookup k=2"]
        assert results["configs"][0]["speedup_vs_llamacpp"] > 0
    for c in results["configs"]:
        assert c["n_prompts"] == 2 and c["tokens_per_s"]["n"] == 2 and c["tokens_per_s"]["min"] > 0
        if c["family"] == "specedge":
            assert c["identical_to_plain"] == 2  # greedy speculative decoding is lossless
            assert c["mbsu"] >= 1.0 and c["weight_bytes_per_token"] > 0
    assert results["environment"]["threads"] == 1 and results["command"].startswith("specedge bench")
    report = (out / "report.md").read_text()
    assert "numpy ngram k=2" in report and "by category" in report
    from specedge.runtime.backends import native_lib
    trip = results["environment"]["core_round_trip_ns"]  # the run's placement, read where the native engine is built
    assert (trip is None) == (native_lib.available() is not None)
    assert trip is None or (trip > 0 and f"cores {trip:.0f} ns apart" in report)
    try:
        import matplotlib  # noqa: F401
        assert sorted(p.name for p in out.glob("*.png")) == ["acceptance_by_position.png", "mbsu_vs_speedup.png",
                                                             "speedup_by_category.png"]
    except ImportError:
        assert "matplotlib is not installed" in report


def test_llama_baselines_take_prompts_longer_than_a_batch(tmp_path):
    """Prompt lookup's logits_all buffer: a prompt over llama-cpp-python's default n_batch (512) must not fail."""
    pytest.importorskip("llama_cpp")
    from specedge.models.gguf_in import open_gguf
    from specedge.perf.bench_llama import llama_configs
    from specedge.runtime.tokenizer import Tokenizer

    path = write_tiny_gguf(tmp_path / "tiny.gguf", seed=0, context=1024)
    tok = Tokenizer(open_gguf(path).tokenizer_spec())
    prompt = Prompt(0, "text", "the cat sat " * 120)
    assert len(tok.chat_ids(prompt.text)) > 600
    configs = llama_configs(path, tok, ks=[2], max_tokens=4, threads=1, ctx=1024)
    outs = [c.run(prompt) for c in configs]
    assert [c.label for c in configs] == ["llama.cpp plain", "llama.cpp prompt-lookup k=2"]
    assert all(s.n_generated >= 1 for _, s in outs) and outs[0][0] == outs[1][0]  # greedy either way


def test_drafters_qualified_by_backend_apply_to_that_backend_only():
    from specedge.perf.bench import drafter_for
    from specedge.runtime.backends import BackendKind
    assert drafter_for("ngram", BackendKind.ONNX) == "ngram"
    assert drafter_for("model:q-0.5b@llamacpp", BackendKind.LLAMACPP) == "model:q-0.5b"
    assert drafter_for("model:q-0.5b@llamacpp", BackendKind.ONNX) is None
    assert drafter_for("model:/a/b@onnx", BackendKind.ONNX) == "model:/a/b"
    assert drafter_for("skip:1.5@onnx:x-layered", BackendKind.ONNX, "onnx:x-layered") == "skip:1.5"
    assert drafter_for("skip:1.5@onnx:x-layered", BackendKind.ONNX, "onnx:x") is None
    with pytest.raises(ValueError, match="@llamacpp"):
        drafter_for("model:x@gpu", BackendKind.ONNX)


def test_rows_report_prompt_speed_first_token_and_end_to_end_beside_decode():
    """Each configuration: prompt tok/s, first-token time and end-to-end tok/s (the prompt's processing included)
    beside decode tok/s, in results.json and in report.md's first table."""
    from specedge.perf.bench_report import markdown

    def run(p):
        s = stats_of([(0, 0)] * 10, decode_s=1.0)
        s.n_prefilled, s.prefill_s, s.n_calls, s.first_token_s = 200, 0.25, 1, 0.3
        return [1] * 10, s
    rows = bench.summarize(bench.run_bench([bench.Config("numpy", "none", 0, False, run, target_bytes=1)],
                                           [Prompt(0, "qa", "a"), Prompt(1, "qa", "b")], trials=1))
    r = rows[0]
    assert r["tokens_per_s"]["mean"] == pytest.approx(10.0) and r["prompt_tokens_per_s"]["mean"] == pytest.approx(800)
    assert r["first_token_s"]["mean"] == pytest.approx(0.3) and r["end_to_end_tokens_per_s"]["mean"] == pytest.approx(8)
    results = {"schema_version": SCHEMA_VERSION, "command": "specedge bench x", "categories": ["qa"],
               "environment": {"packages": {}, "threads": 1, "cpu_model": "x", "cpu_flags": [], "git_commit": None},
               "settings": {}, "prompts": [{"qid": 0, "category": "qa"}], "configs": rows}
    assert_valid_results(json.loads(json.dumps(results)))
    table = markdown(results)
    assert "| configuration | end-to-end tok/s | prompt tok/s | first token ms | decode tok/s mean |" in table
    assert "| numpy plain | 8.0 | 800 | 300 | 10.0 |" in table
