"""`specedge chat` driven as a user would, in a pseudo-terminal (pexpect): multi-turn with KV reuse, every slash
command, Ctrl-C mid-answer then a turn that works, /save contents and --load, live drafter switch, the stats line,
a full context; on the tiny model (NumPy) and, marked real, on SmolLM2 (llama.cpp)."""
import json
import os
import re
import signal
import sys

import pexpect  # the dev extra installs it
import pytest

from specedge.models.tiny import tiny_config, tiny_weights, write_tiny_gguf

STATS = re.compile(r"\[([\d.]+) tok/s \| tau ([\d.]+) \| TTFT ([\d.]+) s \| prompt (\d+) tokens: (\d+) new "
                   r"\((?:\d+ tok/s|-)\), (\d+) reused \| (\d+) tokens, (\w+) \| ([^\]\s]+)\]")
SHAPE = dict(n_layers=6, d_model=256, n_heads=8, n_kv_heads=4, d_ff=512, context=4096, tied=False)


@pytest.fixture(scope="module")
def endless(tmp_path_factory):
    """A tiny model that never emits EOS (its head's EOS row is zero, so greedy never picks it): answers run to
    max_tokens, long enough to be interrupted."""
    cfg = tiny_config(**SHAPE)
    w = tiny_weights(cfg, seed=0)
    w["lm_head"][cfg.eos_ids[0]] = 0.0
    return write_tiny_gguf(tmp_path_factory.mktemp("chat") / "endless.gguf", weights=w, **SHAPE)


_CHILDREN: list = []


@pytest.fixture(autouse=True)
def _no_leftover_children():
    """A failing test must not leave a chat process running."""
    yield
    while _CHILDREN:
        child = _CHILDREN.pop()
        if child.isalive():
            child.close(force=True)


def spawn(*args, timeout=60):
    """The real program in a pty, with this environment (PYTHONPATH resolves specedge to the tree under test).
    SIGINT is ignored while spawning, as for a job a non-interactive shell starts with `&`: the chat must still
    answer Ctrl-C (it did not, and this test hung in CI started that way)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        child = pexpect.spawn(sys.executable, ["-m", "specedge.apps.cli", "chat", *map(str, args)],
                              env=dict(os.environ), encoding="utf-8", codec_errors="replace", timeout=timeout,
                              dimensions=(50, 400))
    finally:
        signal.signal(signal.SIGINT, previous)
    _CHILDREN.append(child)
    child.expect("Ctrl-D exits")
    child.expect("> ")
    return child


def turn(child, text):
    """Send a message; return the answer's stats line fields (the prompt is back when this returns)."""
    child.sendline(text)
    child.expect(STATS)
    m, answer = child.match, child.before
    child.expect("> ")
    return dict(text=answer, tok_s=float(m[1]), tau=float(m[2]), ttft=float(m[3]), prompt=int(m[4]), new=int(m[5]),
                reused=int(m[6]), tokens=int(m[7]), finish=m[8], drafter=m[9])


def turn_rest(child):
    """The stats of an answer already asked for (after what the test expected before it)."""
    child.expect(STATS)
    m = child.match
    child.expect("> ")
    return dict(prompt=int(m[4]), new=int(m[5]), reused=int(m[6]), tokens=int(m[7]), finish=m[8], drafter=m[9])


def command(child, text, expect):
    child.sendline(text)
    child.expect(expect)
    child.expect("> ")


@pytest.mark.slow
def test_a_runaway_answer_then_a_trimmed_turn(endless):
    """An answer that runs to the context limit (the model never ends its turn) is shortened at the next message,
    before the conversation's start is dropped; the cut is reported as the context limit, a max_tokens cut as such."""
    child = spawn(endless, "--backend", "numpy", "--drafter", "none", "--ctx", 512, "--temperature", 0)
    first = turn(child, "hello")  # no --max-tokens: to the limit
    assert first["finish"] == "length" and first["prompt"] + first["tokens"] >= 511
    assert "reached the context limit of 512 tokens" in child.before
    command(child, "/set max_tokens 16", r"\(max_tokens = 16\)")
    child.sendline("and then?")
    child.expect(r"\(context full: shortened the 1 longest answer \((\d+) tokens\) to 64 tokens to fit 512 tokens\)")
    assert int(child.match[1]) == first["tokens"]
    second = turn_rest(child)
    assert second["tokens"] == 16 and second["prompt"] < 200  # the first exchange kept, its answer shortened
    assert "stopped at max_tokens 16" in child.before
    child.sendline("/exit")
    child.expect(pexpect.EOF)


@pytest.mark.slow
def test_turns_slash_commands_save_and_load(endless, tmp_path):
    child = spawn(endless, "--backend", "numpy", "--max-tokens", 12, "--ctx", 1024)
    first = turn(child, "hello there")
    assert first == {**first, "reused": 0, "tokens": 12, "finish": "length", "drafter": "ngram"}
    assert first["new"] == first["prompt"] and first["tok_s"] > 0 and first["tau"] >= 1  # new + reused = prompt
    second = turn(child, "and again")
    assert second["reused"] > first["prompt"] // 2 and second["new"] < second["prompt"] - first["prompt"] + 8
    command(child, "/stats", r"session: 2 answers \(0 stopped\), 24 tokens")
    command(child, "/drafter magic", r"unknown drafter 'magic'.*\s+\(keeping drafter ngram\)")
    command(child, "/drafter none", r"\(drafter: none\)")
    assert turn(child, "third")["drafter"] == "plain"  # the stats line says plain decoding, not "none"
    command(child, f"/drafter model:{endless}", r"\(drafter: model:")
    assert turn(child, "fourth")["tau"] > 1  # the target drafting for itself: every draft token accepted
    command(child, "/set max_tokens 5", r"\(max_tokens = 5\)")
    command(child, "/set temperature -1", r"error: .*temperature")
    command(child, "/set", r"repeat_penalty = 1.1 \(specedge's default for sampled answers\)\s+dry_multiplier = 0.8 \(")
    assert turn(child, "short")["tokens"] == 5
    command(child, "/help", r"/drafter SPEC.*\n.*/set KEY VALUE")
    command(child, "/system You are terse.", r"system prompt set; conversation cleared")
    after = turn(child, "hi")
    assert after["prompt"] < second["prompt"]  # the conversation is gone, the system prompt is in
    saved = tmp_path / "chat.json"
    command(child, f"/save {saved}", r"saved 2 messages")
    command(child, "/reset", r"conversation cleared")
    command(child, "/nope", r"unknown command /nope")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    doc = json.loads(saved.read_text())
    assert doc["system"] == "You are terse." and doc["drafter"].startswith("model:") and doc["backend"] == "numpy"
    assert [m["role"] for m in doc["messages"]] == ["user", "assistant"] and doc["messages"][0]["content"] == "hi"
    assert doc["options"]["max_tokens"] == 5 and doc["totals"]["answers"] == 6

    child = spawn(endless, "--backend", "numpy", "--load", saved)
    child.sendline("/system")
    child.expect("You are terse.")
    resumed = turn(child, "continue")
    assert resumed["tokens"] == 5 and resumed["prompt"] > after["prompt"]  # saved options and messages are back
    child.sendeof()  # Ctrl-D exits
    child.expect(pexpect.EOF)


@pytest.mark.slow
def test_ctrl_c_stops_the_answer_keeps_the_conversation(endless, tmp_path):
    child = spawn(endless, "--backend", "numpy", "--drafter", "none", "--max-tokens", 3000)
    child.sendline("tell me everything")
    child.expect("tell me everything\r\n")
    child.read_nonblocking(size=1, timeout=30)  # the answer is streaming
    child.sendintr()
    child.expect(r"\[stopped\]")
    child.expect(STATS)
    assert child.match[8] == "cancelled" and 0 < int(child.match[7]) < 3000
    child.expect("> ")
    command(child, "/set max_tokens 6", r"max_tokens = 6")
    nxt = turn(child, "and now?")
    assert nxt["finish"] == "length" and nxt["tokens"] == 6 and nxt["reused"] > 0
    saved = tmp_path / "c.json"
    command(child, f"/save {saved}", "saved 4 messages")
    child.sendintr()  # Ctrl-C at the prompt: the first arms, the second exits
    child.expect("Ctrl-C again")
    child.sendintr()
    child.expect(pexpect.EOF)
    msgs = json.loads(saved.read_text())["messages"]
    assert msgs[1]["interrupted"] is True and msgs[1]["content"] and "interrupted" not in msgs[3]


def test_a_full_context_says_what_to_do_and_the_session_lives(endless):
    child = spawn(endless, "--backend", "numpy", "--ctx", 48, "--max-tokens", 8)
    child.sendline("word " * 60)
    child.expect(r"\(context full: the message is \d+ tokens and the answer needs room \(8 tokens\); that does not "
                 r"fit 48 tokens: shorten it.*the conversation is unchanged\)")
    child.expect("> ")
    assert turn(child, "hi")["finish"] == "length"
    child.sendline("/exit")
    child.expect(pexpect.EOF)


@pytest.mark.real
@pytest.mark.slow
def test_real_model_chat_in_a_terminal(tmp_path):
    from specedge.models.catalog import model_cache_dir
    if not (model_cache_dir(None) / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file():
        pytest.skip("the default model is not pulled: run `specedge pull smollm2-135m`")
    pytest.importorskip("llama_cpp")
    child = spawn("smollm2-135m", "--backend", "llamacpp", "--drafter", "ngram", "--temperature", 0, "--max-tokens", 24,
                  "--ctx", 2048, timeout=120)
    first = turn(child, "What is the capital of France?")
    answer = first["text"].split("\r\n", 1)[1].strip()  # after the echoed question
    assert answer and "\ufffd" not in answer
    second = turn(child, "And of Italy?")
    assert second["reused"] >= first["prompt"] - 1 and second["new"] < 30
    command(child, "/set max_tokens 600", "max_tokens = 600")
    child.sendline("Write a very long story about a dragon who learns to cook, with many chapters.")
    child.expect("chapters.\r\n")
    child.read_nonblocking(size=1, timeout=60)
    child.sendintr()
    child.expect(r"\[stopped\]")
    child.expect(STATS)
    assert child.match[8] == "cancelled"
    child.expect("> ")
    command(child, "/set max_tokens 16", "max_tokens = 16")
    command(child, "/drafter none", r"\(drafter: none\)")
    after = turn(child, "Thanks! Say goodbye.")
    assert after["drafter"] == "plain" and after["reused"] > second["prompt"]
    saved = tmp_path / "real.json"
    command(child, f"/save {saved}", "saved 8 messages")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    doc = json.loads(saved.read_text())
    assert doc["messages"][5]["interrupted"] is True and doc["drafter"] == "none"


def _real_model():
    from specedge.models.catalog import model_cache_dir
    if not (model_cache_dir(None) / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file():
        pytest.skip("the default model is not pulled: run `specedge pull smollm2-135m`")
    pytest.importorskip("llama_cpp")


@pytest.mark.real
@pytest.mark.slow
def test_real_model_answers_run_to_the_end_and_a_long_chat_keeps_going():
    """Defaults (issue 18): no --max-tokens, so a long answer runs past the old 128-token cap to the end of the turn
    (or where it starts repeating itself, or the 1024-token default, or the context limit); with a small --ctx the chat shortens its longest answers and drops its
    oldest turns instead of stopping."""
    _real_model()
    child = spawn("smollm2-135m", "--backend", "llamacpp", "--drafter", "ngram", "--temperature", 0, "--ctx", 2048,
                  timeout=300)
    story = turn(child, "Write a long story about a dragon, at least 300 words.")
    assert story["tokens"] > 128
    # the end of the turn, an answer that repeats itself (its own finish reason), the 1024-token default or the
    # context limit
    assert story["finish"] in ("eos", "stop", "repetition") or (
        story["finish"] == "length" and (story["tokens"] >= 1024 or story["prompt"] + story["tokens"] + 1 >= 2048))
    child.sendline("/exit")
    child.expect(pexpect.EOF)

    child = spawn("smollm2-135m", "--backend", "llamacpp", "--drafter", "ngram", "--temperature", 0, "--ctx", 512,
                  timeout=300)
    questions = ["Write a long story about a dragon, at least 300 words.", "Now tell me a long story about a knight.",
                 "And a long story about a wizard, please.", "One more long story, about a cat."]
    answers, trimmed = [], 0
    for q in questions:
        child.sendline(q)
        i = child.expect([r"\(context full: (shortened the \d+ longest answers? \([\d, ]+ tokens\) to \d+ tokens)?"
                          r"(?: and )?(dropped the (\d+) oldest messages)? to fit 512 tokens\)", STATS])
        if i == 0:
            assert child.match[1] or int(child.match[3]) % 2 == 0
            trimmed += 1
            child.expect(STATS)
        m = child.match
        answers.append((int(m[4]), int(m[7]), m[8]))
        child.expect("> ")
    assert trimmed > 0 and all(tokens > 0 for _, tokens, _ in answers)  # trimmed; every message answered
    assert all(f in ("eos", "stop", "repetition") or p + t + 1 >= 512 for p, t, f in answers)  # length: the limit
    child.sendline("/stats")
    child.expect(r"session: 4 answers")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
