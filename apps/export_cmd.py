"""`specedge export`: a GGUF model or a Hugging Face checkpoint directory -> a parity-gated ONNX artifact, or a
layer-subset GGUF drafter for llama.cpp.

    specedge export smollm2-135m --format onnx --weights int8            -> <cache>/smollm2-135m-onnx-int8/
    specedge export path/to/hf-checkpoint --format onnx --weights int4   -> <cache>/hf-checkpoint-onnx-int4/
    specedge export path/to/hf-checkpoint --weights fp32 --via optimum   -> <cache>/hf-checkpoint-optimum-fp32/
    specedge export hf:OWNER/REPO --format onnx --weights int8           -> <cache>/REPO-onnx-int8/ (the pulled copy)
    specedge export smollm2-135m --format onnx --weights int8 --profile static --verify-width 5 --max-context 512
                                                                         -> <cache>/smollm2-135m-onnx-static-int8/
    specedge export smollm2-135m --format onnx --weights int4 --profile layered
                                                                         -> <cache>/smollm2-135m-onnx-layered-int4/
    specedge export smollm2-135m --gpu                                   -> <cache>/smollm2-135m-onnx-gpu-fp16/
                                         (the dynamic profile's GPU graph for --device cuda; weights default fp16)
    specedge export smollm2-135m --format gguf --weights fp16 --layers 0-9 --out drafter.gguf
    specedge export smollm2-135m --format gguf --weights keep --layers 0-11   (early exit at 12, Q4_1 blocks kept)
    specedge export qwen2.5-coder-0.5b --weights int4 --drafter-vocab 16384 --calib-target qwen2.5-coder-1.5b
                                         -> also a VocabTrim drafter head over the target's 16384 most used ids
    specedge export HEAD_DIR --format gguf [--weights fp16|fp32] [--target MODEL] [--out head.gguf]
                                         -> a draft head (head.json + head.npz) as llama.cpp's eagle3 GGUF, default
                                            HEAD_DIR-eagle3.f16.gguf beside the directory (export/head_gguf.py)
"""
from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path

import click

from ..models.gguf_in import open_gguf
from ..models.hf_in import is_hf_dir, open_hf
from ..models.catalog import model_cache_dir, resolve_model
from ..models import hub
from ..assembly.load import artifact_name
from ..export.publish import publish, stage_dir
from .options import CACHE_DIR

ONNX_WEIGHTS = ("fp32", "fp16", "int8", "int4", "int8-dynamic")
GGUF_DTYPES = {"fp32": "f32", "fp16": "f16", "keep": "keep"}


def parse_layers(text: str, n_layers: int) -> list[int]:
    """'0-5,29' -> [0, 1, 2, 3, 4, 5, 29]; indices must exist in the source model."""
    out: list[int] = []
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise click.BadParameter(f"{text!r}: use indices and ranges like 0-5,29", param_hint="--layers") from None
    bad = [i for i in out if not 0 <= i < n_layers]
    if not out or bad:
        raise click.BadParameter(f"{text!r}: layers must be in 0..{n_layers - 1}", param_hint="--layers")
    return out


@click.command("export")
@click.argument("model")
@click.option("--format", "fmt", type=click.Choice(["onnx", "gguf"]), default="onnx", show_default=True)
@click.option("--weights", type=click.Choice(ONNX_WEIGHTS + ("keep",)), default=None,
              help="onnx (default int8; fp32 with --via optimum, its only format): any; int8/int4 transcode GGUF "
                   "blocks exactly and re-quantize float checkpoints (docs/onnx.md). gguf (default fp32): fp32 | fp16 "
                   "| keep (the source's quantized blocks copied bit for bit).")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Output directory (onnx) or .gguf file; default: the model cache, <model>-onnx-[static-]<weights>.")
@click.option("--layers", default=None, help="gguf: source layers to keep, e.g. 0-9 (a layer-subset drafter).")
@click.option("--profile", type=click.Choice(["dynamic", "static", "layered"]), default="dynamic", show_default=True,
              help="onnx: dynamic (any length; CPU/CUDA/DirectML), static (every shape fixed, standard ops only: "
                   "for NPU providers such as qnn, coreml; weights fp32, fp16 or int8), or layered (dynamic, one "
                   "graph per layer: runs layer plans for self-speculative drafters).")
@click.option("--gpu", is_flag=True,
              help="onnx, dynamic profile: the GPU graph for --device cuda (float16 attention and KV cache, chain "
                   "drafters only, no batch-invariance pad row; docs/accelerators.md); weights fp16 (default), fp32, "
                   "int4 or int8. Named <model>-onnx-gpu-<weights>.")
@click.option("--verify-width", type=click.IntRange(1, None), default=None,
              help="static: positions per call, W = k + 1 (default 5); longer inputs run in W-sized pieces.")
@click.option("--max-context", type=click.IntRange(1, None), default=None,
              help="static: cache slots = most positions a sequence may hold (default 512).")
@click.option("--threads", type=click.IntRange(1, None), default=None, help="Threads for the parity gate.")
@click.option("--min-top1", type=click.FloatRange(0, 1), default=None,
              help="Parity gate: minimum top-1 agreement (default per format).")
@click.option("--max-dlogit", type=click.FloatRange(0, None), default=None,
              help="Parity gate: maximum |logit difference| (default per format).")
@click.option("--via", type=click.Choice(["specedge", "optimum"]), default="specedge", show_default=True,
              help="Hugging Face directory: our graph builder (llama, qwen2), or optimum for other architectures "
                   "(fp32 only, and slower: its graph copies the KV cache every step; docs/onnx.md).")
@click.option("--drafter-vocab", type=click.IntRange(1, None), default=None,
              help="onnx: also write a drafter whose LM head keeps the N ids most used in target-generated text "
                   "(VocabTrim; export/vocab_trim.py).")
@click.option("--calib-limit", type=click.IntRange(1, None), default=10, show_default=True,
              help="--drafter-vocab: dev-set prompts to calibrate on.")
@click.option("--calib-tokens", type=click.IntRange(1, None), default=64, show_default=True,
              help="--drafter-vocab: greedy tokens generated per calibration prompt.")
@click.option("--calib-target", default=None,
              help="--drafter-vocab: the target model whose completions are counted (default: MODEL itself).")
@click.option("--lora-drop", "lora_drop", default=None,
              help="Fit LoRA-Drop corrections instead (e.g. rank=8,cycle=4; NumPy reference, dev-set prompts) into "
                   "--out or <cache>/<model>-loradrop-r<rank>-c<cycle>/.")
@click.option("--target", default=None,
              help="A draft head directory: the target GGUF it was trained on (catalogue name or path; default: "
                   "the model its head.json names, which must be pulled).")
@CACHE_DIR()
def export_cmd(model, fmt, weights, out, layers, profile, gpu, verify_width, max_context, threads, min_top1, max_dlogit,
               via, lora_drop, drafter_vocab, calib_limit, calib_tokens, calib_target, target, cache_dir) -> None:
    """Export MODEL (catalogue name, .gguf path, or a Hugging Face checkpoint directory with config.json and
    *.safetensors). ONNX exports must pass the parity gate against a reference (the NumPy reference; transformers
    for --via optimum): numbers printed, out of tolerance exits non-zero and marks the artifact failed. A draft head
    directory (head.json + head.npz) exports as llama.cpp's eagle3 GGUF (docs/drafters.md)."""
    if (Path(model) / "head.json").is_file():
        return _export_head(Path(model), weights, out, target, cache_dir)
    if target is not None:
        raise click.BadParameter(f"--target names a draft head's target; {model} is not a draft head directory "
                                 "(no head.json)", param_hint="--target")
    name, model = model, _resolve_hub(model, cache_dir)  # named after hf:OWNER/REPO's REPO; the pulled copy
    hf = is_hf_dir(model)
    if via == "optimum" and not hf:
        raise click.BadParameter("--via optimum exports a Hugging Face checkpoint directory", param_hint="--via")
    if hf and fmt != "onnx":
        raise click.BadParameter("a Hugging Face directory exports to --format onnx", param_hint="--format")
    try:
        source = None if hf else open_gguf(resolve_model(model, cache_dir), cache_dir)
    except (ValueError, FileNotFoundError) as e:
        raise click.ClickException(str(e)) from None
    if gpu:
        _check_gpu(fmt, profile, via, weights, drafter_vocab, lora_drop)
    if lora_drop is not None:
        return _export_lora_drop(model, lora_drop, out, cache_dir)
    if fmt == "gguf":
        if profile != "dynamic" or verify_width is not None or max_context is not None:
            raise click.BadParameter("--profile, --verify-width and --max-context apply to --format onnx",
                                     param_hint="--profile")
        return _export_gguf(source, model, weights or "fp32", out, layers, cache_dir)
    if layers is not None:
        raise click.BadParameter("--layers applies to --format gguf", param_hint="--layers")
    weights = _onnx_weights(weights, via, gpu, profile)
    try:
        hf_model = open_hf(model) if hf and via != "optimum" else None
    except (ValueError, FileNotFoundError) as e:
        raise click.ClickException(str(e)) from None
    config = hf_model.config if hf_model is not None else getattr(source, "config", None)
    static = _static_shape(profile, weights, verify_width, max_context, config) if config is not None else None
    if drafter_vocab is not None and (static is not None or via == "optimum"):
        raise click.BadParameter("VocabTrim heads are built for our dynamic-profile graphs: drop --profile static "
                                 "and --via optimum", param_hint="--drafter-vocab")
    from ..export.onnx_export import ExportProfile, Profile
    tolerance = _tolerance(weights, gpu, min_top1, max_dlogit)
    kind = Profile.STATIC if static is not None else Profile(profile or "dynamic")
    export_profile = ExportProfile(kind, static, gpu=gpu)
    out = out or model_cache_dir(cache_dir) / artifact_name(name, weights, via=via, profile=kind, gpu=gpu)
    shape = (", GPU graph" if gpu else "" if static is None
             else f", static W={static.verify_width} C={static.max_context}")
    click.echo(f"exporting {Path(model).name} -> {out} ({weights}{', via optimum' if via == 'optimum' else ''}"
               f"{shape})", err=True)
    how = via if via == "optimum" else "hf" if hf else "gguf"
    export = partial(_export_onnx, via=how, model={"optimum": model, "hf": hf_model, "gguf": source}[how],
                     weights=weights, tolerance=tolerance, threads=threads, profile=export_profile)
    heads = None if drafter_vocab is None else lambda stage: _export_drafter_vocab(
        stage, source, hf_model, weights, drafter_vocab, calib_target or model, calib_limit, calib_tokens, cache_dir,
        threads)  # --drafter-vocab: the VocabTrim drafter heads beside the artifact
    _gated_publish(out, export, heads)
    click.echo(str(out))


def _resolve_hub(model: str, cache_dir) -> str:
    """hf:OWNER/REPO: the cached copy (pulled if missing), a GGUF file or a checkpoint directory; else `model`."""
    if not hub.is_hub_ref(model):
        return model
    try:
        return str(hub.resolve(model, cache_dir))
    except ValueError as e:
        raise click.ClickException(str(e)) from None


def _onnx_weights(weights: str | None, via: str, gpu: bool, profile: str) -> str:
    """The ONNX weight format (default: fp32 via optimum, fp16 for a GPU graph, else int8); refused combinations."""
    weights = weights or ("fp32" if via == "optimum" else "fp16" if gpu else "int8")
    if weights == "keep":
        raise click.BadParameter("--weights keep copies GGUF blocks into a GGUF: use it with --format gguf",
                                 param_hint="--weights")
    if via == "optimum" and weights != "fp32":
        raise click.BadParameter("--via optimum exports fp32 weights only; llama and qwen2 checkpoints get int8/int4 "
                                 "from our builder (drop --via optimum)", param_hint="--weights")
    if via == "optimum" and profile != "dynamic":
        raise click.BadParameter(f"--profile {profile} is built by our graph builder; drop --via optimum",
                                 param_hint="--profile")
    return weights


def _tolerance(weights: str, gpu: bool, min_top1: float | None, max_dlogit: float | None):
    """The parity gate's tolerance: the format's, with --min-top1 / --max-dlogit over it; None: the format's."""
    if min_top1 is None and max_dlogit is None:
        return None
    from ..export.onnx_export import Tolerance
    base = Tolerance.for_format(weights, "float16" if gpu else "float32")
    return Tolerance(base.min_top1 if min_top1 is None else min_top1,
                     base.max_dlogit if max_dlogit is None else max_dlogit)


def _export_onnx(stage: Path, *, via: str, model, weights: str, tolerance, threads: int | None, profile) -> Path:
    """`model` (via "optimum": a checkpoint directory's path; "hf": an opened HF checkpoint; "gguf": a GGUF source)
    exported into `stage` through its parity gate (ParityError); the manifest's path."""
    from ..export.onnx_export import WeightFormat, export_gguf_to_onnx, export_hf_to_onnx
    if via == "optimum":
        from ..export.optimum_export import export_via_optimum
        return export_via_optimum(model, stage, tolerance=tolerance, threads=threads)
    write = export_hf_to_onnx if via == "hf" else export_gguf_to_onnx
    return write(model, stage, WeightFormat(weights), tolerance=tolerance, threads=threads, profile=profile)


def _gated_publish(out: Path, export, after=None) -> None:
    """export(stage) -> manifest into a stage folder beside `out`, then after(stage), then published to `out`; a
    parity failure is published too (marked failed, kept for inspection) and exits non-zero; the stage never stays."""
    from ..export.onnx_export import ParityError
    stage = _stage_dir(out)
    try:
        try:
            manifest = export(stage)
        except ParityError as e:
            publish(stage, out)
            raise click.ClickException(f"{e}\nthe artifact in {out} is kept for inspection and marked failed") from None
        except (ValueError, ImportError) as e:
            raise click.ClickException(str(e)) from None
        parity = json.loads(manifest.read_text("utf-8"))["parity"]
        click.echo(f"parity gate PASS: top-1 agreement {parity['top1']:.2%}, max |dlogit| {parity['max_dlogit']:.4g} "
                   f"({parity['positions']} positions)", err=True)
        if after is not None:
            after(stage)
        publish(stage, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)  # gone already when published


def _check_gpu(fmt, profile, via, weights, drafter_vocab, lora_drop) -> None:
    """--gpu builds the dynamic profile's GPU graph with our builder; refuse what it does not combine with."""
    if fmt != "onnx" or profile != "dynamic" or via != "specedge" or lora_drop is not None:
        raise click.BadParameter("--gpu builds the dynamic-profile ONNX graph with our builder: use it with --format "
                                 "onnx, --profile dynamic, --via specedge (and without --lora-drop)",
                                 param_hint="--gpu")
    if weights == "int8-dynamic":
        raise click.BadParameter("--gpu: int8-dynamic's DynamicQuantizeMatMul runs on the CPU provider only; use "
                                 "fp16, fp32, int4 or int8", param_hint="--weights")
    if drafter_vocab is not None:
        raise click.BadParameter("--drafter-vocab heads are built for the CPU graph; drop --gpu or --drafter-vocab",
                                 param_hint="--drafter-vocab")


def _stage_dir(out: Path) -> Path:
    try:
        return stage_dir(out)
    except ValueError as e:
        raise click.ClickException(str(e)) from None


def _export_drafter_vocab(out, source, hf_model, weights, n, target, limit, tokens, cache_dir, threads) -> None:
    """Calibrate on the target's greedy completions, keep the top n ids (and the special ids), write the heads."""
    from ..export.onnx_export import FloatSource, GGUFSource
    from ..export.onnx_linear import ExportOptions, WeightFormat
    from ..assembly.calibrate import calibrate_model
    from ..export.vocab_trim import top_ids, write_drafter_vocab
    src = GGUFSource(source) if hf_model is None else FloatSource(hf_model.load_weights(), hf_model.tensor_types())
    spec = (source or hf_model).tokenizer_spec()
    cfg = src.weights.config
    click.echo(f"calibrating the drafter vocabulary on {target} ({limit} dev-set prompts x {tokens} tokens)", err=True)
    try:
        counts, calib = calibrate_model(target, limit=limit, max_tokens=tokens, cache_dir=cache_dir, threads=threads)
        if len(counts) != cfg.vocab_size:
            raise ValueError(f"the calibration target {target} has {len(counts)} vocabulary ids, the drafter "
                             f"{cfg.vocab_size}: calibrate with a target of the same family")
        keep = [*spec.eos_ids, *cfg.eos_ids, *([] if spec.bos_id is None else [spec.bos_id])]
        ids = top_ids(counts, n, keep)
        write_drafter_vocab(out, src, cfg, ExportOptions(WeightFormat(weights)), ids, calib)
    except (ValueError, FileNotFoundError) as e:
        raise click.ClickException(str(e)) from None
    covered = counts[ids].sum() / max(counts.sum(), 1)
    click.echo(f"drafter vocabulary: {n} of {cfg.vocab_size} ids cover {covered:.2%} of {calib.generated} "
               f"calibration tokens ({calib.engine})", err=True)


def _static_shape(profile, weights, verify_width, max_context, config):
    """The StaticShape for --profile static (defaults W=5, C=512 capped at the model's context), None for dynamic."""
    from ..export.onnx_static import StaticShape
    from ..export.onnx_linear import STANDARD_FORMATS
    if profile != "static":
        if verify_width is not None or max_context is not None:
            raise click.BadParameter("--verify-width and --max-context apply to --profile static",
                                     param_hint="--profile")
        return None
    if weights not in {f.value for f in STANDARD_FORMATS}:
        raise click.BadParameter(f"--profile static takes fp32, fp16 or int8 (standard ONNX ops; NPU providers do "
                                 f"not run {weights}'s com.microsoft MatMul ops)", param_hint="--weights")
    default = StaticShape()
    shape = StaticShape(verify_width or default.verify_width,
                        max_context or min(default.max_context, config.context_length))
    try:
        shape.check(config)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--max-context") from None
    return shape


def _export_lora_drop(model, text, out, cache_dir) -> None:
    from ..runtime.backends import reference_engine
    from ..runtime.loradrop import LoRADropFit
    from ..assembly.load import load_model
    from ..assembly.loradrop import export_lora_drop
    try:
        spec = LoRADropFit.parse(text)
        loaded = load_model(model, reference_engine().kind, cache_dir=cache_dir)
        out = out or model_cache_dir(cache_dir) / f"{loaded.path.stem}-loradrop-r{spec.rank}-c{spec.cycle}"
        click.echo(str(export_lora_drop(loaded, spec, out)))
    except (ValueError, FileNotFoundError) as e:
        raise click.ClickException(str(e)) from None


def _export_gguf(source, model, weights, out, layers, cache_dir) -> None:
    from ..export.gguf_out import write_gguf
    if weights not in GGUF_DTYPES:
        raise click.BadParameter(f"--format gguf writes {' or '.join(GGUF_DTYPES)}, not {weights}",
                                 param_hint="--weights")
    kept = parse_layers(layers, source.config.n_layers) if layers else None
    tag = f"-layers{len(kept)}" if kept else ""
    suffix = "" if weights == "keep" else f".{GGUF_DTYPES[weights]}"
    out = out or model_cache_dir(cache_dir) / f"{source.path.stem}{tag}{suffix}.gguf"
    dtype = GGUF_DTYPES[weights]
    path = write_gguf(out, source, None if dtype == "keep" else source.load_weights(), dtype=dtype, layers=kept)
    click.echo(str(path))


HEAD_WEIGHTS = {"fp16": "f16", "fp32": "f32"}
_HEAD_OPTIONS = {"model", "fmt", "weights", "out", "target", "cache_dir"}


def _export_head(head_dir: Path, weights, out, target, cache_dir) -> None:
    """A draft head -> llama.cpp's eagle3 GGUF (export/head_gguf.py); options that do not apply are refused."""
    ctx = click.get_current_context()
    given = sorted(f"--{n.replace('_', '-')}" for n in ctx.params if n not in _HEAD_OPTIONS
                   and ctx.get_parameter_source(n) is not click.core.ParameterSource.DEFAULT)
    if given:
        raise click.BadParameter(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to a draft "
                                 "head, which exports as one eagle3 GGUF: use --format gguf, --weights fp16|fp32, "
                                 "--target and --out", param_hint=given[0])
    if ctx.params["fmt"] != "gguf" and ctx.get_parameter_source("fmt") is not click.core.ParameterSource.DEFAULT:
        raise click.BadParameter("a draft head exports to --format gguf (llama.cpp's eagle3)", param_hint="--format")
    weights = weights or "fp16"
    if weights not in HEAD_WEIGHTS:
        raise click.BadParameter(f"a draft head is written as fp16 or fp32, not {weights}", param_hint="--weights")
    from ..runtime.drafters.head_model import read_head
    from ..export.head_gguf import write_head_gguf
    try:
        named = read_head(head_dir)[0].model  # the files checked before anything else
    except (ValueError, FileNotFoundError) as e:
        raise click.ClickException(str(e)) from None
    try:
        gguf = open_gguf(resolve_model(target or named, cache_dir, pull_if_missing=False), cache_dir)
    except (ValueError, FileNotFoundError) as e:
        hint = "" if target else f" (the model {head_dir / 'head.json'} names; give its GGUF with --target)"
        raise click.ClickException(f"{e}{hint}") from None
    dtype = HEAD_WEIGHTS[weights]
    out = out or head_dir.resolve().parent / f"{head_dir.resolve().name}-eagle3.{dtype}.gguf"
    try:
        path = write_head_gguf(out, head_dir, gguf, dtype=dtype)
    except (ValueError, OSError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"run it: llama-server -m {gguf.path} -md {path} --spec-type draft-eagle3", err=True)
    click.echo(str(path))
