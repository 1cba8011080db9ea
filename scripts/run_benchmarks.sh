#!/usr/bin/env bash
# Reruns every benchmark of docs/BENCHMARKS.md, keeps the outputs in docs/bench
# and rewrites the doc's generated tables from them: the one command that
# regenerates docs/BENCHMARKS.md.
#
#   scripts/run_benchmarks.sh [--quick] [--only LIST] [--doc FILE | --no-doc]
#
# The full run (no --quick) of Qwen2.5-Coder-0.5B-Instruct, the model of
# the doc's tables, takes 45 minutes on the 2-core reference machine when it
# is quiet (the default 1.5B model a few hours; longer when busy, which also
# spoils the figures).  Run it on a quiet machine (nothing else on the
# cores: the figures are timings) after `make build` (and `make peer` for
# the llama.cpp table of §2; without the peer that table is kept as it was):
#
#   make build && make peer && CB_MODEL=models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
#     DATASET=musique_dev.json scripts/run_benchmarks.sh
#
# Environment: BUILD (default build: where bin/cb_bench, bin/test_runtime,
# bin/test_cache and bin/rag_assistant are), OUT (default docs/bench; a new
# temporary directory with --quick), THREADS (default 2, as in BENCHMARKS.md),
# CB_MODEL (the model; default models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf),
# DATASET or CB_DEV_DATA (the quality sections' data set: a JSON list of
# {question, answers[], ctxs[{title, text}]}, e.g. a MuSiQue dev split
# written by scripts/musique_dataset.py).
#
# After a full run into docs/bench, scripts/write_benchmarks_md.py rewrites
# the regions between <!-- generated:NAME --> markers of docs/BENCHMARKS.md
# (--doc FILE: another doc; --no-doc: none).  --quick shrinks every size
# (fewer chunks, tokens, examples) to check in a few minutes that the script
# and the binaries work; its figures are not the documented ones, so it
# writes to a temporary directory and rewrites no doc unless --doc is given
# (never docs/bench or docs/BENCHMARKS.md).  --only takes a comma-separated
# subset of the sections (regions fed by the others are left as they were):
#   machine   machine.txt: CPU, cores, RAM, kernel, load, commit (always written)
#   speed     §2 prefill/decode: cb_bench JSON; vs llama.cpp when `make peer` was run
#   ttft      §3 TTFT per mode and ratio: ttft.jsonl, ttft_ratio.png;
#             TTFT per read cap (chunk store on flash): ttft_caps.jsonl, ttft_caps.png
#   quality   §4 MuSiQue quality per mode: quality.jsonl, quality.png
#   head      §5 chunk head prompt vs none: chunk_head_{prompt,none}.jsonl
#   codecs    §6 fidelity per codec: codec_{f16,q8,q4}.jsonl; sizes and speed:
#             codec_sizes.txt (test_cache's CodecBench)
#   pipeline  §7 layerwise pipeline: pipeline.txt (test_runtime's PipelineBench)
#   controller  §8 loading controller vs read cap: loading_controller.{jsonl,md,png}
#   ratio     §8 fidelity per recompute ratio: quality_ratio.jsonl, quality_ratio.png
#   rag       §9 the RAG assistant on the demo corpus: rag_demo.txt
# Every file goes to $OUT, and $OUT/runs.tsv records the command, run and
# commit behind each (the doc quotes them).  A command that fails leaves the
# previous output of that file in place; a section that cannot run (no
# llama.cpp peer, no dataset) says so and the others go on.  Exit status 1 if
# any section failed or the doc could not be fully rewritten.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD:-build}"
THREADS="${THREADS:-2}"
QUICK=0
DOC=""
NO_DOC=0
ALL="machine,speed,ttft,quality,head,codecs,pipeline,controller,ratio,rag"
ONLY="$ALL"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --only)
      [ $# -ge 2 ] || { echo "run_benchmarks: --only needs a list" >&2; exit 2; }
      for s in ${2//,/ }; do
        [[ ",$ALL," == *",$s,"* ]] || {
          echo "run_benchmarks: unknown section '$s' (sections: $ALL)" >&2; exit 2; }
      done
      ONLY="machine,$2"; shift ;;
    --doc)
      [ $# -ge 2 ] || { echo "run_benchmarks: --doc needs a file" >&2; exit 2; }
      DOC="$2"; shift ;;
    --no-doc) NO_DOC=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_benchmarks: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
cd "$ROOT" || exit 1
[ "$NO_DOC" = 1 ] && [ -n "$DOC" ] && {
  echo "run_benchmarks: --doc and --no-doc together" >&2; exit 2; }

# Where the outputs go.  Quick figures never land in docs/.
same_path() { [ "$(realpath -m "$1")" = "$(realpath -m "$2")" ]; }
if [ "$QUICK" = 1 ]; then
  OUT="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/cb_bench_quick.XXXXXX")}"
  if same_path "$OUT" docs/bench; then
    echo "run_benchmarks: --quick does not write to docs/bench (leave OUT unset for a" \
         "temporary directory)" >&2
    exit 2
  fi
  if [ -n "$DOC" ] && same_path "$DOC" docs/BENCHMARKS.md; then
    echo "run_benchmarks: --quick does not rewrite docs/BENCHMARKS.md (copy it and pass" \
         "the copy to --doc)" >&2
    exit 2
  fi
else
  OUT="${OUT:-docs/bench}"
  # The doc links its plots relative to itself: only docs/bench belongs in it.
  if [ -z "$DOC" ] && [ "$NO_DOC" = 0 ] && same_path "$OUT" docs/bench; then
    DOC="docs/BENCHMARKS.md"
  fi
fi
[ "$NO_DOC" = 1 ] && DOC=""
BENCH="$BUILD/bin/cb_bench"
DATASET="${DATASET:-${CB_DEV_DATA:-}}"
# The model every section runs, named in machine.txt: the project's default
# unless CB_MODEL says otherwise (so does the pipeline bench of §7).
export CB_MODEL="${CB_MODEL:-models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}"
MODEL_ARGS=(--model "$CB_MODEL")
if [ ! -f "$CB_MODEL" ]; then
  echo "run_benchmarks: no model at $CB_MODEL (scripts/setup.sh model qwen1.5b fetches" \
       "the default; CB_MODEL=FILE picks another)" >&2
  exit 1
fi
if [ ! -x "$BENCH" ]; then
  echo "run_benchmarks: $BENCH not found: build first (make build, or BUILD=dir)" >&2
  exit 1
fi
if [ -n "$DOC" ] && [ ! -f "$DOC" ]; then
  echo "run_benchmarks: no doc $DOC to rewrite" >&2
  exit 2
fi
mkdir -p "$OUT"

# Sizes: BENCHMARKS.md's, or small ones for --quick.
if [ "$QUICK" = 1 ]; then
  PREFILL="64,128"; DECODE=16; ROUNDS=1
  TTFT_CHUNKS=2; TTFT_TOKENS=64; CAPS="20,200,2000"
  Q_LIMIT=2; Q_LIMIT_SMALL=1; Q_LIMIT_RATIO=1; CTRL_CAPS="500,25"; CTRL_REPEAT=1
else
  PREFILL="512,2048"; DECODE=128; ROUNDS=3
  TTFT_CHUNKS=8; TTFT_TOKENS=512; CAPS="5,10,25,100,500,2000"
  Q_LIMIT=50; Q_LIMIT_SMALL=10; Q_LIMIT_RATIO=30; CTRL_CAPS="2000,500,100,25,10,5,3,2"
  CTRL_REPEAT=3
fi

RUN_START="$(date -u '+%Y-%m-%d %H:%M UTC')"
T0=$SECONDS
COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [ "$COMMIT" = unknown ]; then
  TREE="unknown (not a git checkout)"
else
  # --no-optional-locks: never take the index lock (a commit may be running).
  n_dirty="$(git -C "$ROOT" --no-optional-locks status --porcelain --untracked-files=no \
    2>/dev/null | wc -l)"
  if [ "$n_dirty" = 0 ]; then TREE="clean"; else
    TREE="dirty ($n_dirty tracked files differ from $COMMIT)"; fi
fi

# A command cut short leaves no half-written output behind.
trap 'rm -f "$OUT"/*.part' EXIT
FAILED=()
want() { [[ ",$ONLY," == *",$1,"* ]]; }
# $OUT/runs.tsv: per output file, the run (start), commit, seconds and
# command that produced it; a file's line is replaced when it is redone.
RUNS="$OUT/runs.tsv"
# The command as one line to paste into a shell: words quoted only when needed.
shell_words() {
  local a out=""
  for a in "$@"; do
    if [[ "$a" =~ ^[A-Za-z0-9_./,:=+@%-]+$ ]]; then
      out+="$a "
    else
      out+="'${a//\'/\'\\\'\'}' "
    fi
  done
  printf '%s' "${out% }"
}
record() {  # FILE SECONDS COMMAND...
  local name secs cmd
  name="$(basename "$1")"; secs="$2"; shift 2
  cmd="$(shell_words "$@")"
  {
    if [ -f "$RUNS" ]; then
      awk -F'\t' -v f="$name" '$1 != f' "$RUNS"
    else
      printf '# file\trun started\tcommit\tseconds\tcommand\n'
    fi
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$RUN_START" "$COMMIT" "$secs" "$cmd"
  } > "$RUNS.new" && mv "$RUNS.new" "$RUNS"
}
# Runs a command, echoing it; its stdout goes to FILE, which is only replaced
# when the command succeeds.
run_to() {
  local file="$1"; shift
  local t=$SECONDS
  echo "+ $* > $file"
  if "$@" > "$file.part"; then
    mv "$file.part" "$file"
    record "$file" $((SECONDS - t)) "$@"
  else
    echo "run_benchmarks: failed: $* (previous $file kept)" >&2
    rm -f "$file.part"
    FAILED+=("$file")
  fi
}
section() { echo; echo "== $1"; }

section "machine"
{
  echo "date: $RUN_START"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
  echo "cores: $(nproc) available to this process; $(lscpu | sed -n 's/^CPU(s): *//p' | head -1) online"
  echo "cpu flags: $(grep -o -w -E 'avx2|avx512f|fma|f16c|neon|asimd' /proc/cpuinfo | sort -u |
    tr '\n' ' ' | sed 's/ $//')"
  echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
  echo "kernel: $(uname -sr)"
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "commit: $COMMIT"
  echo "tree: $TREE"
  echo "build: $BUILD ($(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$BUILD/CMakeCache.txt" \
    2>/dev/null | head -1))"
  echo "threads: $THREADS"
  echo "quick: $QUICK"
  echo "model: $CB_MODEL"
  echo "sections: ${ONLY#machine,}"
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
      --rounds "$ROUNDS" --prefill "$PREFILL" --decode "$DECODE" --cb-bench "$BENCH" \
      "${MODEL_ARGS[@]}"
  else
    echo "(no llama.cpp peer in build/peer: run 'make peer' for the side-by-side table)"
  fi
fi

if want ttft; then
  section "§3 TTFT per mode and ratio"
  run_to "$OUT/ttft.jsonl" "$BENCH" ttft --chunks "$TTFT_CHUNKS" --chunk-tokens "$TTFT_TOKENS" \
    --query-tokens 32 --ratio 0.05,0.1,0.2,0.3,0.5,1.0 --repeat 1 --threads "$THREADS" --json \
    --plot "$OUT/ttft_ratio.png" "${MODEL_ARGS[@]}"
  section "TTFT per read cap (chunk KV on flash, q8)"
  run_to "$OUT/ttft_caps.jsonl" "$BENCH" ttft --chunks "$TTFT_CHUNKS" \
    --chunk-tokens "$TTFT_TOKENS" --query-tokens 32 --modes full,reuse,blend --ratio 0.2,auto \
    --codec q8 --storage-mbps "$CAPS" --repeat 1 --threads "$THREADS" --json \
    --plot "$OUT/ttft_caps.png" "${MODEL_ARGS[@]}"
fi

if want codecs; then
  section "§6 codec sizes and speed"
  if [ -x "$BUILD/bin/test_cache" ]; then
    run_to "$OUT/codec_sizes.txt" "$BUILD/bin/test_cache" --gtest_also_run_disabled_tests \
      --gtest_filter='CodecBench.*'
  else
    echo "(no $BUILD/bin/test_cache: build the tests)"
    FAILED+=("codecs: no test_cache")
  fi
fi

if want quality || want head || want codecs || want ratio; then
  if [ -z "$DATASET" ] || [ ! -f "$DATASET" ]; then
    echo "(no dataset${DATASET:+ at $DATASET}: set DATASET=FILE for the quality sections)"
    FAILED+=("quality: no dataset")
  else
    if want quality; then
      section "§4 answer quality (MuSiQue dev)"
      run_to "$OUT/quality.jsonl" "$BENCH" quality --dataset "$DATASET" --limit "$Q_LIMIT" \
        --max-chunks 2 --threads "$THREADS" --json --plot "$OUT/quality.png" \
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
    if want ratio; then
      section "§8 fidelity per recompute ratio"
      run_to "$OUT/quality_ratio.jsonl" "$BENCH" quality --dataset "$DATASET" \
        --limit "$Q_LIMIT_RATIO" --max-chunks 2 --modes blend --ratio 0.1,0.2,0.3,0.5,1 \
        --threads "$THREADS" --json --plot "$OUT/quality_ratio.png" "${MODEL_ARGS[@]}"
    fi
  fi
fi

if want pipeline; then
  section "§7 layerwise pipeline"
  if [ -x "$BUILD/bin/test_runtime" ]; then
    run_to "$OUT/pipeline.txt" env CB_BENCH_THREADS="$THREADS" "$BUILD/bin/test_runtime" \
      --gtest_also_run_disabled_tests --gtest_filter='PipelineBench*'
  else
    echo "(no $BUILD/bin/test_runtime: build the tests)"
    FAILED+=("pipeline: no test_runtime")
  fi
fi

if want controller; then
  section "§8 loading controller vs read cap"
  run_to "$OUT/loading_controller.log" python3 scripts/bench_loading_controller.py \
    --cb-bench "$BENCH" --caps "$CTRL_CAPS" --chunks "$TTFT_CHUNKS" \
    --chunk-tokens "$TTFT_TOKENS" --threads "$THREADS" --repeat "$CTRL_REPEAT" --out-dir "$OUT" \
    "${MODEL_ARGS[@]}"
fi

if want rag; then
  section "§9 RAG assistant on the demo corpus"
  store="$(mktemp -d "${TMPDIR:-/tmp}/rag_bench.XXXXXX")"
  run_to "$OUT/rag_demo.txt" python3 scripts/rag_demo.py --bin "$BUILD/bin/rag_assistant" \
    --store "$store" --threads "$THREADS" "${MODEL_ARGS[@]}"
  rm -rf "$store"
fi

{
  echo "finished: $(date -u '+%Y-%m-%d %H:%M UTC') ($((SECONDS - T0)) s)"
  echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee -a "$OUT/machine.txt"

if [ -n "$DOC" ]; then
  section "rewriting the generated regions of $DOC"
  if ! python3 scripts/write_benchmarks_md.py --bench-dir "$OUT" --doc "$DOC"; then
    FAILED+=("doc: $DOC")
  fi
fi

echo
echo "outputs in $OUT:"
ls -1 "$OUT"
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "run_benchmarks: ${#FAILED[@]} section(s) failed or were skipped: ${FAILED[*]}" >&2
  exit 1
fi
