#!/usr/bin/env bash
# Runs each libFuzzer target for a bounded time.  Seeds: a few GGUF files
# built from the model's header bytes (so the fuzzer starts from the real
# format) and some text for the tokenizer.  Usage: run_fuzzers.sh BUILD_DIR SECONDS
set -euo pipefail
BUILD=${1:?build dir}
SECONDS_EACH=${2:-30}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="${CB_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
WORK="$BUILD/fuzz-work"
mkdir -p "$WORK/gguf-corpus" "$WORK/tok-corpus"
# The first 64 KiB of the model hold the header and much of the metadata.
head -c 65536 "$MODEL" > "$WORK/gguf-corpus/model-head.gguf"
head -c 1024 "$MODEL" > "$WORK/gguf-corpus/model-1k.gguf"
printf 'Hello, World! 123 4567 don'"'"'t  \t\n\n<|im_start|>user\nCaf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80' > "$WORK/tok-corpus/seed.txt"
status=0
for target in gguf tokenizer; do
  corpus="$WORK/gguf-corpus"; [ "$target" = tokenizer ] && corpus="$WORK/tok-corpus"
  echo "fuzz_$target: running for ${SECONDS_EACH}s"
  if ! "$BUILD/bin/fuzz_$target" -max_total_time="$SECONDS_EACH" -max_len=65536 -rss_limit_mb=2048 \
       -print_final_stats=1 -artifact_prefix="$WORK/crash-$target-" "$corpus" > "$WORK/$target.log" 2>&1; then
    echo "fuzz_$target FAILED; log tail:"; tail -n 40 "$WORK/$target.log"; status=1
  else
    grep -E "stat::number_of_executed_units|Done" "$WORK/$target.log" | tail -n 2
  fi
done
if [ $status -eq 0 ]; then echo "fuzzers: both targets ran clean"; else echo "fuzzers: a target failed"; fi
exit $status
