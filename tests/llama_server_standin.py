"""A stand-in for upstream llama.cpp's `llama-server` (tests/test_bench_server.py): the same flags, /health and a
streamed /v1/chat/completions whose last chunk carries llama-server's `timings`; no model runs.

install(bin_dir) writes an executable `llama-server` that runs this file. Behaviour, from the environment (the
bench passes its environment to the server):
    STANDIN_LOG    a file: one JSON line per start ({"argv", "pid"}) and per request ({"pid", "body"})
    STANDIN_MODE   ok (default) | exit (prints an error and exits 1 at once) | never-ready (/health answers 503
                   for ever, as while loading) | spec-differs (with --spec-default, the second prompt's answer
                   differs from plain's) | crash (dies with an assertion message on its second request)
The answer to a message is its words reversed, one word per "token", cut at max_tokens; the timings are fixed
functions of the counts (prompt: 2 ms a token; decode: 10 ms a token), so the tests can check the parsing exactly.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TEMPLATE_TOKENS = 5  # the chat template's tokens around the message


def install(bin_dir: Path) -> Path:
    """An executable `llama-server` in bin_dir that runs this stand-in with this Python."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "llama-server"
    exe.write_text(f"#!{sys.executable}\nimport runpy\nrunpy.run_path({str(Path(__file__).resolve())!r}, "
                   "run_name='__main__')\n")
    exe.chmod(0o755)
    return exe


def log(record: dict) -> None:
    if os.environ.get("STANDIN_LOG"):
        with open(os.environ["STANDIN_LOG"], "a") as f:
            f.write(json.dumps(record) + "\n")


def answer_words(content: str, max_tokens: int, spec: bool) -> list[str]:
    words = content.split()[::-1]
    if spec and os.environ.get("STANDIN_MODE") == "spec-differs" and content.startswith("second"):
        words = ["different"] + words
    return words[:max_tokens]


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="llama-server")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("-t", "--threads", type=int, required=True)
    ap.add_argument("-c", "--ctx-size", type=int, required=True)
    ap.add_argument("-fa", "--flash-attn", choices=["on", "off", "auto"], required=True)
    ap.add_argument("--spec-default", action="store_true")
    return ap.parse_args(argv)


def handler(spec: bool, max_ctx: int):
    mode = os.environ.get("STANDIN_MODE", "ok")
    served = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # the stream ends when the connection closes, as a plain SSE server's does

        def log_message(self, *args):  # quiet: the bench keeps our output for its error messages
            pass

        def reply(self, status: int, obj: dict) -> None:
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path != "/health":
                return self.reply(404, {"error": {"message": "not found"}})
            if mode == "never-ready":
                return self.reply(503, {"error": {"message": "Loading model"}})
            self.reply(200, {"status": "ok"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            log({"pid": os.getpid(), "body": body})
            served.append(1)
            if mode == "crash" and len(served) == 2:
                print("GGML_ASSERT(n_tokens <= n_batch) failed", file=sys.stderr, flush=True)
                os._exit(134)
            if self.path != "/v1/chat/completions":
                return self.reply(404, {"error": {"message": "not found"}})
            wrong = {k: body.get(k) for k, want in (("stream", True), ("cache_prompt", False)) if body.get(k) != want}
            sampled = isinstance(body.get("temperature"), (int, float)) and body["temperature"] > 0
            if body.get("temperature") != 0 and not (sampled and isinstance(body.get("seed"), int)):
                wrong["temperature"] = body.get("temperature")  # greedy, or sampled with a seed (its answer is the
                #                                                 same either way: this stand-in does not sample)
            if wrong or not isinstance(body.get("max_tokens"), int) or len(body.get("messages") or []) != 1:
                return self.reply(400, {"error": {"message": f"stand-in: unexpected request fields {wrong}"}})
            content = body["messages"][0]["content"]
            prompt_n = len(content.split()) + TEMPLATE_TOKENS
            if prompt_n + body["max_tokens"] > max_ctx:
                return self.reply(400, {"error": {"message": "the request exceeds the available context size"}})
            words = answer_words(content, body["max_tokens"], spec)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i, w in enumerate(words):
                delta = {"content": (" " if i else "") + w}
                self.event({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
                time.sleep(0.001)
            timings = {"prompt_n": prompt_n, "prompt_ms": 2.0 * prompt_n, "predicted_n": len(words),
                       "predicted_ms": 10.0 * len(words), "cache_n": 0}
            self.event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "timings": timings})
            self.wfile.write(b"data: [DONE]\n\n")

        def event(self, obj: dict) -> None:
            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            self.wfile.flush()

    return Handler


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--version"]:
        print("version: 11434 (standin)\nbuilt with cc for x86_64-linux-gnu", file=sys.stderr)
        return 0
    a = parse_args(argv)
    log({"argv": argv, "pid": os.getpid()})
    if not Path(a.model).is_file():
        print(f"error: failed to open {a.model}", file=sys.stderr)
        return 1
    if os.environ.get("STANDIN_MODE") == "exit":
        print("llama_model_load: error loading model: tensor 'blk.0.attn_q.weight' has wrong shape", file=sys.stderr)
        print("main: exiting due to model loading error", file=sys.stderr)
        return 1
    print("srv load_model: loading model" if os.environ.get("STANDIN_MODE") == "never-ready" else
          "main: model loaded; server is listening", file=sys.stderr, flush=True)
    ThreadingHTTPServer((a.host, a.port), handler(a.spec_default, a.ctx_size)).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
