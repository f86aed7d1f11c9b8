"""Auto-tuning end to end on the tiny NumPy model: `bench --profile-device` writes and caches a profile, `bench
--auto` runs the choice and plain and reports predicted vs measured, `generate --auto` decodes exactly as plain
greedy (the numbers are meaningless on a tiny model; the files, fields and losslessness are not)."""
import json

import pytest
from click.testing import CliRunner

from specedge.apps.cli import cli
from specedge.models.tiny import write_tiny_gguf
from specedge.assembly.profile import DeviceProfile

from test_bench import assert_valid_results  # noqa: E402  (tests/ is on the path)
from quiet_machine import assume_quiet  # noqa: E402


@pytest.fixture(autouse=True)
def quiet(monkeypatch):
    """The flow (profile cached, then used), not this machine's load: a profile measured while another process
    burns the CPU is rightly not cached, which made this module fail whenever the test machine was busy."""
    assume_quiet(monkeypatch)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("auto")
    prompts = d / "prompts.txt"
    prompts.write_text("the cat sat on the mat\nhello world hello world\n")
    return write_tiny_gguf(d / "tiny.gguf", seed=0), prompts, d


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.slow
def test_bench_profile_device_then_auto(tiny):
    path, prompts, d = tiny
    cache, out = d / "cache", d / "profile-out"
    r = run("bench", path, "--targets", "numpy", "--drafters", "ngram", "--profile-device", "--threads", 1,
            "--ctx", 256, "--out", out, "--cache-dir", cache, "--no-baselines")
    assert r.exit_code == 0, r.output
    assert "measuring numpy" in r.stderr and "| numpy |" in r.stdout and "chosen" in r.stdout
    [cached] = list((cache / "profiles").glob("*.json"))
    profile = DeviceProfile.from_dict(json.loads(cached.read_text()))  # schema-checked
    assert set(profile.drafters) == {"ngram", "skip:2"}  # numpy runs layer plans: self-speculation is a candidate
    assert len(profile.verify_s) == 9 and all(0 < a <= b for a, b in zip(profile.verify_s, profile.verify_s[1:]))
    ngram = profile.drafters["ngram"]
    assert len(ngram.accept) == 8 and all(0 < a < 1 for a in ngram.accept)
    assert sum(ngram.length_dist) == pytest.approx(1.0) and ngram.rounds > 0
    assert ngram.tok_s_adaptive > 0 and ngram.tau_adaptive >= 1.0  # the adaptive-length run, a candidate too
    assert profile.machine["threads"] == 1 and profile.machine["cpu_model"]
    rows = json.loads((out / "profiles.json").read_text())["profiles"]
    assert rows[0]["choice"]["predicted_tok_s"] > 0 and rows[0]["path"] == str(cached)
    pytest.importorskip("matplotlib")
    assert (out / "verify_cost.png").stat().st_size > 0

    out = d / "auto-out"
    r = run("bench", path, "--targets", "numpy", "--drafters", "ngram", "--auto", "--threads", 1, "--ctx", 256,
            "--prompts", prompts, "--max-tokens", 16, "--warmup", 1, "--out", out, "--cache-dir", cache,
            "--no-baselines")
    assert r.exit_code == 0, r.output
    assert "measuring" not in r.stderr  # the cached profile is reused
    results = json.loads((out / "results.json").read_text())
    assert_valid_results(results)
    [auto] = results["auto"]
    assert auto["profile"] == str(cached) and auto["predicted_tok_s"] > 0 and auto["plain_predicted_tok_s"] > 0
    assert auto["measured_tok_s"] > 0 and auto["plain_measured_tok_s"] > 0
    assert auto["measured_speedup"] == pytest.approx(auto["measured_tok_s"] / auto["plain_measured_tok_s"])
    assert auto["predicted_speedup"] >= 1.0  # plain is always a candidate
    assert results["configs"][0]["label"] == "numpy plain"
    assert results["configs"][0]["predicted_tokens_per_s"] == pytest.approx(auto["plain_predicted_tok_s"])
    chosen = results["configs"][-1]
    assert (chosen["drafter"], chosen["k"]) == (("none", 0) if auto["drafter"] == "none" else
                                                (auto["drafter"], auto["k"]))
    assert chosen["adaptive"] == auto["adaptive"]  # the chosen length policy is what ran
    assert chosen["predicted_tokens_per_s"] == pytest.approx(auto["predicted_tok_s"])
    assert all(c["identical_to_plain"] == 2 for c in results["configs"])  # lossless
    assert "predicted vs measured" in (out / "report.md").read_text() and (out / "verify_cost.png").is_file()


@pytest.mark.slow
def test_generate_auto_is_plain_greedy_and_remeasures_a_corrupt_profile(tiny):
    path, _, d = tiny
    cache = d / "gen-cache"
    common = ("generate", path, "the cat sat on the mat, the cat", "--backend", "numpy", "--max-tokens", 24,
              "--threads", 1, "--cache-dir", cache, "--json")
    plain = run(*common, "--drafter", "none")
    auto = run(*common, "--auto")
    assert plain.exit_code == 0 and auto.exit_code == 0, auto.output
    assert json.loads(auto.stdout)["tokens"] == json.loads(plain.stdout)["tokens"]
    assert "no device profile" in auto.stderr and "--auto: " in auto.stderr
    stats = json.loads(auto.stdout)["stats"]
    k = f"k{'<=' if stats['adaptive_k'] else '='}{stats['k']}"  # decoded with the chosen length policy
    assert (f"drafter {stats['drafter']} {k}" if stats["drafter"] != "none" else "plain decoding") in auto.stderr
    [cached] = list((cache / "profiles").glob("*.json"))
    cached.write_text("{truncated")
    again = run(*common, "--auto")
    assert again.exit_code == 0 and "unreadable" in again.stderr
    assert json.loads(again.stdout)["tokens"] == json.loads(plain.stdout)["tokens"]
    DeviceProfile.from_dict(json.loads(cached.read_text()))  # rewritten whole


@pytest.mark.slow
def test_chat_auto_prints_the_choice(tiny):
    path, _, d = tiny
    r = CliRunner().invoke(cli, ["chat", str(path), "--backend", "numpy", "--max-tokens", "8", "--auto",
                                 "--cache-dir", str(d / "chat-cache")], input="hello\n/exit\n")
    assert r.exit_code == 0, r.output
    assert "--auto: " in r.stderr and "predicted" in r.stderr and r.stderr.count(" tok/s | tau ") == 1


def test_float_onnx_targets_get_their_quantized_artifacts_as_drafter_candidates(tmp_path):
    """The same source exported int4 (dynamic) beside an fp32 target is a candidate drafter, alone and behind prompt
    lookup; a layered artifact, an artifact of another source and the target itself are not; a quantized target gets
    none."""
    pytest.importorskip("onnxruntime")
    from specedge.assembly.auto import candidate_specs
    from specedge.assembly.load import load_model
    from specedge.models.gguf_in import open_gguf
    from specedge.export.onnx_export import LAYERED, export_gguf_to_onnx
    from specedge.export.onnx_linear import WeightFormat
    from specedge.runtime.backends import BackendKind

    src, other = (open_gguf(write_tiny_gguf(tmp_path / f"{n}.gguf", seed=s)) for n, s in (("a", 0), ("b", 1)))
    arts = tmp_path / "models"
    export_gguf_to_onnx(src, arts / "a-fp32", WeightFormat.FP32, gate=False)
    export_gguf_to_onnx(src, arts / "a-int4", WeightFormat.INT4, gate=False)
    export_gguf_to_onnx(src, arts / "a-layered-int4", WeightFormat.INT4, gate=False, profile=LAYERED)
    export_gguf_to_onnx(other, arts / "b-int4", WeightFormat.INT4, gate=False)
    target = load_model(str(arts / "a-fp32"), BackendKind.ONNX, threads=1)
    specs = candidate_specs(target, ["ngram"])
    int4 = f"model:{(arts / 'a-int4').resolve()}"
    assert [s for s in specs if s.startswith("model:")] == [int4, f"{int4}+lookup"]
    quantized = load_model(str(arts / "a-int4"), BackendKind.ONNX, threads=1)
    assert not [s for s in candidate_specs(quantized, []) if s.startswith("model:")]


def test_the_plan_measures_the_heads_trained_on_this_very_file(tmp_path):
    """A head in the heads cache is a candidate on a target that reads taps, only for the GGUF whose SHA-256 its
    head.json names (a head for another file, or on a target without taps, is not)."""
    from specedge.assembly.auto import candidate_specs
    from specedge.assembly.load import load_model
    from specedge.models.catalog import file_sha256, heads_dir
    from specedge.models.gguf_in import open_gguf
    from specedge.runtime.backends import BackendKind
    from specedge.runtime.drafters.head_model import random_head, save_head

    a, b = (write_tiny_gguf(tmp_path / f"{n}.gguf", seed=s) for n, s in (("a", 0), ("b", 1)))
    cache = tmp_path / "cache"
    for name, path in (("a", a), ("b", b)):
        cfg, arrays = random_head(open_gguf(path).config, (1, 1, 2), gguf_sha256=file_sha256(path), model=name)
        save_head(heads_dir(cache) / name, cfg, arrays)
    target = load_model(str(a), BackendKind.NUMPY, threads=1, cache_dir=cache)
    heads = [s for s in candidate_specs(target, [], cache) if s.startswith("head:")]
    assert heads == [f"head:{heads_dir(cache) / 'a'}"]
    llama = load_model(str(a), BackendKind.LLAMACPP, threads=1, cache_dir=cache)
    assert not [s for s in candidate_specs(llama, [], cache) if s.startswith("head:")]
