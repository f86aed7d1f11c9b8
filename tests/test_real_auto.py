"""Device profile of the real default model (SmolLM2-135M-Instruct Q4_1, llama.cpp backend): measured, cached,
reused, and a choice made from it. Timings are machine-dependent; only their structure and sanity are checked."""
import pytest

from specedge.assembly.auto import load_or_measure
from specedge.assembly.load import load_model
from specedge.assembly.profile import choose
from specedge.assembly.profile_measure import MeasureSettings
from specedge.runtime.backends import BackendKind

pytestmark = [pytest.mark.real, pytest.mark.slow]


def test_smollm2_profile_is_measured_cached_and_reused(tmp_path, monkeypatch):
    from quiet_machine import assume_quiet
    assume_quiet(monkeypatch)  # caching, not this machine's load (a profile measured while busy is not cached)
    model = load_model("smollm2-135m", BackendKind.LLAMACPP, ctx=1024, threads=1)
    settings = MeasureSettings(k_max=3, reps=3, prompts=1, max_tokens=24, prompt_tokens=128)
    messages = []
    profile, path = load_or_measure(model, "llamacpp", ["ngram"], threads=1, device="cpu", cache_dir=tmp_path,
                                    settings=settings, log=messages.append)
    assert path.is_file() and path.parent == tmp_path / "profiles" and any("measuring" in m for m in messages)
    assert len(profile.verify_s) == 4 and 1e-4 < profile.verify_s[0] < 1.0
    assert profile.verify_s[-1] >= profile.verify_s[0]
    ngram = profile.drafters["ngram"]
    assert len(ngram.accept) == 3 and all(0 < a < 1 for a in ngram.accept) and ngram.rounds >= 5
    again, _ = load_or_measure(model, "llamacpp", ["ngram"], threads=1, device="cpu", cache_dir=tmp_path,
                               settings=settings, log=messages.append)
    assert again == profile and sum("measuring" in m for m in messages) == 1
    c = choose(profile)
    assert c.predicted_tok_s >= c.plain_tok_s > 1.0
