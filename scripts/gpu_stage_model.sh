#!/usr/bin/env bash
# Brings a model file larger than one call to a GPU machine can carry (the
# working tree and what a call carries travel together, 64 MiB in all):
# cuts it into pieces here, one per call, and prints the calls that join
# them there while the machine stays warm between them (ignored files in the
# repository stay between calls on a warm machine; a machine given back
# starts bare).
#
#   scripts/gpu_stage_model.sh MODEL.gguf [PIECE_MIB]
#
# Writes .xfer/NN (the pieces, PIECE_MIB each, default 56) and prints, per
# piece, the `carry` and the command of one call; the pieces join in
# .stage/model.gguf there.  Each command first checks that the file there
# holds exactly the pieces before it, so a call that lands on a fresh
# machine fails and says so instead of building a wrong file; the last one
# checks the SHA-256 of the whole.  Then, with the bundle of
# scripts/gpu_bundle.sh carried:
#   REAL_MODEL=.stage/model.gguf scripts/gpu_check.sh .gpu $OUT/check
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MODEL=${1:?usage: gpu_stage_model.sh MODEL.gguf [PIECE_MIB]}
PIECE_MIB=${2:-56}
[ -f "$MODEL" ] || { echo "gpu_stage_model: no model at $MODEL" >&2; exit 1; }
[[ $PIECE_MIB =~ ^[1-9][0-9]*$ ]] || { echo "gpu_stage_model: PIECE_MIB must be a positive number" >&2; exit 2; }

rm -rf .xfer
mkdir -p .xfer
split -b "${PIECE_MIB}M" -d -a 2 "$MODEL" .xfer/
TOTAL=$(stat -c %s "$MODEL")
SHA=$(sha256sum "$MODEL" | cut -d' ' -f1)
PIECES=(.xfer/[0-9][0-9])
echo "gpu_stage_model: $MODEL, $TOTAL bytes, ${#PIECES[@]} pieces of ${PIECE_MIB} MiB in .xfer/"
echo "One call each, in order, on a warm machine (carry, then command):"
OFFSET=0
for p in "${PIECES[@]}"; do
  SIZE=$(stat -c %s "$p")
  CMD="mkdir -p .stage && test \"\$(stat -c %s .stage/model.gguf 2>/dev/null || echo 0)\" = $OFFSET"
  CMD+=" || { echo 'the machine does not hold the pieces before $p: start again from the first'; exit 1; }"
  CMD+="; cat $p >> .stage/model.gguf && rm $p"
  OFFSET=$((OFFSET + SIZE))
  if [ "$OFFSET" = "$TOTAL" ]; then
    CMD+=" && echo '$SHA  .stage/model.gguf' | sha256sum -c"
  else
    CMD+=" && echo \"staged \$(stat -c %s .stage/model.gguf) of $TOTAL bytes\""
  fi
  printf '[%s]\t%s\n' "\"$p\"" "$CMD"
done
