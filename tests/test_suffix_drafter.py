"""The suffix drafter, a memory of past answers (runtime/drafters/suffix.py, suffix_index.py): the index against brute
force, the frequency walk, the bounded thread-safe memory, lossless decoding (greedy: identical to plain; sampled: the
target's distribution), a repeated ask drafted from the earlier answer, the +suffix combination and its spec."""
import json
import threading

import numpy as np
import pytest
from click.testing import CliRunner

from specedge.apps.cli import cli
from specedge.models.gguf_in import open_gguf
from specedge.models.tiny import write_tiny_gguf
from specedge.runtime.backends.fake import MarkovBackend, random_markov_table
from specedge.runtime.backends.numpy_ref import NumpyBackend
from specedge.runtime.decode import decode
from specedge.runtime.drafters import (BUILDERS, DrafterInputs, ModelSpec, NgramSpec, SuffixSpec, build_drafter,
                                       parse_drafter)
from specedge.runtime.drafters.base import Drafter
from specedge.runtime.drafters.ngram import NgramDrafter
from specedge.runtime.drafters.suffix import KIND, LongerDrafter, SuffixDrafter, walk
from specedge.runtime.drafters.suffix_index import SEP, SuffixIndex, SuffixMemory
from specedge.runtime.request import Request, Speculation
from specedge.runtime.stats import DecodeStats
from specedge.runtime.types import Draft, SamplingParams
from test_tree_decode import assert_matches_target, sampled_counts

GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_gguf(tmp_path_factory.mktemp("suffix") / "t.gguf", seed=0, n_layers=2)
    return path, NumpyBackend(open_gguf(path).load_weights(), np.float64)


def run(target, prompt, drafter=None, n=48, k=4, params=GREEDY, stats=None, seed=0):
    return [e.token for e in decode(target, np.asarray(prompt, np.int32), Speculation(drafter, k=k),
                                    Request(params, max_tokens=n, seed=seed), stats=stats)]


def brute_force(corpus, context, max_depth):
    """(m, sorted ends): the longest suffix of context (<= max_depth) that occurs in corpus with a follower."""
    best, ends = 0, []
    for e in range(len(corpus) - 1):
        if corpus[e + 1] == SEP:
            continue
        m = 0
        while m < min(max_depth, len(context)) and e - m >= 0 and corpus[e - m] == context[-1 - m]:
            m += 1
        if m > best:
            best, ends = m, [e]
        elif m == best and m > 0:
            ends.append(e)
    return best, (ends if best else [])


@pytest.mark.parametrize("vocab, max_depth", [(3, 24), (5, 4), (12, 6), (2, 40)])
def test_the_index_finds_the_longest_suffix_like_brute_force(vocab, max_depth):
    rng = np.random.default_rng(vocab * 10 + max_depth)
    for trial in range(4):
        seq = rng.integers(0, vocab, 300).astype(np.int32)
        seq[rng.integers(0, 300, 6)] = SEP  # entries, as a memory holds them
        index = SuffixIndex(seq[:5])
        n = 5
        while n < len(seq):
            ctx = rng.integers(0, vocab, int(rng.integers(1, 50))).astype(np.int32)
            m, ends = index.matches(ctx[::-1], max_depth)
            assert (m, sorted(ends.tolist())) == brute_force(seq[:n].tolist(), ctx.tolist(), max_depth), (trial, n)
            step = int(rng.integers(1, 9))
            index.extend(seq[n:n + step])
            n += step


def test_followers_end_at_a_separator_or_the_buffer():
    index = SuffixIndex(np.array([5, 6, 7, SEP, 6, 7, 8], np.int32))
    assert index.followers(np.array([1, 4, 5]), 3).tolist() == [[7, SEP, SEP], [7, 8, SEP], [8, SEP, SEP]]


def test_the_docstring_example_and_the_walk():
    mem = SuffixMemory()
    for e in ([5, 6, 7, 8], [5, 6, 7, 9], [5, 6, 7, 8]):
        mem.add(e)
    d = SuffixDrafter(mem)
    ctx = np.array([1, 5, 6, 7], np.int32)
    d.begin(ctx)
    draft = d.propose(ctx, 4, GREEDY, None)
    assert draft.tokens.tolist() == [8] and draft.q is None and draft.kind == KIND + 3
    rows = np.array([[1, 2, 3], [1, 2, 4], [1, 2, 4], [1, 9, 9], [SEP, SEP, SEP]])
    assert walk(rows, 3, 0.1)[0].tolist() == [1, 2, 4]  # p 4/5, 3/4, 2/3: product 0.4
    assert walk(rows, 3, 0.5)[0].tolist() == [1, 2]  # 0.4 < 0.5: the third token is not drafted
    assert walk(rows, 3, 0.9)[0].tolist() == []


def test_a_short_match_drafts_little_and_no_match_drafts_nothing():
    mem = SuffixMemory()
    mem.add([9, 1, 2, 3, 4, 5, 6])
    d = SuffixDrafter(mem, alpha=1.0)
    for ctx, want in (([7, 9], [1]), ([0, 9, 1], [2, 3]), ([9, 1, 2, 3], [4, 5, 6]), ([8], [])):
        ctx = np.array(ctx, np.int32)
        d.begin(ctx)
        assert d.propose(ctx, 8, GREEDY, None).tokens.tolist() == want  # ceil(alpha * m) tokens at most
    assert d.propose(np.array([9, 1], np.int32), 0, GREEDY, None).k == 0


def test_the_current_request_is_searched_as_it_grows():
    d = SuffixDrafter()  # an empty memory: only the request
    seq = np.array([4, 1, 2, 3, 0, 4, 1, 2], np.int32)
    d.begin(seq[:5])
    assert d.propose(seq[:5], 4, GREEDY, None).k == 0
    assert d.propose(seq, 4, GREEDY, None).tokens.tolist() == [3, 0, 4]  # [4, 1, 2] matched: 3 followers
    assert d.from_memory == 0


def test_the_memory_is_bounded_evicts_the_oldest_and_folds_a_chat_into_one_entry():
    mem = SuffixMemory(budget=10)
    mem.add([1, 2, 3, 4])
    mem.add([5, 6, 7, 8])
    mem.add([5, 6, 7, 8, 9])  # extends the newest entry (the next turn, the same ask): replaces it
    assert [e.tolist() for e in mem.entries] == [[1, 2, 3, 4], [5, 6, 7, 8, 9]]
    mem.add([10, 11, 12])  # 12 tokens > 10: the oldest entry goes
    assert [e.tolist() for e in mem.entries] == [[5, 6, 7, 8, 9], [10, 11, 12]]
    mem.add(list(range(20, 40)))  # longer than the budget: its last 10 tokens
    assert [e.tolist() for e in mem.entries] == [list(range(30, 40))] and mem.n_tokens == 10
    assert mem.snapshot().tokens.tolist() == list(range(30, 40)) + [SEP]
    with pytest.raises(ValueError, match="budget"):
        SuffixMemory(0)


def test_the_memory_is_thread_safe():
    mem = SuffixMemory(budget=500)
    rng = np.random.default_rng(0)
    entries = [rng.integers(0, 50, int(rng.integers(5, 40))).tolist() for _ in range(200)]
    errors = []

    def work(part):
        try:
            for e in part:
                mem.add(e)
                index = mem.snapshot()
                index.matches(np.array(e[::-1], np.int32), 24)  # a reader on a consistent index
        except Exception as exc:  # pragma: no cover - the assertion below reports it
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(entries[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and mem.added == 200 and mem.n_tokens <= 500
    held = mem.entries
    assert mem.snapshot().tokens.tolist() == [t for e in held for t in (*e.tolist(), SEP)]


def test_greedy_output_equals_plain_greedy(tiny):
    _, target = tiny
    drafter = SuffixDrafter()
    drafted = 0
    for prompt in ([1, 5, 9, 2, 1, 5, 9], [7, 7, 7, 3, 7, 7], [3, 4], [1, 5, 9, 2]):
        for k in (1, 4, 8):
            st = DecodeStats()
            assert run(target, prompt, drafter, k=k, stats=st) == run(target, prompt)
            drafted += st.n_drafted
    assert drafted > 0 and drafter.from_memory > 0  # the later calls drafted from the earlier ones


def test_a_second_identical_ask_is_drafted_from_the_first_answer(tiny):
    _, target = tiny
    prompt = [11, 42, 7, 99, 3, 18, 64, 5]
    plain = run(target, prompt, n=64)
    drafter = SuffixDrafter()
    first, second = DecodeStats(), DecodeStats()
    assert run(target, prompt, drafter, n=64, k=8, stats=first) == plain
    assert [e.tolist() for e in drafter.memory.entries] == [prompt + plain]  # finish: prompt + every emitted token
    assert run(target, prompt, drafter, n=64, k=8, stats=second) == plain
    tau = second.n_emitted / second.n_target_forwards
    # 64 tokens in 8 forwards (measured 8.5 tokens per forward; the answer repeats itself, so a 24-token match can
    # have two followers, and one round keeps 4 of its 8)
    assert tau >= 6 and second.n_accepted >= 0.9 * second.n_drafted
    assert tau > first.n_emitted / first.n_target_forwards


def test_sampled_output_follows_the_target_with_a_shared_memory():
    """Every trial shares one memory, filled by the earlier trials' sampled answers (as a server's calls are):
    drafts come from it, and the first tokens still follow the target's distribution."""
    params = SamplingParams(temperature=1.0)
    P = random_markov_table(5, seed=3, scale=1.0)
    prompt = np.array([0, 1, 0, 2, 0], dtype=np.int32)
    memory, drafters = SuffixMemory(budget=4096), []

    def new():
        drafters.append(SuffixDrafter(memory, p_min=0.0))
        return drafters[-1]

    counts = sampled_counts(MarkovBackend(P), prompt, params, new, trials=6000, seed=13, n=3, k=3)
    assert sum(d.from_memory for d in drafters) > 3000
    assert_matches_target(counts, P, prompt, params, 3, 6000)


class Fixed(Drafter):
    """Proposes a fixed draft (cut to k) and records its calls."""

    def __init__(self, tokens):
        self.tokens, self.calls, self.accepted = np.array(tokens, np.int32), 0, []

    def propose(self, context, k, params, rng):
        self.calls += 1
        return Draft(self.tokens[:k], None, 1)

    def accept(self, n_accepted, next_token):
        self.accepted.append(n_accepted)


def test_the_combination_takes_the_longer_draft_and_skips_the_other_when_the_suffix_fills_k():
    mem = SuffixMemory()
    mem.add([1, 2, 3, 4, 5, 6, 7, 8])
    other = Fixed([9, 9, 9])
    d = LongerDrafter(SuffixDrafter(mem), other)
    ctx = np.array([0, 1, 2, 3], np.int32)
    d.begin(ctx)
    assert d.propose(ctx, 2, GREEDY, None).tokens.tolist() == [4, 5] and other.calls == 0  # k filled
    assert d.propose(ctx, 4, GREEDY, None).tokens.tolist() == [4, 5, 6] and other.calls == 1  # 3 against 3: suffix
    ctx = np.array([0, 2], np.int32)
    d.begin(ctx)
    assert d.propose(ctx, 4, GREEDY, None).tokens.tolist() == [9, 9, 9] and d.source == 1  # 1 against 3
    d.accept(2, 0)
    assert other.accepted == [2] and d.rounds == {"suffix": 2, "other": 1} and d.name == "drafter+suffix"


def test_combined_with_ngram_greedy_equals_plain(tiny):
    _, target = tiny
    spec = parse_drafter("ngram+suffix:1024")
    drafter = build_drafter(spec, DrafterInputs(target))
    assert isinstance(drafter, LongerDrafter) and isinstance(drafter.other, NgramDrafter)
    assert drafter.suffix.memory.budget == 1024 and drafter.name == "ngram+suffix"
    for prompt in ([1, 5, 9, 2, 1, 5, 9], [3, 4], [1, 5, 9, 2, 1, 5, 9]):
        assert run(target, prompt, drafter, k=6) == run(target, prompt)
    assert drafter.rounds["suffix"] > 0 and drafter.rounds["other"] > 0


def test_the_spec_round_trips_and_bad_specs_fail_with_the_fix():
    assert parse_drafter("suffix") == SuffixSpec() and str(SuffixSpec(4096)) == "suffix:4096"
    assert parse_drafter("ngram+suffix") == NgramSpec(suffix=65536)
    assert parse_drafter("model:x+conf+lookup+suffix:512") == parse_drafter(str(parse_drafter(
        "model:x+conf+lookup+suffix:512")))
    assert parse_drafter("model:x+suffix").suffix == 65536 and isinstance(parse_drafter("model:x+suffix"), ModelSpec)
    for bad, msg in (("suffix+ngram", "ngram\\+suffix"), ("suffix:12", "256..16777216"), ("suffix+conf", "drop"),
                     ("recycle+suffix", "follows ngram"), ("model:x+tree+suffix", "chain model"),
                     ("model:x+suffix+tree", "without a draft stop, lookup or suffix"),
                     ("ngram+suffix+suffix", "once")):
        with pytest.raises(ValueError, match=msg):
            parse_drafter(bad)
    assert set(BUILDERS) >= {SuffixSpec.kind}
    huge = MarkovBackend(random_markov_table(4, seed=0))
    huge.config = type(huge.config)(**{**huge.config.__dict__, "vocab_size": 1 << 22})
    with pytest.raises(ValueError, match="token ids up to 2097150.*use ngram"):
        build_drafter(SuffixSpec(), DrafterInputs(huge))


def test_the_cli_runs_it_identical_to_plain(tiny):
    path, _ = tiny
    r = CliRunner().invoke(cli, ["generate", str(path), "the cat sat on the mat, the cat", "--backend", "numpy",
                                 "--drafter", "suffix:4096", "--max-tokens", "16", "--json", "--baseline",
                                 "--temperature", "0"])
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout.strip().splitlines()[-1])["stats"]
    assert stats["identical_to_baseline"] is True and stats["drafter"] == "suffix:4096"


def test_the_engine_drafts_a_repeated_ask_from_its_memory(tiny):
    """The memory lives in the decoder's drafter, so every call of one Engine (the server's calls on one model, a
    chat's turns) adds its prompt and answer and drafts from the earlier ones."""
    import specedge
    path, target = tiny
    eng = specedge.Engine.open(str(path), backend="numpy", drafter="suffix", k=8, adaptive_k=False, ctx=256)
    ids = eng.encode("the cat sat on the mat")
    want = run(target, ids, n=48)
    calls = [eng.generate(ids, max_tokens=48, temperature=0, repetition_stop=False) for _ in range(2)]
    for c in calls:
        assert c.tokens == (want[:len(c.tokens)]) and c.stats.drafter == "suffix"
    first, second = (c.stats.decode for c in calls)
    assert second.n_generated == 48 and second.n_emitted / second.n_target_forwards >= 6
    assert second.n_target_forwards < first.n_target_forwards and eng.drafter.memory.added == 2


def test_the_perf_script_runs_every_drafter_and_checks_the_answers(tiny, capsys):
    from specedge.perf import suffix_memory
    path, _ = tiny
    rows = suffix_memory.main(["--targets", f"numpy:{path}", "--prompts", "1", "--turns", "2", "--max-tokens", "12",
                               "--threads", "1", "--ctx", "256", "--drafters", "none", "suffix"])
    assert [(r["scenario"], r["drafter"]) for r in rows] == [("repeat", "none"), ("repeat", "suffix"),
                                                              ("chat", "none"), ("chat", "suffix")]
    assert [r["identical"] for r in rows] == ["1/1", "1/1", "2/2", "2/2"]
    assert rows[1]["tau"] > 1 and rows[0]["tau"] == 1 and "| repeat | suffix |" in capsys.readouterr().out


def test_a_suffix_tree_branches_where_the_followers_differ():
    from specedge.runtime.drafters.suffix import grow
    rows = np.array([[1, 2, 7], [1, 3, SEP], [1, 2, 7], [4, 5, 6]])
    tree = grow(rows, 16, 0.0)
    # root -> 1 (3/4) -> 2 (2/3) -> 7; 1 -> 3 (1/3); root -> 4 (1/4) -> 5 -> 6; breadth-first
    assert tree.tokens.tolist() == [1, 4, 2, 3, 5, 7, 6] and tree.parents.tolist() == [0, 0, 1, 1, 2, 3, 5]
    assert grow(rows, 3, 0.0).tokens.tolist() == [1, 2, 7]  # best first: 1 (0.75), 2 (0.5), 7 (0.5), not 4 (0.25)
    assert grow(rows, 16, 0.3).tokens.tolist() == [1, 2, 7]  # paths valued below 0.3 are not grown
    assert grow(rows[:0], 16, 0.0).n == 0


def test_suffix_trees_are_lossless_and_a_repeated_ask_is_accepted_deep(tiny):
    _, target = tiny
    spec = parse_drafter("suffix+tree:12")
    assert spec == SuffixSpec(tree=12) and str(spec) == "suffix+tree:12" and spec.is_tree
    drafter = build_drafter(spec, DrafterInputs(target))
    prompt = [11, 42, 7, 99, 3, 18, 64, 5]
    for p in ([1, 5, 9, 2, 1, 5, 9], [3, 4], prompt):
        assert run(target, p, drafter) == run(target, p)
    st = DecodeStats()
    assert run(target, prompt, drafter, n=64, stats=st) == run(target, prompt, n=64)  # the ask again
    assert st.n_emitted / st.n_target_forwards >= 8  # trees of 12 along the remembered answer
    with pytest.raises(ValueError, match="tree"):
        build_drafter(spec, DrafterInputs(MarkovBackend(random_markov_table(4, seed=0))))


def test_sampled_suffix_trees_follow_the_target():
    from test_tree_decode import TreeMarkovBackend
    params = SamplingParams(temperature=1.0)
    P = random_markov_table(5, seed=3, scale=1.0)
    prompt = np.array([0, 1, 0, 2, 0], dtype=np.int32)
    memory = SuffixMemory(budget=4096)
    from specedge.runtime.drafters.suffix import SuffixTreeDrafter
    counts = sampled_counts(TreeMarkovBackend(P), prompt, params,
                            lambda: SuffixTreeDrafter(SuffixDrafter(memory, p_min=0.0), 6), trials=6000, seed=14, n=3)
    assert memory.added == 6000
    assert_matches_target(counts, P, prompt, params, 3, 6000)


def test_sampled_suffix_with_a_draft_model_follows_the_target():
    """model+suffix mixes drafts without q (the memory's, rule 1.2) and with q (the model's, rule 1.1)."""
    from specedge.runtime.drafters.model import ModelDrafter
    params = SamplingParams(temperature=1.0)
    P, Q = random_markov_table(5, seed=3, scale=1.0), random_markov_table(5, seed=4, scale=1.0)
    prompt = np.array([0, 1, 0, 2, 0], dtype=np.int32)
    memory, drafters = SuffixMemory(budget=4096), []

    def new():
        drafters.append(LongerDrafter(SuffixDrafter(memory, p_min=0.0), ModelDrafter(MarkovBackend(Q))))
        return drafters[-1]

    counts = sampled_counts(MarkovBackend(P), prompt, params, new, trials=6000, seed=15, n=3, k=3)
    rounds = {part: sum(d.rounds[part] for d in drafters) for part in ("suffix", "other")}
    assert rounds["suffix"] > 1000 and rounds["other"] > 1000
    assert_matches_target(counts, P, prompt, params, 3, 6000)
