#!/usr/bin/env bash
# CTest driver of oracle_reference_logits and oracle_gemma3_reference: ensures the
# oracle venv, then runs the float64 reference forward pass on a prompts file.
#   run_reference.sh DEFAULT_MODEL OUT_DIR      tests/golden/reference_prompts.json;
#                                               CB_MODEL overrides the model
#   run_reference.sh MODEL OUT_DIR PROMPTS      that model and prompts file
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [ $# -ge 3 ]; then
  MODEL="$1"
  PROMPTS="$3"
else
  MODEL="${CB_MODEL:-$1}"
  PROMPTS="$ROOT/tests/golden/reference_prompts.json"
fi
OUT="$2"
[ -f "$MODEL" ] || { echo "run_reference: model $MODEL not found (scripts/setup.sh model)" >&2; exit 1; }
PY="$("$ROOT/scripts/oracle_venv.sh" --print-python)"
exec "$PY" "$ROOT/tests/oracle/reference_forward.py" --model "$MODEL" \
  --prompts "$PROMPTS" --out "$OUT"
