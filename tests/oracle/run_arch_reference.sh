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
# Matrix types as real files of each family use them (Qwen's 896-wide rows
# fall back to Q5_0, for instance, and IQ4_NL files are common for Qwen 3),
# so the matmul of each type is held to the reference too.
for variant in llama:q8_0 llama3:q5_1 qwen2:q5_0 qwen3:iq4_nl gemma3:q8_0; do
  arch="${variant%%:*}"
  "$PY" "$ROOT/tests/oracle/write_random_gguf.py" --arch "$arch" --type "${variant##*:}" --out "$OUT"
  "$PY" "$ROOT/tests/oracle/reference_forward.py" --no-cache --model "$OUT/$arch.gguf" \
    --prompts "$OUT/$arch.prompts.json" --out "$OUT/$arch"
done
