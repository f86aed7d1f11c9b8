"""A small desktop chat window over specedge.Engine (Qt via PySide6: `pip install specedge[gui]`).

    python examples/desktop_chat.py [MODEL] [--backend llamacpp|onnx|ik] [--drafter ngram] [--max-tokens 256]

Type a message, press Send (or Enter): the answer streams into the conversation; Stop cancels it between tokens;
New chat starts over. Each turn sends the whole conversation (the Engine reuses the cached prefix, so only the new
message is prefilled). With no --backend / --drafter the Engine runs the plan (the fastest lossless engine and
drafter measured on this machine; cached after the first use), as `specedge chat` does. The Engine loads once; each
answer runs in a worker thread that iterates Engine.stream and hands text to the UI thread through Qt signals
(widgets are only touched on the UI thread); Stop sets the call's cancel Event.

Linux needs Qt's X11 libraries besides PySide6 (checked at start, with the command that installs them):
    sudo apt install libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxcb-image0 libxcb-render-util0 \
        libxkbcommon-x11-0
"""
from __future__ import annotations

import argparse
import ctypes.util
import os
import sys
import threading

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import (QApplication, QHBoxLayout, QLabel, QLineEdit, QPlainTextEdit, QPushButton,
                               QVBoxLayout, QWidget)

from specedge import Engine

# Qt's xcb platform plugin aborts the process (no exception to catch) when one of these is missing: check first.
SYSTEM_LIBRARIES = {"xcb-cursor": "libxcb-cursor0", "xcb-icccm": "libxcb-icccm4", "xcb-keysyms": "libxcb-keysyms1",
                    "xcb-image": "libxcb-image0", "xcb-render-util": "libxcb-render-util0",
                    "xkbcommon-x11": "libxkbcommon-x11-0"}


def missing_system_packages(find=ctypes.util.find_library) -> list[str]:
    """The Debian/Ubuntu packages of Qt's X11 libraries that this Linux machine lacks ([] elsewhere, or offscreen)."""
    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM", "").startswith(("offscreen",
                                                                                                 "wayland")):
        return []
    return [pkg for lib, pkg in SYSTEM_LIBRARIES.items() if find(lib) is None]



class Bridge(QObject):
    """Signals emitted by the worker thread, delivered on the UI thread (queued connections)."""
    chunk = Signal(str)  # new answer text
    done = Signal(str, str)  # finish reason ("eos", "length", "stop", "cancelled", "error"), status line


class ChatWindow(QWidget):
    """A prompt box, Send, Stop and New chat buttons, the conversation and a status line."""

    def __init__(self, engine: Engine, max_tokens: int | None = None, **options) -> None:
        super().__init__()
        self.engine, self.options = engine, dict(options, max_tokens=max_tokens)
        self.cancel: threading.Event | None = None
        self.worker: threading.Thread | None = None
        self.finish_reason: str | None = None
        self.messages: list[dict] = []  # the conversation so far ({"role", "content"})
        self.answer = ""  # the answer being streamed (or the last one)
        self.setWindowTitle(f"specedge - {engine.name}")
        self.prompt = QLineEdit(placeholderText="Ask something and press Enter")
        self.send_button, self.stop_button = QPushButton("Send"), QPushButton("Stop")
        self.new_button = QPushButton("New chat")
        self.output = QPlainTextEdit(readOnly=True)
        how = "plain decoding" if engine.drafter_name == "none" else f"drafter {engine.drafter_name}"
        self.status = QLabel(f"{engine.backend_kind}, {how}")
        row = QHBoxLayout()
        for w in (self.prompt, self.send_button, self.stop_button, self.new_button):
            row.addWidget(w)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addWidget(self.output)
        layout.addWidget(self.status)
        self.bridge = Bridge()
        self.bridge.chunk.connect(self.on_chunk)
        self.bridge.done.connect(self.on_done)
        self.send_button.clicked.connect(self.send)
        self.prompt.returnPressed.connect(self.send)
        self.stop_button.clicked.connect(self.stop)
        self.new_button.clicked.connect(self.new_chat)
        self.stop_button.setEnabled(False)
        self.resize(720, 480)

    @property
    def busy(self) -> bool:
        return self.worker is not None

    @Slot()
    def send(self) -> None:
        text = self.prompt.text().strip()
        if not text or self.busy:
            return
        self.finish_reason, self.cancel, self.answer = None, threading.Event(), ""
        conversation = self.messages + [{"role": "user", "content": text}]
        try:  # bad options or a conversation over the context raise here, before anything runs
            chunks = self.engine.stream(self.engine.render_chat(conversation), cancel=self.cancel, **self.options)
        except ValueError as e:
            self.status.setText(f"error: {e}" + (" (New chat starts over)" if self.messages else ""))
            return
        self.messages = conversation
        self.prompt.clear()
        self.output.moveCursor(QTextCursor.MoveOperation.End)
        self.output.insertPlainText(("\n\n" if self.output.toPlainText() else "") + f"You: {text}\n\nAssistant: ")
        self.send_button.setEnabled(False)
        self.new_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        self.status.setText("answering...")
        self.worker = threading.Thread(target=self._work, args=(chunks,), daemon=True)
        self.worker.start()

    def _work(self, chunks) -> None:
        """Worker thread: no widget calls here, only signal emits."""
        reason = "length"
        try:
            for c in chunks:
                if c.text:
                    self.bridge.chunk.emit(c.text)
                reason = c.finish_reason or reason
        except Exception as e:  # shown in the status line; the Engine stays usable
            self.bridge.done.emit("error", f"error: {e}")
            return
        s = chunks.stats  # CallStats, set when the stream ends
        self.bridge.done.emit(reason, f"{reason}: {s.decode.n_generated} tokens, {s.decode.tokens_per_s:.1f} tok/s, "
                                      f"tau {s.decode.mean_accepted_length:.2f}, TTFT {s.ttft_s or 0.0:.3f} s")

    @Slot(str)
    def on_chunk(self, text: str) -> None:
        self.answer += text
        self.output.moveCursor(QTextCursor.MoveOperation.End)
        self.output.insertPlainText(text)

    @Slot(str, str)
    def on_done(self, reason: str, line: str) -> None:
        if self.worker is not None:
            self.worker.join()
        self.worker, self.finish_reason = None, reason
        if reason != "error" and (self.answer or reason != "cancelled"):
            self.messages.append({"role": "assistant", "content": self.answer})
        else:  # failed, or stopped before any text: the question goes too
            self.messages.pop()
        self.status.setText(line)
        self.send_button.setEnabled(True)
        self.new_button.setEnabled(True)
        self.stop_button.setEnabled(False)

    @Slot()
    def new_chat(self) -> None:
        if self.busy:
            return
        self.messages, self.answer = [], ""
        self.output.clear()
        self.engine.reset()

    @Slot()
    def stop(self) -> None:
        if self.cancel is not None:
            self.cancel.set()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Stream answers from specedge.Engine in a Qt window.")
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    ap.add_argument("--backend", default=None, help="default: the plan's (the fastest lossless engine here)")
    ap.add_argument("--drafter", default=None, help="default: the plan's")
    ap.add_argument("--max-tokens", type=int, default=None, help="default: to the end of the answer")
    ap.add_argument("--temperature", type=float, default=None, help="default: the model's; 0 = greedy")
    a = ap.parse_args(argv)
    missing = missing_system_packages()
    if missing:
        print(f"Qt needs system libraries this machine lacks; install them with:\n  sudo apt install "
              f"{' '.join(missing)}\n(or run headless with QT_QPA_PLATFORM=offscreen)", file=sys.stderr)
        return 2
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
                                                 or os.environ.get("QT_QPA_PLATFORM")):
        print("no display: run this in a desktop session (DISPLAY or WAYLAND_DISPLAY), or headless with "
              "QT_QPA_PLATFORM=offscreen", file=sys.stderr)
        return 2
    settings = {k: v for k, v in (("backend", a.backend), ("drafter", a.drafter)) if v is not None}
    engine = Engine.open(a.model, log=lambda m: print(m, file=sys.stderr), **settings)  # none given: the plan
    app = QApplication.instance() or QApplication(sys.argv[:1])
    window = ChatWindow(engine, a.max_tokens, temperature=a.temperature)
    window.show()
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
