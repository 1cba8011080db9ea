#!/usr/bin/env bash
# Reruns the benchmark commands of docs/BENCHMARKS.md and keeps their outputs.
#
#   scripts/run_benchmarks.sh [--quick] [--only LIST]
#
# Environment: BUILD (default build: where bin/cb_bench is), OUT (default
# docs/bench), THREADS (default 2, as in BENCHMARKS.md), CB_MODEL (the model).
# --quick shrinks every size (fewer chunks, tokens, examples) to check that
# the script and the binaries work in a few minutes; its figures are not the
# documented ones.  --only takes a comma-separated subset of the sections:
#   machine   machine.txt: lscpu model, cores, RAM, kernel, load (always written)
#   speed     §2 prefill/decode: cb_bench JSON; vs llama.cpp when `make peer` was run
#   ttft      §3 TTFT per mode and ratio: ttft.jsonl, ttft_ratio.png;
#             TTFT per read cap (chunk store on flash): ttft_caps.jsonl, ttft_caps.png
#   quality   §4 MuSiQue quality per mode: quality.jsonl, quality.png
#   head      §5 chunk head prompt vs none: chunk_head_{prompt,none}.jsonl
#   codecs    §6 fidelity per codec: codec_{f16,q8,q4}.jsonl
#   pipeline  §7 layerwise pipeline: pipeline.txt (test_runtime's PipelineBench)
#   controller  loading controller vs read cap: scripts/bench_loading_controller.py
#   rag       the RAG assistant on the demo corpus: rag_demo.txt
# Every file goes to $OUT; a section that cannot run (no llama.cpp peer, no
# dataset) says so and the others go on.  Exit status 1 if any section failed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD:-build}"
OUT="${OUT:-docs/bench}"
THREADS="${THREADS:-2}"
QUICK=0
ONLY="machine,speed,ttft,quality,head,codecs,pipeline,controller,rag"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --only) ONLY="machine,$2"; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "run_benchmarks: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
cd "$ROOT" || exit 1
BENCH="$BUILD/bin/cb_bench"
DATASET="${DATASET:-../shared/data/musique_dev.json}"
MODEL_ARGS=()
[ -n "${CB_MODEL:-}" ] && MODEL_ARGS=(--model "$CB_MODEL")
if [ ! -x "$BENCH" ]; then
  echo "run_benchmarks: $BENCH not found: build first (make build, or BUILD=dir)" >&2
  exit 1
fi
mkdir -p "$OUT"

# Sizes: BENCHMARKS.md's, or small ones for --quick.
if [ "$QUICK" = 1 ]; then
  PREFILL="64,128"; DECODE=16; ROUNDS=1
  TTFT_CHUNKS=2; TTFT_TOKENS=64; CAPS="20,200,2000"
  Q_LIMIT=2; Q_LIMIT_SMALL=1; CTRL_CAPS="500,25"; CTRL_REPEAT=1
else
  PREFILL="512,2048"; DECODE=128; ROUNDS=3
  TTFT_CHUNKS=8; TTFT_TOKENS=512; CAPS="5,10,25,100,500,2000"
  Q_LIMIT=50; Q_LIMIT_SMALL=10; CTRL_CAPS="2000,500,100,25,10,5"; CTRL_REPEAT=3
fi

FAILED=()
want() { [[ ",$ONLY," == *",$1,"* ]]; }
# Runs a command, echoing it; its stdout goes to FILE.
run_to() {
  local file="$1"; shift
  echo "+ $* > $file"
  if ! "$@" > "$file"; then
    echo "run_benchmarks: failed: $*" >&2
    FAILED+=("$file")
  fi
}
section() { echo; echo "== $1"; }

section "machine"
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
  echo "cores: $(nproc) available to this process; $(lscpu | sed -n 's/^CPU(s): *//p' | head -1) online"
  echo "cpu flags: $(grep -o -w -E 'avx2|avx512f|fma|f16c|neon|asimd' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
  echo "kernel: $(uname -sr)"
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "threads: $THREADS; quick: $QUICK; build: $BUILD"
  echo "model: ${CB_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
} | tee "$OUT/machine.txt"

if want speed; then
  section "§2 prefill and decode"
  for n in ${PREFILL//,/ }; do
    run_to "$OUT/prefill_$n.json" "$BENCH" prefill --tokens "$n" --repeat "$ROUNDS" \
      --threads "$THREADS" --json "${MODEL_ARGS[@]}"
  done
  run_to "$OUT/decode_$DECODE.json" "$BENCH" decode --tokens "$DECODE" --repeat "$ROUNDS" \
    --threads "$THREADS" --json "${MODEL_ARGS[@]}"
  # The peer lives in build/peer whatever BUILD is (scripts/build_llamacpp_peer.sh);
  # building it takes long, so only a peer already built is used.
  if [ -n "$(find build/peer -name llama-bench -type f -perm -u+x 2>/dev/null | head -1)" ]; then
    run_to "$OUT/vs_llamacpp.md" python3 scripts/bench_vs_llamacpp.py --threads "$THREADS" \
      --rounds "$ROUNDS" --prefill "$PREFILL" --decode "$DECODE" --cb-bench "$BENCH"
  else
    echo "(no llama.cpp peer in build/peer: run 'make peer' for the side-by-side table)"
  fi
fi

if want ttft; then
  section "§3 TTFT per mode and ratio"
  run_to "$OUT/ttft.jsonl" "$BENCH" ttft --chunks "$TTFT_CHUNKS" --chunk-tokens "$TTFT_TOKENS" \
    --query-tokens 32 --ratio 0.05,0.15,0.3,0.5,1.0 --repeat 1 --threads "$THREADS" --json \
    --plot "$OUT/ttft_ratio.png" "${MODEL_ARGS[@]}"
  section "TTFT per read cap (chunk KV on flash, q8)"
  run_to "$OUT/ttft_caps.jsonl" "$BENCH" ttft --chunks "$TTFT_CHUNKS" \
    --chunk-tokens "$TTFT_TOKENS" --query-tokens 32 --modes full,reuse,blend --ratio 0.15,auto \
    --codec q8 --storage-mbps "$CAPS" --repeat 1 --threads "$THREADS" --json \
    --plot "$OUT/ttft_caps.png" "${MODEL_ARGS[@]}"
fi

if want quality || want head || want codecs; then
  if [ ! -f "$DATASET" ]; then
    echo "(no dataset at $DATASET: set DATASET=... for the quality sections)"
    FAILED+=("quality: no dataset")
  else
    if want quality; then
      section "§4 answer quality (MuSiQue dev)"
      run_to "$OUT/quality.jsonl" "$BENCH" quality --dataset "$DATASET" --limit "$Q_LIMIT" \
        --max-chunks 2 --ratio 0.15 --threads "$THREADS" --json --plot "$OUT/quality.png" \
        "${MODEL_ARGS[@]}"
    fi
    if want head; then
      section "§5 chunk head"
      for head in prompt none; do
        run_to "$OUT/chunk_head_$head.jsonl" "$BENCH" quality --dataset "$DATASET" \
          --limit "$Q_LIMIT_SMALL" --max-chunks 2 --modes reuse,blend --chunk-head "$head" \
          --threads "$THREADS" --json "${MODEL_ARGS[@]}"
      done
    fi
    if want codecs; then
      section "§6 chunk-KV codecs"
      for codec in f16 q8 q4; do
        run_to "$OUT/codec_$codec.jsonl" "$BENCH" quality --dataset "$DATASET" \
          --limit "$Q_LIMIT_SMALL" --max-chunks 2 --modes blend --codec "$codec" \
          --threads "$THREADS" --json "${MODEL_ARGS[@]}"
      done
    fi
  fi
fi

if want pipeline; then
  section "§7 layerwise pipeline"
  if [ -x "$BUILD/bin/test_runtime" ]; then
    run_to "$OUT/pipeline.txt" "$BUILD/bin/test_runtime" --gtest_also_run_disabled_tests \
      --gtest_filter='PipelineBench*'
  else
    echo "(no $BUILD/bin/test_runtime: build the tests)"
    FAILED+=("pipeline: no test_runtime")
  fi
fi

if want controller; then
  section "loading controller vs read cap"
  run_to "$OUT/loading_controller.log" python3 scripts/bench_loading_controller.py \
    --cb-bench "$BENCH" --caps "$CTRL_CAPS" --chunks "$TTFT_CHUNKS" \
    --chunk-tokens "$TTFT_TOKENS" --threads "$THREADS" --repeat "$CTRL_REPEAT" --out-dir "$OUT" \
    "${MODEL_ARGS[@]}"
fi

if want rag; then
  section "RAG assistant on the demo corpus"
  store="$(mktemp -d "${TMPDIR:-/tmp}/rag_bench.XXXXXX")"
  run_to "$OUT/rag_demo.txt" python3 scripts/rag_demo.py --bin "$BUILD/bin/rag_assistant" \
    --store "$store" --threads "$THREADS" "${MODEL_ARGS[@]}"
  rm -rf "$store"
fi

echo
echo "outputs in $OUT:"
ls -1 "$OUT"
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "run_benchmarks: ${#FAILED[@]} section(s) failed or were skipped: ${FAILED[*]}" >&2
  exit 1
fi
