#!/usr/bin/env bash
# The main job on the default model: install, pull SmolLM2-135M-Instruct, export it to ONNX (int4 blocks transcoded
# exactly from the GGUF, parity-gated), decode speculatively on ONNX Runtime and on llama.cpp, report the speed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh .venv llama,onnx,dev
. .venv/bin/activate
specedge pull smollm2-135m
specedge export smollm2-135m --format onnx --weights int4     # -> <cache>/smollm2-135m-onnx-int4
PROMPT=${1:-"Summarize the following in two sentences: Speculative decoding lets a cheap drafter propose several tokens that the target model verifies in one forward pass. Every accepted token saves a full forward pass, and the output is exactly what the target alone would have produced."}
specedge generate smollm2-135m-onnx-int4 "$PROMPT" --backend onnx --device cpu --threads 2 --drafter ngram --k 4 \
    --max-tokens 128 --baseline
specedge generate smollm2-135m "$PROMPT" --backend llamacpp --threads 2 --drafter ngram --k 4 --max-tokens 128 \
    --baseline
