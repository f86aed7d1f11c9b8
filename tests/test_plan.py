"""The planner (assembly/plan.py, assembly/plan_run.py): the choice across engines on hand-made profiles (including
ones where llama.cpp plain must win), calibration, the cache and what invalidates it, and the CLI defaults (plan
when nothing is given, honour what is given) end to end on a tiny model."""
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from specedge.apps.cli import cli, wants_plan
from specedge.assembly import plan as planmod
from specedge.assembly import plan_run
from specedge.assembly.plan import (PLAIN, Plan, PlanRow, PlanTarget, load_plan, new_plan, plan_key, save_plan,
                                    select, target_rows)
from specedge.assembly.profile import DeviceProfile, DrafterProfile
from specedge.assembly.profile_measure import MeasureSettings
from specedge.models.tiny import write_tiny_gguf
from specedge.runtime.drafters import parse_drafter

LLAMA = PlanTarget("llamacpp", "/m/model.gguf", "llama.cpp q4_1")
INT4 = PlanTarget("onnx", "/m/model-onnx-int4", "onnx int4")


def drafter(spec, accept, measured=0.0, adaptive=0.0, tau=0.0):
    k = len(accept)
    return DrafterProfile(spec, k, list(accept), [0.0] * k + [1.0], 0.0, 0.0, rounds=100, tok_s_measured=measured,
                          tok_s_adaptive=adaptive, tau_adaptive=tau)


def profile(verify_ms, drafters, plain_measured=None):
    return DeviceProfile(key="k", target="t", backend="x", model="m", fingerprint="f", threads=2, device="cpu",
                         ctx=128, verify_s=[t / 1e3 for t in verify_ms], overhead_s=[0.0, 0.0],
                         drafters={d.spec: d for d in drafters}, plain_tok_s_measured=plain_measured)


def row(target, drafter_, tok_s, engine=None, k=0, adaptive=False):
    return PlanRow(target.label, engine or target.engine, target.path, drafter_, k, adaptive, tok_s, None)


def test_target_rows_are_on_the_measured_scale():
    # plain: predicted 100 tok/s (T(1) = 10 ms), measured 80 -> 80
    # ngram measured 150 tok/s at k = k_max = 3 where the model predicts 2.952 / 15 ms = 196.8 (scale 0.762): k = 1
    # predicts 1.8 / 11.5 ms = 156.5 -> 119.3, k = 2 2.44 / 13 ms = 187.7 -> 143.0, k = 3 -> 150: k = 3 is its row
    p = profile([10, 11.5, 13, 15], [drafter("ngram", [0.8] * 3, measured=150)], plain_measured=80.0)
    plain, ngram = target_rows(INT4, p, ["ngram"])
    assert plain.drafter == PLAIN and plain.predicted_tok_s == pytest.approx(80.0) == plain.measured_tok_s
    assert (ngram.drafter, ngram.k, ngram.adaptive) == ("ngram", 3, False)
    assert ngram.predicted_tok_s == pytest.approx(150.0) and ngram.measured_tok_s == pytest.approx(150.0)
    # a measured adaptive run faster than every fixed k is the drafter's row, at its measured speed
    p = profile([10, 11.5, 13, 15], [drafter("ngram", [0.8] * 3, measured=150, adaptive=170, tau=2.5)],
                plain_measured=80.0)
    _, ngram = target_rows(INT4, p, ["ngram"])
    assert ngram.adaptive and ngram.predicted_tok_s == pytest.approx(170.0) == ngram.measured_tok_s
    # the cost model's optimism (it predicts 196.8 at k = 3) does not survive a slower measurement: a measured
    # adaptive run slower than plain stays slower than plain
    p = profile([10, 11.5, 13, 15], [drafter("ngram", [0.8] * 3, measured=60, adaptive=70, tau=1.0)],
                plain_measured=80.0)
    rows = target_rows(INT4, p, ["ngram"])
    assert select(rows) == (0, 0) and max(r.predicted_tok_s for r in rows[1:]) < 80.0


def test_llamacpp_plain_wins_when_no_drafter_pays_anywhere():
    # llama.cpp plain 105; ONNX int4 plain 86 with ngram predicted 104 (below llama.cpp plain): plain llama.cpp
    rows = [row(LLAMA, PLAIN, 105.0), row(LLAMA, "ngram", 101.0, k=4), row(INT4, PLAIN, 86.0),
            row(INT4, "ngram", 104.0, k=4, adaptive=True)]
    chosen, reference = select(rows)
    assert (chosen, reference) == (0, 0)
    plan = new_plan("key", "m", [LLAMA, INT4], rows, 2, {}, 1.0)
    assert plan.choice.describe() == "llama.cpp q4_1 plain" and "fastest of 4 candidates" in plan.summary()


def test_a_speculative_config_within_the_margin_of_the_fastest_plain_is_not_taken():
    # ngram on ONNX predicted 2% over llama.cpp plain: within noise (3%), plain wins; at 10% ngram wins
    rows = [row(LLAMA, PLAIN, 100.0), row(INT4, PLAIN, 86.0), row(INT4, "ngram", 102.0, k=4)]
    assert select(rows) == (0, 0)
    rows[2] = row(INT4, "ngram", 110.0, k=4, adaptive=True)
    assert select(rows) == (2, 0)
    plan = new_plan("key", "m", [LLAMA, INT4], rows, 2, {}, 1.0)
    assert plan.summary() == ("onnx int4 + ngram k<=4, predicted 1.10x over llama.cpp q4_1 plain "
                              "(110.0 vs 100.0 tok/s)")
    assert "**chosen**" in plan.table() and "reference" in plan.table()


def test_the_fastest_plain_engine_wins_when_it_is_not_llamacpp():
    # the Intel Xeon case: ONNX int4 plain beats llama.cpp plain and no drafter pays: ONNX plain, stated vs llama.cpp
    rows = [row(LLAMA, PLAIN, 90.0), row(LLAMA, "ngram", 91.0, k=2), row(INT4, PLAIN, 106.0),
            row(INT4, "ngram", 108.0, k=2)]
    chosen, reference = select(rows)
    assert rows[chosen].describe() == "onnx int4 plain" and reference == 0
    with pytest.raises(ValueError, match="plain decoding"):
        select([row(INT4, "ngram", 108.0, k=2)])


def test_plan_round_trip_and_what_invalidates_the_cache(tmp_path):
    src = tmp_path / "model.gguf"
    src.write_bytes(b"x")
    target = PlanTarget("llamacpp", str(src), "llama.cpp f32")
    rows = [PlanRow(target.label, "llamacpp", str(src), PLAIN, 0, False, 50.0, 49.0),
            PlanRow(target.label, "llamacpp", str(src), "ngram", 4, True, 60.0, 58.0)]
    plan = new_plan("abc", "tiny", [target], rows, 2, {"cpu_model": "x"}, 3.0)
    path = save_plan(plan, tmp_path / "plans" / "abc.json")
    loaded, why = load_plan(path, "abc")
    assert why == "" and loaded.rows == plan.rows and loaded.choice == plan.choice
    assert json.loads(path.read_text())["choice"]["summary"] == plan.summary()  # what `specedge models` shows
    assert load_plan(path, "other")[0] is None  # another model / machine / versions
    src.unlink()
    assert "gone" in load_plan(path, "abc")[1]  # a measured artifact was removed (`specedge rm`)
    src.write_bytes(b"x")
    path.write_text("{not json")
    assert "unreadable" in load_plan(path, "abc")[1]
    path.write_text(json.dumps({**plan.to_dict(), "version": 0}))
    assert load_plan(path, "abc")[0] is None


def test_the_plan_key_covers_model_threads_formats_cpu_and_packages():
    dev = {"cpu_model": "AMD EPYC", "simd": ["avx2"], "packages": {"onnxruntime": "1.32.0"}}
    base = plan_key("fp", 2, ("int4",), dev)
    assert base == plan_key("fp", 2, ("int4",), dict(dev))
    assert base != plan_key("fp2", 2, ("int4",), dev)
    assert base != plan_key("fp", 1, ("int4",), dev)
    assert base != plan_key("fp", 2, ("int4", "int8"), dev)
    assert base != plan_key("fp", 2, ("int4",), {**dev, "simd": ["avx2", "avx512f"]})
    assert base != plan_key("fp", 2, ("int4",), {**dev, "packages": {"onnxruntime": "1.33.0"}})


def test_wants_plan_only_when_nothing_says_what_to_run():
    o = {"backend": None, "drafter": None, "k": None, "lossy": None, "auto": False, "no_plan": False,
         "device": "auto"}
    assert wants_plan(o)
    for override in ({"backend": "llamacpp"}, {"drafter": "none"}, {"k": 0}, {"auto": True}, {"no_plan": True},
                     {"device": "cpu"}, {"lossy": "loradrop"}):
        assert not wants_plan({**o, **override}), override


# -- end to end on a tiny model (numbers meaningless; the flow, cache and losslessness are not) -------------------

TINY_MEASURE = MeasureSettings(k_max=2, reps=1, prompts=1, max_tokens=8, prompt_tokens=32, adaptive=True)


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    monkeypatch.setattr(plan_run, "PLAN_MEASURE", TINY_MEASURE)
    monkeypatch.setattr(plan_run, "PLAN_WEIGHTS", ("int4",))
    cache = tmp_path / "cache"
    cache.mkdir()
    return write_tiny_gguf(cache / "tiny.gguf", seed=0, n_layers=2, dtype="q4_1"), cache  # int4 transcodes exactly


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def test_generate_plans_on_first_use_then_reuses_the_plan_and_decodes_like_plain(tiny):
    pytest.importorskip("llama_cpp")
    pytest.importorskip("onnxruntime")
    path, cache = tiny
    r = run("generate", path, "the cat sat", "--raw", "--temperature", 0, "--max-tokens", 12, "--threads", 1,
            "--ctx", 256, "--cache-dir", cache, "--json")
    assert r.exit_code == 0, r.output
    assert "measuring this machine" in r.stderr and "plan: " in r.stderr
    [plan_file] = list((cache / "plans").glob("*.json"))
    plan = Plan.from_dict(json.loads(plan_file.read_text()))
    engines = {x.engine for x in plan.rows}
    assert engines == {"llamacpp", "onnx"}  # llama.cpp on the GGUF and the int4 export, made on demand
    assert (cache / "tiny-onnx-int4" / "manifest.json").is_file()
    assert plan.sources == [str(path), str(cache / "tiny-onnx-int4")]
    out = json.loads(r.stdout)
    assert out["stats"]["backend"] == plan.choice.engine and out["stats"]["model"] == plan.choice.path
    assert out["stats"]["drafter"] == str(parse_drafter(plan.choice.drafter))
    # plain greedy on the same engine and artifact gives the same tokens (lossless)
    plain = run("generate", plan.choice.path, "the cat sat", "--raw", "--temperature", 0, "--max-tokens", 12,
                "--threads", 1, "--ctx", 256, "--cache-dir", cache, "--json", "--backend", plan.choice.engine,
                "--drafter", "none")
    assert plain.exit_code == 0, plain.output
    assert json.loads(plain.stdout)["tokens"] == out["tokens"]
    # second run: the cached plan, nothing measured
    again = run("generate", path, "the cat sat", "--raw", "--temperature", 0, "--max-tokens", 12, "--threads", 1,
                "--ctx", 256, "--cache-dir", cache, "--json")
    assert again.exit_code == 0 and "measuring" not in again.stderr and "plan: " in again.stderr
    assert json.loads(again.stdout)["tokens"] == out["tokens"]
    # `specedge plan` shows the table; --no-plan and explicit options never plan
    shown = run("plan", path, "--threads", 1, "--cache-dir", cache, "--weights", "int4")
    assert shown.exit_code == 0 and "**chosen**" in shown.stdout and "cached" in shown.stdout
    for flags in (["--no-plan"], ["--drafter", "ngram"], ["--backend", "llamacpp"]):
        r = run("generate", path, "hi", "--raw", "--max-tokens", 4, "--ctx", 256, "--cache-dir", cache, *flags)
        assert r.exit_code == 0 and "plan:" not in r.stderr, flags


def test_a_new_package_version_or_cpu_replans(tiny, monkeypatch):
    pytest.importorskip("llama_cpp")
    path, cache = tiny
    settings = plan_run.PlanSettings(threads=1, weights=())
    plan, made = plan_run.plan_for(str(path), settings, cache_dir=cache)
    assert made and [r.engine for r in plan.rows if r.plain] == ["llamacpp"]  # weights=(): no ONNX export
    assert plan_run.plan_for(str(path), settings, cache_dir=cache)[1] is False  # cached
    real = planmod.device_fingerprint()
    monkeypatch.setattr(planmod, "device_fingerprint",
                        lambda: {**real, "packages": {**real["packages"], "llama_cpp_python": "99.0"}})
    assert plan_run.plan_for(str(path), settings, cache_dir=cache)[1] is True  # re-planned
    assert len(list((cache / "plans").glob("*.json"))) == 2
    assert plan_run.plan_for(str(path), settings, cache_dir=cache, refresh=True)[1] is True


def test_an_artifact_plans_over_itself_only(tiny):
    pytest.importorskip("onnxruntime")
    from specedge.export.onnx_export import WeightFormat, export_gguf_to_onnx
    from specedge.models.gguf_in import open_gguf
    path, cache = tiny
    art = cache / "tiny-onnx-int8"
    export_gguf_to_onnx(open_gguf(path), art, WeightFormat.INT8, threads=1)
    plan, _ = plan_run.plan_for("tiny-onnx-int8", plan_run.PlanSettings(threads=1), cache_dir=cache)
    assert {r.path for r in plan.rows} == {str(art)} and plan.sources == [str(art)]
    assert Path(plan.choice.path) == art


def test_llamacpp_speculation_is_planned_only_where_it_is_lossless(tiny):
    # llama.cpp's verify batches equal its one-token calls only at 1 thread: at 2 the plan keeps it plain
    pytest.importorskip("llama_cpp")
    path, cache = tiny
    two, _ = plan_run.plan_for(str(path), plan_run.PlanSettings(threads=2, weights=()), cache_dir=cache)
    assert [r.drafter for r in two.rows] == [PLAIN]
    one, _ = plan_run.plan_for(str(path), plan_run.PlanSettings(threads=1, weights=()), cache_dir=cache)
    assert {r.drafter for r in one.rows} == {PLAIN, "ngram"}


def test_a_plain_llamacpp_choice_runs_its_plain_kernels_and_speculation_keeps_exact_ones():
    from specedge.assembly.decoder import DecodeSettings, ModelSettings
    base = (ModelSettings("m", None), DecodeSettings())
    for rows, exact in (([row(LLAMA, PLAIN, 100.0), row(INT4, PLAIN, 80.0)], False),  # no drafter: plain kernels
                        ([row(LLAMA, PLAIN, 80.0), row(INT4, PLAIN, 100.0)], True),
                        ([row(LLAMA, PLAIN, 80.0), row(LLAMA, "ngram", 100.0, k=4)], True)):
        plan = new_plan("key", "m", [LLAMA, INT4], rows, 2, {}, 1.0)
        model, decode = plan_run.apply_plan(plan, *base)
        assert model.exact_batches is exact and model.model == plan.choice.path
        assert str(decode.drafter) == (str(parse_drafter(plan.choice.drafter)))


def test_llamacpp_plain_kernels_are_declared_not_batch_invariant(tiny):
    pytest.importorskip("llama_cpp")
    from specedge.assembly.load import batch_invariance_warning, load_model
    from specedge.runtime.backends import BackendKind
    path, cache = tiny
    exact = load_model(str(path), BackendKind.LLAMACPP, threads=1, ctx=64)
    assert exact.backend.caps.batch_invariant and batch_invariance_warning(exact, []) is None
    del exact
    fast = load_model(str(path), BackendKind.LLAMACPP, threads=1, ctx=64, exact_batches=False)
    assert not fast.backend.caps.batch_invariant and "plain decoding" in batch_invariance_warning(fast, [])


def test_head_to_head_rescales_each_target_by_its_plain_speed_now(tiny):
    pytest.importorskip("llama_cpp")
    pytest.importorskip("onnxruntime")
    path, cache = tiny
    plan, _ = plan_run.plan_for(str(path), plan_run.PlanSettings(threads=1), cache_dir=cache)
    targets = [PlanTarget("llamacpp", str(path), "a"), PlanTarget("onnx", str(cache / "tiny-onnx-int4"), "b")]
    per = [[r for r in plan.rows if r.path == t.path] for t in targets]
    from specedge.assembly.load import load_model
    from specedge.runtime.backends import BackendKind
    models = [load_model(t.path, BackendKind(t.engine), threads=1, cache_dir=cache, device="cpu") for t in targets]
    lines = []
    out = plan_run.head_to_head(targets, models, per, lines.append)
    assert len(lines) == 2 and all("head to head" in m for m in lines)
    for before, after in zip(per, out):
        scale = after[0].predicted_tok_s / before[0].predicted_tok_s
        assert scale > 0 and [a.predicted_tok_s for a in after] == pytest.approx(
            [b.predicted_tok_s * scale for b in before])  # one factor per target: its rows keep their order
        assert [a.measured_tok_s for a in after] == [b.measured_tok_s for b in before]
