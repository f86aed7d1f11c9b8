"""Nothing measured without saying so, and every fallback lossless (issue 44): a thread count nobody planned for
reuses the plan of another (its speculative choice run plain where it would not be exact at these threads), the
Engine announces a measurement on its logger, and --no-plan or a skipped plan never runs inexact speculation."""
import logging

import pytest
from click.testing import CliRunner

import specedge
from specedge.apps.cli import cli
from specedge.assembly import open as openmod
from specedge.assembly import plan_run
from specedge.assembly.decoder import DecodeSettings, ModelSettings
from specedge.assembly.notice import Measuring
from specedge.assembly.open import open_decoder
from specedge.assembly.plan import PLAIN, PlanRow, PlanTarget, new_plan, plan_basis, plan_key, plan_path, save_plan
from specedge.assembly.profile import model_fingerprint
from specedge.assembly.profile_measure import MeasureSettings
from specedge.models.tiny import write_tiny_gguf
from specedge.runtime.drafters import NoneSpec, parse_drafter
from quiet_machine import assume_quiet

pytest.importorskip("llama_cpp")


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    assume_quiet(monkeypatch)
    monkeypatch.setattr(plan_run, "PLAN_MEASURE", MeasureSettings(k_max=2, reps=1, prompts=1, max_tokens=8,
                                                                   prompt_tokens=32, adaptive=False))
    monkeypatch.setattr(plan_run, "PLAN_WEIGHTS", ())  # the GGUF engines only: no ONNX export
    cache = tmp_path / "cache"
    cache.mkdir()
    return write_tiny_gguf(cache / "tiny.gguf", seed=0, n_layers=2, dtype="q4_1"), cache


def hand_made_plan(path, cache, threads, drafter):
    """A cached plan at `threads` choosing llama.cpp with `drafter` (k 4, adaptive), as the planner keys it."""
    target = PlanTarget("llamacpp", str(path), "llama.cpp q4_1")
    rows = [PlanRow(target.label, "llamacpp", str(path), PLAIN, 0, False, 50.0, 50.0)]
    if drafter != PLAIN:
        rows.append(PlanRow(target.label, "llamacpp", str(path), drafter, 4, True, 90.0, 90.0))
    fp = model_fingerprint(path)
    key = plan_key(fp, threads, ())
    plan = new_plan(key, str(path), [target], rows, threads, {}, 1.0, basis=plan_basis(fp, ()))
    save_plan(plan, plan_path(cache, key))
    return plan


@pytest.mark.slow
def test_another_thread_count_reuses_the_plan_and_says_so(tiny):
    path, cache = tiny
    hand_made_plan(path, cache, 2, PLAIN)
    lines = []
    d = open_decoder(ModelSettings(str(path), threads=1, ctx=64, cache_dir=cache), log=lines.append)
    assert not any(isinstance(m, Measuring) for m in lines), lines  # nothing measured
    assert any(m.startswith("plan: none measured at 1 thread; running the choice of the plan measured at 2 "
                            "(llama.cpp q4_1 plain) at 1") for m in lines), lines
    assert d.model.kind.value == "llamacpp" and isinstance(d.settings.drafter, NoneSpec)
    assert d.model_settings.threads == 1 and d.plan.threads == 2
    assert len(list((cache / "plans").glob("*.json"))) == 1  # no new plan made
    # `specedge plan` is asked to plan: it measures at 1 thread, and says why first
    made, fresh = plan_run.plan_for(str(path), plan_run.PlanSettings(threads=1, progress=False), cache_dir=cache,
                                    log=lines.append)
    assert fresh and made.threads == 1 and any(isinstance(m, Measuring) for m in lines)


def test_a_reused_speculative_choice_runs_plain_where_it_would_not_be_exact(tiny):
    # measured at 1 thread, where llama.cpp is batch-invariant, the plan chose llama.cpp + ngram; at 2 threads its
    # verify batches round differently from one-token calls, so the reused choice runs plain decoding
    path, cache = tiny
    hand_made_plan(path, cache, 1, "ngram")
    lines = []
    d = open_decoder(ModelSettings(str(path), threads=2, ctx=64, cache_dir=cache), log=lines.append)
    assert isinstance(d.settings.drafter, NoneSpec) and not d.model.backend.caps.batch_invariant
    assert any(m.startswith("plain decoding: ngram k<=4 would not be lossless here") for m in lines), lines
    one = open_decoder(ModelSettings(str(path), threads=1, ctx=64, cache_dir=cache))  # its own plan: exact
    assert str(one.settings.drafter) == "ngram" and one.model.backend.caps.batch_invariant


@pytest.mark.slow
def test_no_plan_and_a_skipped_plan_are_lossless(tiny, monkeypatch):
    path, cache = tiny
    lines = []
    two = open_decoder(ModelSettings(str(path), threads=2, ctx=64, cache_dir=cache), plan=False, log=lines.append)
    assert isinstance(two.settings.drafter, NoneSpec) and "plain decoding: ngram k<=4" in lines[-1]
    one = open_decoder(ModelSettings(str(path), threads=1, ctx=64, cache_dir=cache), plan=False)
    assert str(one.settings.drafter) == "ngram"  # exact at 1 thread: speculation stays
    with pytest.warns(RuntimeWarning, match="not batch-invariant"):  # asked for: run, with the warning
        asked = open_decoder(ModelSettings(str(path), threads=2, ctx=64, cache_dir=cache),
                             DecodeSettings(drafter=parse_drafter("ngram")), plan=False)
    assert str(asked.settings.drafter) == "ngram"

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(plan_run, "planned", interrupted)
    lines.clear()
    skipped = open_decoder(ModelSettings(str(path), threads=2, ctx=64, cache_dir=cache), log=lines.append,
                           interactive=True)
    assert isinstance(skipped.settings.drafter, NoneSpec)
    assert lines[0].startswith("plan: skipped (Ctrl-C); running the model's engine, exactly")
    r = CliRunner().invoke(cli, ["generate", str(path), "the cat", "--raw", "--no-plan", "--threads", 2, "--ctx", 64,
                                 "--max-tokens", 4, "--temperature", 0, "--stats", "--cache-dir", str(cache)])
    assert r.exit_code == 0, r.output
    assert "[llamacpp plain greedy]" in r.stderr and "may differ" not in r.stderr


@pytest.mark.slow
def test_engine_open_announces_a_measurement_on_its_logger(tiny, caplog):
    path, cache = tiny
    with caplog.at_level(logging.INFO, logger="specedge.engine"):
        engine = specedge.Engine.open(str(path), threads=1, ctx=64, cache_dir=cache)
    measuring = [r for r in caplog.records if r.name == "specedge.engine" and r.levelno == logging.WARNING]
    assert measuring and "measuring this machine within about 70 s" in measuring[0].getMessage()
    # every other WARNING is a measurement's announcement too (ik's per-file gate, where ik is installed)
    assert all("checking it once" in r.getMessage() and "about 10-30 s" in r.getMessage() for r in measuring[1:])
    assert "Engine.open(..., plan=False) never plans" in measuring[0].getMessage()
    assert "no plan for this model, machine, threads and engine versions yet" in measuring[0].getMessage()
    assert any(r.levelno == logging.INFO and r.getMessage().startswith("plan: ") for r in caplog.records)
    assert engine.plan is not None
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="specedge.engine"):
        specedge.Engine.open(str(path), threads=1, ctx=64, cache_dir=cache)  # cached: nothing measured
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_exact_default_keeps_plain_and_exact_choices(tiny):
    path, cache = tiny
    target = openmod.load(ModelSettings(str(path), threads=1, ctx=64, cache_dir=cache))
    said = []
    assert isinstance(openmod.exact_default(DecodeSettings(drafter=NoneSpec()), target, said.append).drafter,
                      NoneSpec)
    assert str(openmod.exact_default(DecodeSettings(), target, said.append).drafter) == "ngram" and not said
