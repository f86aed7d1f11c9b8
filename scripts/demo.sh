#!/usr/bin/env bash
# The main job on the default model: install, pull SmolLM2-135M-Instruct, decode speculatively, report the speed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh .venv llama,dev
. .venv/bin/activate
specedge pull smollm2-135m
PROMPT=${1:-"Summarize the following in two sentences: Speculative decoding lets a cheap drafter propose several tokens that the target model verifies in one forward pass. Every accepted token saves a full forward pass, and the output is exactly what the target alone would have produced."}
for backend in numpy llamacpp; do
  specedge generate smollm2-135m "$PROMPT" --backend "$backend" --drafter ngram --k 4 --max-tokens 128 --baseline
done
