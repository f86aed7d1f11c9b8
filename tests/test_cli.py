"""The `specedge` CLI on the tiny model (NumPy backend) and the catalogue listing."""
import json

import pytest
from click.testing import CliRunner

from specedge.apps.cli import cli


@pytest.fixture(scope="module")
def tiny_path(tiny_gguf):
    return tiny_gguf  # tests/conftest.py, shared (read-only)


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def test_generate_json_is_valid_and_lossless(tiny_path):
    r = run("generate", tiny_path, "hello world", "--backend", "numpy", "--drafter", "ngram", "--max-tokens", 24,
            "--temperature", 0, "--json", "--baseline")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(obj) == {"text", "tokens", "finish_reason", "stats"}
    assert obj["stats"]["identical_to_baseline"] is True
    assert obj["stats"]["mean_accepted_length"] >= 1.0
    assert 0 < len(obj["tokens"]) <= 24


def test_generate_honours_logit_bias_and_penalties_losslessly(tiny_path):
    base = ["generate", tiny_path, "hello world", "--backend", "numpy", "--drafter", "ngram", "--max-tokens", 24,
            "--temperature", 0, "--json", "--baseline"]
    plain = json.loads(run(*base).stdout.strip().splitlines()[-1])
    first = plain["tokens"][0]
    r = run(*base, "--logit-bias", f"{first}-inf", "--presence-penalty", 1.5, "--frequency-penalty", 0.5)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["stats"]["identical_to_baseline"] is True  # speculative == plain under the same bias and penalties
    assert first not in out["tokens"] and out["tokens"] != plain["tokens"]
    r = CliRunner().invoke(cli, [str(a) for a in base] + ["--logit-bias", "5=1"])
    assert r.exit_code == 2 and "TOKEN_ID+BIAS" in r.output
    r = CliRunner().invoke(cli, [str(a) for a in base] + ["--logit-bias", "99999999+1"])
    assert r.exit_code == 2 and "outside this model's vocabulary" in r.output


@pytest.mark.parametrize("flag", ["--adaptive-k", "--fixed-k"])
def test_draft_length_mode_is_reported_and_lossless(tiny_path, flag):
    r = run("generate", tiny_path, "the cat sat", "--backend", "numpy", "--drafter", f"model:{tiny_path}", "--k", 4,
            "--max-tokens", 16, "--temperature", 0, "--json", "--baseline", flag)
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout.strip().splitlines()[-1])["stats"]
    assert stats["adaptive_k"] is (flag == "--adaptive-k") and stats["identical_to_baseline"] is True
    if flag == "--fixed-k":
        assert stats["n_drafted"] == 4 * stats["n_target_forwards"]


def test_generate_stats_go_to_stderr(tiny_path):
    r = run("generate", tiny_path, "the cat", "--backend", "numpy", "--drafter", f"model:{tiny_path}", "--k", 3,
            "--max-tokens", 12, "--stats")
    assert r.exit_code == 0
    assert "tau" in r.stderr and "tau" not in r.stdout
    assert r.stdout.strip()


def test_sampled_generation_is_reproducible_with_a_seed(tiny_path):
    args = ("generate", tiny_path, "the cat", "--backend", "numpy", "--temperature", 0.9, "--top-p", 0.9,
            "--seed", 7, "--max-tokens", 16, "--json")
    assert json.loads(run(*args).stdout)["tokens"] == json.loads(run(*args).stdout)["tokens"]


@pytest.mark.parametrize("args, message", [
    (("--temperature", "-1"), "temperature"),
    (("--top-p", "0"), "top_p"),
    (("--drafter", "magic"), "unknown drafter"),
])
def test_bad_options_are_clear_errors(tiny_path, args, message):
    r = run("generate", tiny_path, "hi", "--backend", "numpy", *args)
    assert r.exit_code != 0 and message in r.output


def test_missing_model_is_a_clear_error(tmp_path):
    r = run("generate", tmp_path / "nope.gguf", "hi", "--backend", "numpy")
    assert r.exit_code != 0 and "nope.gguf" in r.output


def test_prompt_longer_than_context(tiny_path):
    r = run("generate", tiny_path, "word " * 400, "--backend", "numpy", "--raw")
    assert r.exit_code != 0 and "shorten the prompt" in r.output


def test_models_lists_the_catalogue(tmp_path):
    r = run("models", "--cache-dir", tmp_path)
    assert r.exit_code == 0
    for name in ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        assert name in r.output


def test_chat_streams_and_resets(tiny_path):
    r = CliRunner().invoke(cli, ["chat", str(tiny_path), "--backend", "numpy", "--max-tokens", "8"],
                           input="hello\n/reset\nthe cat\n/exit\n")
    assert r.exit_code == 0, r.output
    assert r.stderr.count("tau") == 2


def test_baseline_of_a_plain_run_says_there_is_nothing_to_compare(tiny_path):
    r = run("generate", tiny_path, "hello world", "--backend", "numpy", "--drafter", "none", "--max-tokens", 8,
            "--temperature", 0, "--baseline")
    assert r.exit_code == 0, r.output
    assert "nothing to compare" in r.stderr and "speedup" not in r.stderr
    assert "[numpy plain greedy]" in r.stderr and "drafter=" not in r.stderr


def test_recycle_trees_and_block_verifier_from_the_cli(tiny_path):
    r = run("generate", tiny_path, "the cat sat on the mat", "--backend", "numpy", "--drafter", "recycle:8",
            "--max-tokens", 20, "--temperature", 0, "--json", "--baseline")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["stats"]["identical_to_baseline"] is True
    r = run("generate", tiny_path, "the cat", "--backend", "numpy", "--drafter", f"model:{tiny_path}",
            "--verifier", "block", "--temperature", 0.8, "--max-tokens", 12, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["stats"]["verifier"] == "block"


def test_tokenize_prints_the_ids_generate_and_logit_bias_use(tiny_path):
    """`specedge tokenize` (the command the logit_bias error points to; it did not exist): the model's own ids,
    plain or in the chat template; a missing model is a clean error."""
    from specedge.models.gguf_in import open_gguf
    from specedge.runtime.tokenizer import Tokenizer
    tok = Tokenizer(open_gguf(tiny_path).tokenizer_spec())
    r = run("tokenize", tiny_path, "the cat sat")
    assert r.exit_code == 0 and [int(i) for i in r.output.split()] == tok.encode("the cat sat").tolist()
    r = run("tokenize", tiny_path, "hi", "--chat", "--json")
    pieces = json.loads(r.output)
    assert [p["id"] for p in pieces] == tok.chat_ids("hi").tolist() and "".join(p["piece"] for p in pieces)
    r = run("tokenize", tiny_path.parent / "missing.gguf", "x")
    assert r.exit_code == 1 and "missing.gguf" in r.output


@pytest.mark.parametrize("args,both", [
    (["--no-plan", "--auto"], ("--no-plan", "--auto")),
    (["--fixed-k", "--adaptive-k"], ("--adaptive-k", "--fixed-k")),
    (["--drafter", "ngram", "--k", "0"], ("--k 0", "drafter ngram")),
    (["--k", "0"], ("--k 0", "drafter ngram")),
    (["--lossy", "loradrop", "--drafter", "ngram"], ("--lossy", "--drafter")),
])
def test_flags_that_contradict_each_other_are_refused_naming_both(tmp_path, args, both):
    """Refused before anything loads or measures (the model path does not even exist), in one line naming both."""
    r = CliRunner().invoke(cli, ["generate", str(tmp_path / "missing.gguf"), "hi", *args])
    assert r.exit_code != 0
    line = r.output.strip().splitlines()[-1]
    assert all(b in line for b in both), line
    assert "missing.gguf" not in line  # the contradiction, not the missing file
