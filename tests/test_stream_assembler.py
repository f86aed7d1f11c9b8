"""The stream assembler (apps/stream_assembler.py) without a server: a Response stream in, typed events out. Tool-call
text is held back with its logprobs, text before and after a call, whitespace around calls, call limits, text held
upstream by a stop string, and the end; every completion token's logprob in exactly one event."""
import pytest

import specedge
from specedge.apps.stream_assembler import Call, End, StreamAssembler, Text, assemble
from specedge.apps.tools import Tool
from specedge.models.tiny import write_tiny_gguf
from specedge.runtime.types import FinishReason, Response, TokenLogprob

WEATHER = Tool("get_weather", "The weather in a city", {"type": "object", "properties": {"city": {"type": "string"}}})
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def responses(pieces, reason=FinishReason.EOS):
    """One Response per piece (token i, logprob -i), then EOS (whose logprob is not the completion's)."""
    for i, text in enumerate(pieces):
        yield Response(text, 100 + i, False, 1.0, None, TokenLogprob(100 + i, -float(i), ()))
    if reason is FinishReason.EOS:
        yield Response("", 2, False, 1.0, reason, TokenLogprob(2, -99.0, ()))
    else:
        yield Response("", 100 + len(pieces), False, 1.0, reason, TokenLogprob(100 + len(pieces), -float(len(pieces)),
                                                                                ()))


def lps(event) -> list[float]:
    return [lp.logprob for lp in event.logprobs]


def shown(events) -> list:
    """Events as plain values: ("text", text, logprobs) / ("call", name, index, logprobs) / ("end", ...)."""
    out = []
    for e in events:
        if isinstance(e, Text):
            out.append(("text", e.text, lps(e)))
        elif isinstance(e, Call):
            out.append(("call", e.call.name, e.index, lps(e)))
        else:
            out.append(("end", e.reason, e.completion_tokens, e.tool_calls, lps(e)))
    return out


def test_call_text_is_held_back_with_its_logprobs_and_text_on_both_sides_goes_out():
    pieces = ["Sure. ", "<tool", '_call>\n{"name": "get_weather", ', '"arguments": {"city": "Paris"}}\n</tool_call>',
              " Done", "."]
    assert shown(assemble(responses(pieces), [WEATHER])) == [
        ("text", "Sure. ", [0.0]),
        ("call", "get_weather", 0, [-1.0, -2.0, -3.0]),  # "<tool" waited for its block and went with it
        ("text", " Done", [-4.0]), ("text", ".", [-5.0]),
        ("end", FinishReason.EOS, 6, 1, [])]  # EOS: not counted, its logprob dropped


def test_no_event_carries_a_logprob_before_its_text():
    """A piece that ends inside held-back text sends its logprob only when that text is sent (as content here:
    the block never became a call)."""
    a = StreamAssembler([WEATHER])
    out = [a.push(r) for r in responses(["Hi <tool", "_c", "hat> no"])]
    assert shown(out[0]) == [("text", "Hi ", [])]  # "Hi " went out, but its token's text ends in "<tool"
    assert shown(out[1]) == []
    assert shown(out[2]) == [("text", "<tool_chat> no", [0.0, -1.0, -2.0])]
    assert shown(a.finish()) == [("end", FinishReason.EOS, 3, 0, [])]


def test_whitespace_between_calls_is_held_until_text_and_dropped_at_the_end():
    pieces = ["\n", CALL, "\n", CALL.replace("Paris", "Rome"), "\n", "\n"]
    assert shown(assemble(responses(pieces), [WEATHER])) == [
        ("call", "get_weather", 0, [-1.0]), ("call", "get_weather", 1, [-3.0]),
        ("end", FinishReason.EOS, 6, 2, [0.0, -2.0, -4.0, -5.0])]  # no event sent their text: End carries them
    with_text = ["Sure.", "\n", CALL, "\n", "Done"]
    assert shown(assemble(responses(with_text), [WEATHER])) == [
        ("text", "Sure.", [0.0]), ("call", "get_weather", 0, [-2.0]),
        ("text", "\n\nDone", [-1.0, -3.0, -4.0]),  # the held newlines travel with their logprobs
        ("end", FinishReason.EOS, 5, 1, [])]


def test_without_tools_nothing_is_held():
    pieces = ["\n", CALL, "  "]
    assert shown(assemble(responses(pieces))) == [("text", "\n", [0.0]), ("text", CALL, [-1.0]),
                                                  ("text", "  ", [-2.0]), ("end", FinishReason.EOS, 3, 0, [])]


@pytest.mark.parametrize("parallel, max_calls, sent", [(True, None, 3), (False, None, 1), (True, 2, 2)])
def test_calls_over_the_limit_are_not_sent_and_their_logprobs_go_with_the_end(parallel, max_calls, sent):
    pieces = [CALL, CALL, CALL, "ok"]
    events = list(assemble(responses(pieces), [WEATHER], parallel=parallel, max_calls=max_calls))
    assert [e.index for e in events if isinstance(e, Call)] == list(range(sent))
    assert events[-1].tool_calls == sent and lps(events[-1]) == [-float(i) for i in range(sent, 3)]
    assert [e.text for e in events if isinstance(e, Text)] == ["ok"]


def test_a_call_cut_by_max_tokens_is_dropped_and_a_bare_json_call_is_found_at_the_end():
    cut = shown(assemble(responses(["Here. ", "<tool_call>\n{\"name\": \"get_"], FinishReason.LENGTH), [WEATHER]))
    assert cut == [("text", "Here. ", [0.0]), ("end", FinishReason.LENGTH, 3, 0, [-1.0, -2.0])]
    bare = shown(assemble(responses(['{"name": "get_weather", ', '"arguments": {"city": "Oslo"}}']), [WEATHER]))
    assert bare == [("call", "get_weather", 0, [0.0, -1.0]), ("end", FinishReason.EOS, 2, 1, [])]


def test_text_held_upstream_brings_its_logprobs_when_it_arrives_and_a_stop_string_leaves_them_to_the_end():
    """The decoder holds a stop string's (or an unfinished character's) text: its Responses carry "" until the
    text is released or dropped."""
    def stream():
        yield Response("Hi", 1, False, 1.0, None, TokenLogprob(1, -0.5, ()))
        yield Response("", 2, False, 1.0, None, TokenLogprob(2, -1.5, ()))  # "S" could begin "STOP"
        yield Response("Sx", 3, False, 1.0, None, TokenLogprob(3, -2.5, ()))  # it did not
        yield Response("", 4, False, 1.0, None, TokenLogprob(4, -3.5, ()))  # "ST"
        yield Response("", 5, False, 1.0, FinishReason.STOP, TokenLogprob(5, -4.5, ()))  # "STOP": dropped
    assert shown(assemble(stream(), [WEATHER])) == [("text", "Hi", [-0.5]), ("text", "Sx", [-1.5, -2.5]),
                                                    ("end", FinishReason.STOP, 5, 0, [-3.5, -4.5])]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "t.gguf", seed=0, n_layers=2, context=512)
    return specedge.Engine.open(str(path), backend="numpy", drafter="ngram", ctx=512)


def test_a_real_stream_with_a_stop_string_assembles_to_the_engine_answer(engine):
    """The tiny model's greedy answer, cut by a stop string taken from its middle: the events' text is the answer,
    every completion token's logprob is in exactly one event, in order, and End says why it stopped."""
    whole = engine.generate("The", max_tokens=24, temperature=0, logprobs=0)
    stop = whole.text[len(whole.text) // 2:][:3]
    assert stop.strip(), whole.text
    got = engine.generate("The", max_tokens=24, temperature=0, logprobs=0, stop=[stop])
    events = list(assemble(engine.stream("The", max_tokens=24, temperature=0, logprobs=0, stop=[stop])))
    end = events[-1]
    assert isinstance(end, End) and end.reason is FinishReason.STOP and end.completion_tokens == len(got.tokens)
    assert "".join(e.text for e in events[:-1]) == got.text and stop not in got.text
    assert [lp.token for e in events for lp in e.logprobs] == got.tokens
