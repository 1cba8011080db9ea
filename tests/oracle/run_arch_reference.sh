#!/usr/bin/env bash
# CTest driver of oracle_arch_reference: for every architecture, a random-weight
# GGUF model and prompts (write_random_gguf.py) and their float64 reference
# logits (reference_forward.py), into OUT_DIR/<arch>.gguf and OUT_DIR/<arch>/.
#   run_arch_reference.sh OUT_DIR
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="$1"
PY="$("$ROOT/scripts/oracle_venv.sh" --print-python)"
mkdir -p "$OUT"
for arch in llama llama3 qwen2 qwen3; do
  "$PY" "$ROOT/tests/oracle/write_random_gguf.py" --arch "$arch" --out "$OUT"
  "$PY" "$ROOT/tests/oracle/reference_forward.py" --no-cache --model "$OUT/$arch.gguf" \
    --prompts "$OUT/$arch.prompts.json" --out "$OUT/$arch"
done
