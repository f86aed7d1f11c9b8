"""examples/desktop_chat.py runs offscreen on the tiny model: Send streams exactly Engine.generate's answer into
the window, the next turn carries the conversation, Stop cancels a long answer, the window is usable again
afterwards, New chat starts over; missing Qt system libraries are named with the command that installs them."""
import importlib.util
import os
import time
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported
pytest.importorskip("PySide6.QtWidgets", reason="the gui extra (PySide6-Essentials) is not installed")
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtTest import QTest  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

import specedge  # noqa: E402
from specedge.models.tiny import tiny_config, tiny_weights, write_tiny_gguf  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "desktop_chat.py"
SHAPE = dict(n_layers=2, d_model=64, context=4096, tied=False)


@pytest.fixture(scope="module")
def module():
    spec = importlib.util.spec_from_file_location("desktop_chat", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """A tiny model whose head never picks EOS, so answers run to max_tokens (long enough to Stop)."""
    cfg = tiny_config(**SHAPE)
    w = tiny_weights(cfg, seed=0)
    w["lm_head"][cfg.eos_ids[0]] = 0.0
    path = write_tiny_gguf(tmp_path_factory.mktemp("gui") / "t.gguf", weights=w, **SHAPE)
    return specedge.Engine.open(str(path), backend="numpy", drafter="ngram", ctx=4096)


@pytest.fixture(scope="module")
def app():
    return QApplication.instance() or QApplication([])


def wait(app, until, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "the window did not get there in time"
        app.processEvents()
        time.sleep(0.005)


@pytest.fixture
def window(module, engine, app):
    w = module.ChatWindow(engine, max_tokens=40)
    yield w
    w.stop()  # a failing test must not leave the worker decoding
    wait(app, lambda: not w.busy)
    w.close()


def test_send_streams_generates_answer_and_stop_cancels(window, engine, app):
    window.show()
    window.prompt.setText("hello there")
    QTest.mouseClick(window.send_button, Qt.MouseButton.LeftButton)
    assert window.busy and not window.send_button.isEnabled()
    wait(app, lambda: not window.busy)
    first = [{"role": "user", "content": "hello there"}]
    want = engine.generate(engine.render_chat(first), max_tokens=40)
    assert window.finish_reason == "length" and want.text
    assert window.answer == want.text and window.output.toPlainText() == f"You: hello there\n\nAssistant: {want.text}"
    assert window.status.text().startswith("length: 40 tokens") and window.prompt.text() == ""

    window.prompt.setText("and then?")  # the second turn sees the first
    window.send()
    wait(app, lambda: not window.busy)
    second = first + [{"role": "assistant", "content": want.text}, {"role": "user", "content": "and then?"}]
    assert window.answer == engine.generate(engine.render_chat(second), max_tokens=40).text
    assert window.messages == second + [{"role": "assistant", "content": window.answer}]
    QTest.mouseClick(window.new_button, Qt.MouseButton.LeftButton)
    assert window.messages == [] and window.output.toPlainText() == ""

    window.options["max_tokens"] = 4000
    window.prompt.setText("tell me everything")
    QTest.mouseClick(window.send_button, Qt.MouseButton.LeftButton)
    wait(app, lambda: window.output.toPlainText() != "")  # streaming
    QTest.mouseClick(window.stop_button, Qt.MouseButton.LeftButton)
    wait(app, lambda: not window.busy)
    assert window.finish_reason == "cancelled" and window.status.text().startswith("cancelled")
    n = int(window.status.text().split()[1])
    assert 0 < n < 4000 and window.send_button.isEnabled() and not window.stop_button.isEnabled()

    window.options["max_tokens"] = 40  # the engine serves the next answer normally
    window.new_chat()
    window.prompt.setText("hello there")
    window.send()  # the slot directly, as Enter in the prompt box does
    wait(app, lambda: not window.busy)
    assert window.answer == want.text


def test_invalid_options_show_an_error_and_start_nothing(module, engine, app):
    window = module.ChatWindow(engine, max_tokens=10, temperature=-1.0)
    window.prompt.setText("hi")
    window.send()
    assert not window.busy and "temperature" in window.status.text()
    window.close()


def test_missing_qt_system_libraries_are_named_with_the_install_command(module, monkeypatch, capsys):
    monkeypatch.setattr(module.sys, "platform", "linux")
    monkeypatch.setenv("QT_QPA_PLATFORM", "xcb")
    assert module.missing_system_packages(lambda lib: None if lib == "xcb-cursor" else "lib.so") == ["libxcb-cursor0"]
    assert len(module.missing_system_packages(lambda lib: None)) == len(module.SYSTEM_LIBRARIES)
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")  # headless: no X11 libraries needed
    assert module.missing_system_packages(lambda lib: None) == []
    monkeypatch.setenv("QT_QPA_PLATFORM", "xcb")
    monkeypatch.setattr(module, "missing_system_packages", lambda: ["libxcb-cursor0", "libxcb-icccm4"])
    assert module.main(["smollm2-135m"]) == 2  # before any model loads or Qt starts
    assert "sudo apt install libxcb-cursor0 libxcb-icccm4" in capsys.readouterr().err
