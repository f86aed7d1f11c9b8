"""`specedge chat` past its context: the oldest turns are dropped in pairs (system prompt kept) with one line on
stderr, /save keeps them marked, and a message too long on its own is refused with the conversation unchanged."""
import json

import pytest
from click.testing import CliRunner

import specedge
from specedge.apps.chat_cmd import ChatLoop
from specedge.apps.chat_state import Conversation, answer_reserve, parse_option
from specedge.apps.cli import cli
from specedge.models.tiny import write_tiny_gguf

CTX = 160


@pytest.fixture(scope="module")
def tiny(tiny_gguf):
    return tiny_gguf  # tests/conftest.py, shared (read-only)


def test_answer_reserve():
    assert answer_reserve(4096, None) == 512 and answer_reserve(2048, None) == 512
    assert answer_reserve(512, None) == 128 and answer_reserve(512, 16) == 16


def test_set_none_restores_the_defaults():
    opts = parse_option("max_tokens", "64", {})
    assert parse_option("max_tokens", "none", opts) == {"max_tokens": None}
    assert parse_option("temperature", "0", {}) == {"temperature": 0.0}
    with pytest.raises(ValueError, match="seed takes a int"):
        parse_option("seed", "none", {})
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        parse_option("max_tokens", "0", {})


def test_set_penalties_and_logit_bias():
    opts = parse_option("presence_penalty", "0.5", {})
    opts = parse_option("logit_bias", "15+1 7-inf", parse_option("frequency_penalty", "-0.25", opts))
    assert opts == {"presence_penalty": 0.5, "frequency_penalty": -0.25, "logit_bias": {15: 1.0, 7: float("-inf")}}
    assert parse_option("logit_bias", "none", opts)["logit_bias"] == {}
    with pytest.raises(ValueError, match="TOKEN_ID\\+BIAS.*/set logit_bias 15043\\+1"):
        parse_option("logit_bias", "15=1", {})
    with pytest.raises(ValueError, match="presence_penalty must be a finite number"):
        parse_option("presence_penalty", "inf", {})


@pytest.mark.slow
def test_a_long_conversation_keeps_going_dropping_the_oldest_turns(tiny, tmp_path, capsys):
    engine = specedge.Engine.open(str(tiny), backend="numpy", drafter="ngram", ctx=CTX)
    conv = Conversation("You are terse.", [], {"max_tokens": 8, "temperature": 0})
    loop = ChatLoop(engine, conv)
    reserve = answer_reserve(CTX, 8)
    for i in range(14):
        loop.answer(f"message {i}: tell me about the cat and the mat")
        assert conv.render()[0] == {"role": "system", "content": "You are terse."}
        assert loop.last.prompt_tokens + reserve <= CTX  # what the model saw fit with room for the answer
        assert conv.messages[-2]["content"].startswith(f"message {i}:") and conv.messages[-1]["role"] == "assistant"
    err = capsys.readouterr().err
    assert err.count("[") == 14 and "error" not in err  # every message was answered
    assert f"(context full: dropped the 2 oldest messages to fit {CTX} tokens)" in err
    assert conv.start > 0 and conv.start % 2 == 0 and len(conv.messages) == 28  # whole pairs; all kept for /save
    assert conv.render()[1]["role"] == "user"
    saved = tmp_path / "c.json"
    conv.save(saved, engine, loop.totals)
    msgs = json.loads(saved.read_text())["messages"]
    assert len(msgs) == 28 and all(m.get("dropped") for m in msgs[:conv.start])
    assert not any(m.get("dropped") for m in msgs[conv.start:])
    back = Conversation.load(saved)
    assert back.start == 0 and len(back.messages) == 28 and not any("dropped" in m for m in back.messages)


def test_a_message_too_long_alone_is_refused_and_the_conversation_stays(tiny, capsys):
    engine = specedge.Engine.open(str(tiny), backend="numpy", drafter="ngram", ctx=CTX)
    conv = Conversation(None, [], {"max_tokens": 8, "temperature": 0})
    loop = ChatLoop(engine, conv)
    loop.answer("hello there")
    before = [dict(m) for m in conv.messages]
    loop.answer("word " * 200)
    assert conv.messages == before and conv.start == 0
    assert "does not fit 160 tokens: shorten it" in capsys.readouterr().err
    loop.answer("and now a short one")
    assert len(conv.messages) == 4


def test_through_the_cli_with_a_small_ctx(tiny):
    lines = [f"question {i} about the cat that sat on the mat" for i in range(10)] + ["/exit"]
    r = CliRunner().invoke(cli, ["chat", str(tiny), "--backend", "numpy", "--drafter", "ngram", "--ctx", CTX,
                                 "--max-tokens", 8, "--system", "Be brief."], input="\n".join(lines) + "\n")
    assert r.exit_code == 0, r.output
    assert r.stderr.count("tau") == 10 and "context full: dropped the" in r.stderr and "error" not in r.stderr


def test_a_runaway_answer_is_shortened_before_the_conversations_start_is_dropped(tiny, tmp_path, capsys):
    engine = specedge.Engine.open(str(tiny), backend="numpy", drafter="ngram", ctx=CTX)
    conv = Conversation(None, [], {"max_tokens": 8, "temperature": 0})
    loop = ChatLoop(engine, conv)
    loop.answer("hi")  # a short first exchange
    conv.options["max_tokens"] = None
    loop.answer("tell me everything about the cat")  # the tiny model never ends its turn: it runs to the limit
    err = capsys.readouterr().err
    assert loop.last.finish_reason.value == "length" and "reached the context limit of 160 tokens" in err
    runaway = conv.messages[-1]["content"]
    conv.options["max_tokens"] = 8
    loop.answer("and the mat?")
    err = capsys.readouterr().err
    assert "(context full: shortened the 1 longest answer (" in err and "dropped" not in err
    assert conv.start == 0 and conv.render()[0]["content"] == "hi"  # the conversation's start is kept
    assert conv.messages[3]["content"] == runaway and conv.messages[3]["view"].endswith(" [...]")
    assert loop.last.prompt_tokens + answer_reserve(CTX, 8) <= CTX
    assert "stopped at max_tokens 8" in err  # a cut by max_tokens is not called the context limit
    saved = tmp_path / "c.json"
    conv.save(saved, engine, loop.totals)
    back = Conversation.load(saved).messages[3]
    assert back["content"] == runaway and "view" not in back  # whole again


def test_a_model_without_a_chat_template_gets_capped_answers_and_says_why(tmp_path):
    """A GGUF that ships no tokenizer.chat_template (like the catalogue's gemma3-270m base model)."""
    tiny = write_tiny_gguf(tmp_path / "base.gguf", seed=0, context=1024, chat_template=None)
    r = CliRunner().invoke(cli, ["chat", str(tiny), "--backend", "numpy", "--drafter", "none", "--ctx", 1024],
                           input="hello\n/exit\n")
    assert r.exit_code == 0, r.output
    assert "ships no chat template" in r.stderr and "capped at 256 tokens" in r.stderr
    assert "plain decoding" in r.stderr and "256 tokens, length" in r.stderr
    r = CliRunner().invoke(cli, ["chat", str(tiny), "--backend", "numpy", "--drafter", "none", "--ctx", 1024,
                                 "--max-tokens", 8], input="hello\n/exit\n")
    assert "ships no chat template" not in r.stderr and "8 tokens, length" in r.stderr  # an explicit cap wins


def test_the_stats_line_says_prompt_speed_and_first_token_time():
    from specedge.apps.chat_state import stats_line
    from specedge.runtime.stats import CallStats, DecodeStats
    from specedge.runtime.types import FinishReason, SamplingParams
    d = DecodeStats(n_prefilled=720, prefill_s=2.4, decode_s=1.0, n_generated=50, n_target_forwards=50,
                    n_emitted=50)
    line = stats_line(CallStats(d, 721, FinishReason.EOS, "none", SamplingParams(), ttft_s=2.45))
    assert line.startswith("[50.0 tok/s | tau 1.00 | TTFT 2.450 s | prompt 721 tokens: 721 new (300 tok/s), 0 reused")
    again = CallStats(DecodeStats(n_generated=5), 721, FinishReason.EOS, "ngram", SamplingParams(),
                      reused_prompt_tokens=720, ttft_s=0.02)
    assert "prompt 721 tokens: 1 new (-), 720 reused" in stats_line(again)  # nothing prefilled: no rate


def test_saved_chats_are_private(tiny, tmp_path):
    """/save writes the transcript 0600 (owner only) whatever the umask, replacing an older world-readable file."""
    import os
    import stat
    new, old, missing = tmp_path / "new.json", tmp_path / "old.json", tmp_path / "no-such-dir" / "c.json"
    old.write_text("{}")
    old.chmod(0o644)
    saves = "".join(f"/save {p}\n" for p in (new, old, missing))
    mask = os.umask(0)  # the widest: files would be created 0666 by open()
    try:
        r = CliRunner().invoke(cli, ["chat", str(tiny), "--backend", "numpy", "--drafter", "none", "--ctx", CTX,
                                     "--max-tokens", 4], input=f"hello\n{saves}/exit\n")
    finally:
        os.umask(mask)
    assert r.exit_code == 0, r.output
    for p in (new, old):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
        assert len(json.loads(p.read_text())["messages"]) == 2
    assert f"error: cannot write {missing}" in r.output and not missing.parent.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.json", "old.json"]  # no temporary files left
