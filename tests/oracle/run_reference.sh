#!/usr/bin/env bash
# CTest driver of oracle_reference_logits: ensures the oracle venv, then runs the
# float64 reference forward pass on tests/golden/reference_prompts.json.
#   run_reference.sh DEFAULT_MODEL OUT_DIR      (CB_MODEL overrides the model)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MODEL="${CB_MODEL:-$1}"
OUT="$2"
[ -f "$MODEL" ] || { echo "run_reference: model $MODEL not found (scripts/setup.sh model)" >&2; exit 1; }
PY="$("$ROOT/scripts/oracle_venv.sh" --print-python)"
exec "$PY" "$ROOT/tests/oracle/reference_forward.py" --model "$MODEL" \
  --prompts "$ROOT/tests/golden/reference_prompts.json" --out "$OUT"
