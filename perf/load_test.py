"""A bounded load test of `specedge serve` on loopback: C concurrent clients x R requests each.

    python -m specedge.perf.load_test --model smollm2-135m --backend llamacpp --drafter ngram \\
        --clients 8 --requests 50 --max-tokens 32
    python -m specedge.perf.load_test --plan --clients 1 --requests 12 --max-tokens 128 --stream never  # one user

Starts the server as a subprocess (`python -m specedge.apps.cli serve`, this process's environment passed through;
--server-pythonpath DIR runs another checkout's server, e.g. a directory whose `specedge` links to main), runs a
single-request greedy reference for every prompt, then the load: each client (its own `openai` client in a
thread, asleep on its socket while it waits, as an app's client is) sends chat requests over the dev prompts,
streamed and plain alternating (--stream never: every answer whole, so the client does no work per token).
Checks: zero errors, every greedy output identical to its reference, the server's RSS (sampled from /proc)
stable. Reports latency p50/p90/p99, each request's end-to-end latency and tok/s (completion tokens / latency),
time to first token of the streamed requests, throughput and RSS first/last/max as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class Outcome:
    client: int
    prompt: int
    stream: bool
    text: str = ""
    latency_s: float = 0.0
    ttft_s: float | None = None
    completion_tokens: int = 0
    error: str | None = None


@dataclass
class LoadReport:
    clients: int
    requests: int
    errors: int
    mismatches: int
    wall_s: float
    requests_per_s: float
    tokens_per_s: float
    latency_s: dict  # p50, p90, p99, max
    ttft_s: dict  # streamed requests
    end_to_end_tokens_per_s: dict = field(default_factory=dict)  # per request: completion tokens / latency
    per_request: list = field(default_factory=list)  # every request: client, prompt, stream, latency_s, ttft_s, tokens
    rss_mib: dict = field(default_factory=dict)  # first, last, max (server process)
    error_samples: list = field(default_factory=list)
    mismatch_samples: list = field(default_factory=list)
    mismatches_by_prompt: dict = field(default_factory=dict)  # prompt index -> [mismatched, requests]


def percentiles(values) -> dict:
    if not values:
        return {}
    v = np.asarray(values, dtype=np.float64)
    return {"p50": float(np.percentile(v, 50)), "p90": float(np.percentile(v, 90)),
            "p99": float(np.percentile(v, 99)), "max": float(v.max()), "n": int(len(v))}


def one_request(client, messages: list[dict], max_tokens: int, stream: bool, out: Outcome) -> Outcome:
    """Send one greedy chat request; fill out text, latency, TTFT (streamed) and the completion token count."""
    t0 = time.perf_counter()
    try:
        if stream:
            parts = []
            for ch in client.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens,
                                                     temperature=0, stream=True,
                                                     stream_options={"include_usage": True}):
                if ch.choices and ch.choices[0].delta.content:
                    out.ttft_s = out.ttft_s if out.ttft_s is not None else time.perf_counter() - t0
                    parts.append(ch.choices[0].delta.content)
                if ch.usage is not None:
                    out.completion_tokens = ch.usage.completion_tokens
            out.text = "".join(parts)
        else:
            r = client.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens, temperature=0)
            out.text, out.completion_tokens = r.choices[0].message.content, r.usage.completion_tokens
    except Exception as e:  # counted and reported: the load test's verdict is "zero errors"
        out.error = f"{type(e).__name__}: {e}"
    out.latency_s = time.perf_counter() - t0
    return out


def make_client(url: str, api_key: str | None):
    import openai
    return openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key=api_key or "none", max_retries=0, timeout=600)


def reference(url: str, prompts: list[list[dict]], max_tokens: int, api_key: str | None = None) -> list[str]:
    """Each prompt's greedy output from a single request with the server otherwise idle."""
    client = make_client(url, api_key)
    outs = [one_request(client, p, max_tokens, False, Outcome(0, i, False)) for i, p in enumerate(prompts)]
    bad = [o.error for o in outs if o.error]
    if bad:
        raise RuntimeError(f"reference requests failed: {bad[:3]}")
    return [o.text for o in outs]


class RssSampler:
    """Sample a process's resident set size (/proc/<pid>/status VmRSS, MiB) every `every` seconds."""

    def __init__(self, pid: int, every: float = 0.5) -> None:
        self.pid, self.every, self.samples = pid, every, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss_mib(self) -> float | None:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None

    def _run(self) -> None:
        while not self._stop.is_set():
            v = self.rss_mib()
            if v is not None:
                self.samples.append(v)
            self._stop.wait(self.every)

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        """first/last/max MiB, and `trace`: 11 evenly spaced samples (a leak shows as a steady climb)."""
        s = self.samples
        if not s:
            return {}
        trace = [round(s[round(i * (len(s) - 1) / 10)], 1) for i in range(11)]
        return {"first": s[0], "last": s[-1], "max": max(s), "n": len(s), "trace": trace}


STREAM = {"alternate": lambda j: j % 2 == 1, "never": lambda j: False, "always": lambda j: True}


def run_load(url: str, prompts: list[list[dict]], expected: list[str], *, clients: int, requests: int,
             max_tokens: int, api_key: str | None = None, server_pid: int | None = None,
             stream: str = "alternate") -> LoadReport:
    """`clients` threads x `requests` each; request j of client c uses prompt (c + j) % len(prompts), streamed when
    j is odd (stream="alternate"; "never", "always"). Outputs are compared with `expected` (the single-request
    references)."""
    results: list[Outcome] = []
    lock = threading.Lock()
    streamed = STREAM[stream]

    def client_loop(c: int) -> None:
        client = make_client(url, api_key)
        for j in range(requests):
            i = (c + j) % len(prompts)
            o = one_request(client, prompts[i], max_tokens, streamed(j), Outcome(c, i, streamed(j)))
            with lock:
                results.append(o)

    rss = RssSampler(server_pid or os.getpid())
    t0 = time.perf_counter()
    with rss:
        threads = [threading.Thread(target=client_loop, args=(c,)) for c in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    wall = time.perf_counter() - t0
    errors = [o for o in results if o.error]
    mismatches = [o for o in results if not o.error and o.text != expected[o.prompt]]
    ok = [o for o in results if not o.error]
    return LoadReport(
        clients=clients, requests=len(results), errors=len(errors), mismatches=len(mismatches), wall_s=wall,
        requests_per_s=len(results) / wall, tokens_per_s=sum(o.completion_tokens for o in ok) / wall,
        latency_s=percentiles([o.latency_s for o in ok]),
        ttft_s=percentiles([o.ttft_s for o in ok if o.stream and o.ttft_s is not None]),
        end_to_end_tokens_per_s=percentiles([o.completion_tokens / o.latency_s for o in ok if o.latency_s > 0]),
        per_request=[{"client": o.client, "prompt": o.prompt, "stream": o.stream, "latency_s": round(o.latency_s, 4),
                      "ttft_s": None if o.ttft_s is None else round(o.ttft_s, 4), "tokens": o.completion_tokens,
                      "error": o.error} for o in results],
        rss_mib=rss.summary(), error_samples=[o.error for o in errors[:5]],
        mismatches_by_prompt={i: [sum(o.prompt == i for o in mismatches), sum(o.prompt == i for o in ok)]
                              for i in sorted({o.prompt for o in mismatches})},
        mismatch_samples=[{"prompt": o.prompt, "stream": o.stream, "got": o.text[:200],
                           "want": expected[o.prompt][:200]} for o in mismatches[:5]])


def dev_messages(n: int) -> list[list[dict]]:
    from ..assembly.devset import load_prompts
    return [[{"role": "user", "content": p.text}] for p in load_prompts(limit=n)]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    import httpx
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} before it was ready")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server at {url} was not ready after {timeout:.0f} s")


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--backend", default="llamacpp")
    ap.add_argument("--drafter", default="ngram")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=50, help="per client")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=16, help="distinct dev prompts")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=0,
                    help="server engine threads (0: serve's own default, the plan's or the engine's)")
    ap.add_argument("--plan", action="store_true",
                    help="serve MODEL as `specedge serve MODEL` does (the plan's engine and drafter; --backend and "
                         "--drafter unused)")
    ap.add_argument("--stream", choices=sorted(STREAM), default="alternate",
                    help="which requests stream (never: each client sleeps until its whole answer)")
    ap.add_argument("--server-pythonpath", default=None,
                    help="PYTHONPATH for the server only: measure another checkout's `specedge serve`")
    ap.add_argument("--fixed-k", action="store_true",
                    help="serve with --fixed-k: verify batch shapes then depend on the prompt alone, not on timing "
                         "(llama.cpp's logits depend on the batch shape, so adaptive k can flip greedy near-ties)")
    ap.add_argument("--json", type=Path, default=None, help="also write the report here")
    a = ap.parse_args(argv)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    engine = [] if a.plan else ["--backend", a.backend, "--drafter", a.drafter]
    cmd = [sys.executable, "-m", "specedge.apps.cli", "serve", a.model, *engine, "--port", str(port), "--ctx",
           str(a.ctx), "--max-queue", str(a.clients), "--log-level",
           "warning"] + (["--threads", str(a.threads)] if a.threads else []) + (["--fixed-k"] if a.fixed_k else [])
    env = os.environ.copy() if a.server_pythonpath is None else {**os.environ, "PYTHONPATH": a.server_pythonpath}
    print(" ".join(cmd) + (f"  (PYTHONPATH={a.server_pythonpath})" if a.server_pythonpath else ""), file=sys.stderr)
    proc = subprocess.Popen(cmd, env=env)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally below: never leave the server behind
    try:
        wait_ready(url, proc)
        prompts = dev_messages(a.prompts)
        expected = reference(url, prompts, a.max_tokens)
        report = run_load(url, prompts, expected, clients=a.clients, requests=a.requests, max_tokens=a.max_tokens,
                          server_pid=proc.pid, stream=a.stream)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    text = json.dumps(asdict(report), indent=2)
    print(text)
    if a.json:
        a.json.write_text(text)
    return 0 if report.errors == 0 and report.mismatches == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
