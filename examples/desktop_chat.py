"""A small desktop window that streams an answer from specedge.Engine (Qt via PySide6: `pip install specedge[gui]`).

    python examples/desktop_chat.py [MODEL] [--backend llamacpp|onnx] [--drafter ngram] [--max-tokens 256]

Type a question, press Send (or Enter): the answer streams into the window; Stop cancels it between tokens. The
Engine loads once; each answer runs in a worker thread that iterates Engine.stream and hands text to the UI thread
through Qt signals (widgets are only touched on the UI thread); Stop sets the call's cancel Event.
"""
from __future__ import annotations

import argparse
import sys
import threading

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import (QApplication, QHBoxLayout, QLabel, QLineEdit, QPlainTextEdit, QPushButton,
                               QVBoxLayout, QWidget)

from specedge import Engine


class Bridge(QObject):
    """Signals emitted by the worker thread, delivered on the UI thread (queued connections)."""
    chunk = Signal(str)  # new answer text
    done = Signal(str, str)  # finish reason ("eos", "length", "stop", "cancelled", "error"), status line


class ChatWindow(QWidget):
    """A prompt box, Send and Stop buttons, the streamed answer and a status line."""

    def __init__(self, engine: Engine, max_tokens: int | None = None, **options) -> None:
        super().__init__()
        self.engine, self.options = engine, dict(options, max_tokens=max_tokens)
        self.cancel: threading.Event | None = None
        self.worker: threading.Thread | None = None
        self.finish_reason: str | None = None
        self.setWindowTitle(f"specedge - {engine.name}")
        self.prompt = QLineEdit(placeholderText="Ask something and press Enter")
        self.send_button, self.stop_button = QPushButton("Send"), QPushButton("Stop")
        self.output = QPlainTextEdit(readOnly=True)
        self.status = QLabel(f"{engine.backend_kind}, drafter {engine.drafter_name}")
        row = QHBoxLayout()
        for w in (self.prompt, self.send_button, self.stop_button):
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
        self.output.clear()
        self.finish_reason, self.cancel = None, threading.Event()
        try:  # bad options raise here, on the UI thread, before anything runs
            chunks = self.engine.stream(self.engine.render_chat([{"role": "user", "content": text}]),
                                        cancel=self.cancel, **self.options)
        except ValueError as e:
            self.status.setText(f"error: {e}")
            return
        self.send_button.setEnabled(False)
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
        self.output.moveCursor(QTextCursor.MoveOperation.End)
        self.output.insertPlainText(text)

    @Slot(str, str)
    def on_done(self, reason: str, line: str) -> None:
        if self.worker is not None:
            self.worker.join()
        self.worker, self.finish_reason = None, reason
        self.status.setText(line)
        self.send_button.setEnabled(True)
        self.stop_button.setEnabled(False)

    @Slot()
    def stop(self) -> None:
        if self.cancel is not None:
            self.cancel.set()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Stream answers from specedge.Engine in a Qt window.")
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    ap.add_argument("--backend", default=None, help="default: the engine the model names")
    ap.add_argument("--drafter", default="ngram")
    ap.add_argument("--max-tokens", type=int, default=None, help="default: to the end of the answer")
    ap.add_argument("--temperature", type=float, default=None, help="default: the model's; 0 = greedy")
    a = ap.parse_args(argv)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    window = ChatWindow(Engine.open(a.model, backend=a.backend, drafter=a.drafter), a.max_tokens,
                        temperature=a.temperature)
    window.show()
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
