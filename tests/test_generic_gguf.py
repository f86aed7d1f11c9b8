"""llama.cpp runs any GGUF it can load: a tiny gpt2-architecture file (no family module) and a llama file whose
pre-tokenizer we do not build, both tokenized by llama.cpp itself; what needs our weights refuses them by name."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("llama_cpp")

from generic_gguf import write_gpt2_gguf  # noqa: E402
from specedge.apps.cli import cli  # noqa: E402
from specedge.assembly import plan_run  # noqa: E402
from specedge.assembly.load import load_model  # noqa: E402
from specedge.models import llama  # noqa: E402
from specedge.models.errors import UnsupportedModelError  # noqa: E402
from specedge.models.gguf_any import MetadataGGUF, open_any_gguf  # noqa: E402
from specedge.models.gguf_in import open_gguf  # noqa: E402
from specedge.models.tiny import write_tiny_gguf  # noqa: E402
from specedge.runtime.backends import BackendKind  # noqa: E402
from specedge.runtime.backends.llamacpp_tokenizer import LlamaCppTokenizer  # noqa: E402
from specedge.runtime.tokenizer import StreamDecoder, TextTokenizer, Tokenizer  # noqa: E402

TEXTS = ["the cat is in the hat", "  two  spaces\tand\ttabs\n\nnew lines", "héllo wörld ✓ 日本",
         "digits 12345 67", "<|im_start|>user\nhi<|im_end|>", ""]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("generic")
    return write_gpt2_gguf(d / "gpt2.gguf", seed=0), write_gpt2_gguf(d / "gpt2-draft.gguf", seed=0, n_layers=1), \
        write_tiny_gguf(d / "tiny-llama.gguf", seed=0), d


def run(*args, input=None):
    return CliRunner().invoke(cli, [str(a) for a in args], input=input, catch_exceptions=False)


def test_a_file_without_a_family_opens_as_metadata_only(files):
    gpt2 = files[0]
    with pytest.raises(UnsupportedModelError, match=r"unsupported model architecture 'gpt2'; supported: .*llama.*"
                                                    r"llama\.cpp backend"):
        open_gguf(gpt2)
    meta = open_any_gguf(gpt2)
    assert isinstance(meta, MetadataGGUF)
    c = meta.config
    assert (c.arch, c.n_layers, c.d_model, c.n_heads, c.vocab_size, c.context_length, c.name) == \
        ("gpt2", 2, 64, 4, 301, 256, "tiny-gpt2")
    for ask in (meta.load_weights, meta.tokenizer_spec, lambda: meta.load_tensor("embed")):
        with pytest.raises(UnsupportedModelError, match="'gpt2'"):
            ask()
    assert not isinstance(open_any_gguf(files[2]), MetadataGGUF)  # a family file opens as before


def test_llamacpp_tokenizes_it_and_matches_our_tokenizer_on_the_same_vocabulary(files):
    gpt2, _, tiny, _ = files
    m = load_model(str(gpt2), BackendKind.LLAMACPP, threads=1)
    tok = m.tokenizer
    assert isinstance(tok, LlamaCppTokenizer) and isinstance(tok, TextTokenizer)
    ours = Tokenizer(open_gguf(tiny).tokenizer_spec())  # the same byte-level vocabulary, our implementation
    assert tok.vocab_size == ours.vocab_size == 301 and tok.fingerprint() == ours.fingerprint()
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids.dtype == np.int32 and list(ids) == m.backend.tokenize(text)
        assert tok.decode(ids) == text
        stream = StreamDecoder(tok)
        assert "".join(stream.push(t) for t in ids) + stream.flush() == text
    assert (tok.bos_id, tok.eos_ids[0]) == (ours.bos_id, ours.eos_ids[0])  # <|endoftext|>, <|im_end|>
    assert list(tok.encode("hi", add_bos=True))[0] == tok.bos_id and list(tok.encode("hi"))[0] != tok.bos_id
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(chat) == ours.apply_chat_template(chat)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([301])


def test_greedy_ngram_speculation_equals_plain_token_for_token(files):
    r = run("generate", files[0], "the cat is in the hat and the", "--backend", "llamacpp", "--drafter", "ngram",
            "--threads", 1, "--max-tokens", 48, "--temperature", 0, "--json", "--baseline", "--no-plan",
            "--fixed-k")  # adaptive k may stop drafting on timings: fixed k makes acceptance a fact of the text
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout.strip().splitlines()[-1])
    stats = obj["stats"]
    assert len(obj["tokens"]) == 48 and len(set(obj["tokens"])) > 5  # varied text, not one repeated token
    assert stats["identical_to_baseline"] is True and stats["n_accepted"] > 0


def test_a_draft_model_with_the_same_vocabulary_drafts_for_it(files):
    gpt2, small, tiny, _ = files
    for draft in (small, tiny):  # another gpt2 file (llama.cpp's tokenizer), a llama file (ours): same vocabulary
        r = run("generate", gpt2, "the cat is in the", "--drafter", f"model:{draft}", "--threads", 1, "--k", 3,
                "--max-tokens", 24, "--temperature", 0, "--json", "--baseline", "--no-plan")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout.strip().splitlines()[-1])["stats"]["identical_to_baseline"] is True


def test_chat_answers_with_the_ngram_drafter(files):
    r = run("chat", files[0], "--drafter", "ngram", "--threads", 1, "--max-tokens", 8, "--no-plan",
            input="hello\n/reset\nthe cat\n/exit\n")
    assert r.exit_code == 0, r.output
    assert r.stderr.count("tau") == 2


@pytest.mark.parametrize("drafter", ["skip:2", "exit:1", "del"])
def test_self_drafters_are_refused_with_why(files, drafter):
    r = run("generate", files[0], "hi", "--drafter", drafter, "--threads", 1, "--max-tokens", 4, "--no-plan")
    assert r.exit_code != 0
    assert "only llama.cpp runs this file" in r.output and "'gpt2'" in r.output and "ngram" in r.output


def test_numpy_and_onnx_export_refuse_it_with_the_family_message(files):
    gpt2, _, _, d = files
    for args in (("generate", gpt2, "hi", "--backend", "numpy", "--no-plan", "--max-tokens", 2),
                 ("export", gpt2, "--format", "onnx", "--out", d / "never")):
        r = run(*args)
        assert r.exit_code != 0 and not (d / "never").exists()
        assert "unsupported model architecture 'gpt2'; supported:" in r.output and "llama.cpp backend" in r.output


@pytest.mark.slow
def test_the_planner_skips_onnx_for_it_and_plans_llamacpp(files, tmp_path, monkeypatch):
    """The llama.cpp engines run it (ik too where installed, gated against mainline); ONNX export is skipped."""
    from quiet_machine import assume_quiet
    from specedge.runtime.backends import gguf_engines
    assume_quiet(monkeypatch)
    monkeypatch.setattr(plan_run, "PLAN_MEASURE", plan_run.MeasureSettings(k_max=2, reps=1, prompts=1, max_tokens=8,
                                                                           prompt_tokens=32, adaptive=True))
    logs: list[str] = []
    settings = plan_run.PlanSettings(threads=1, weights=("int8",), progress=False)
    targets = plan_run.discover_targets(str(files[0]), settings, cache_dir=tmp_path, log=logs.append)
    planned = [e.value for e in gguf_engines() if e.planned]
    assert [t.engine for t in targets] == planned
    assert any("not exporting" in m and "'gpt2'" in m for m in logs), logs
    plan, made = plan_run.plan_for(str(files[0]), settings, cache_dir=tmp_path)
    assert made and "llamacpp" in {r.engine for r in plan.rows} <= set(planned)


def test_models_lists_it(files, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "gpt2.gguf").write_bytes(files[0].read_bytes())
    r = run("models", "--cache-dir", cache)
    assert r.exit_code == 0 and "gpt2.gguf" in r.output


def test_a_family_file_with_a_tokenizer_we_do_not_build_runs_on_llamacpp_only(tmp_path, monkeypatch):
    monkeypatch.setattr(llama, "tokenizer_pre", lambda cfg: "starcoder")  # llama.cpp knows it; we do not
    path = write_tiny_gguf(tmp_path / "starcoder-pre.gguf", seed=0)
    with pytest.raises(UnsupportedModelError, match=r"pre-tokenizer 'starcoder'.*llama\.cpp backend"):
        load_model(str(path), BackendKind.NUMPY)
    m = load_model(str(path), BackendKind.LLAMACPP, threads=1)
    assert isinstance(m.tokenizer, LlamaCppTokenizer) and not isinstance(m.gguf, MetadataGGUF)
    assert all(list(m.tokenizer.encode(t)) == m.backend.tokenize(t) for t in TEXTS)
    r = run("generate", path, "the cat is in the", "--backend", "llamacpp", "--drafter", "ngram", "--threads", 1,
            "--max-tokens", 24, "--temperature", 0, "--json", "--baseline", "--no-plan")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["stats"]["identical_to_baseline"] is True
    r = run("export", path, "--format", "onnx", "--out", tmp_path / "never")
    assert r.exit_code != 0 and "pre-tokenizer 'starcoder'" in r.output


def test_engine_and_server_run_it(files):
    import httpx
    import specedge
    from specedge.apps.serve_cmd import ServerThread
    from specedge.apps.server import ServerConfig, create_app
    eng = specedge.Engine.open(str(files[0]), drafter="ngram", threads=1, ctx=256)
    assert eng.model.kind is BackendKind.LLAMACPP and isinstance(eng.tokenizer, LlamaCppTokenizer)
    want = eng.generate("the cat is in the", max_tokens=12, temperature=0)
    assert len(want.tokens) > 0
    chat = [{"role": "user", "content": "hi there"}]
    with ServerThread(create_app(eng, ServerConfig("gpt2", max_queue=2))) as s:
        r = httpx.post(s.url + "/v1/completions", json={"model": "gpt2", "prompt": "the cat is in the",
                                                        "max_tokens": 12, "temperature": 0}, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == want.text
        r = httpx.post(s.url + "/v1/chat/completions", json={"model": "gpt2", "messages": chat, "max_tokens": 8,
                                                             "temperature": 0}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(eng.encode(eng.render_chat(chat)))


def test_bench_baselines_tokenize_it_with_llamacpp(files):
    from specedge.assembly.load import gguf_tokenizer
    tok = gguf_tokenizer(files[0])  # vocabulary only: no weights loaded
    assert isinstance(tok, LlamaCppTokenizer) and list(tok.encode(TEXTS[0])) == \
        list(load_model(str(files[0]), BackendKind.LLAMACPP, threads=1).tokenizer.encode(TEXTS[0]))
    assert isinstance(gguf_tokenizer(files[2]), Tokenizer)  # ours where we can
