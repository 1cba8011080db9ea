#!/usr/bin/env bash
# Cross-builds the runtime for aarch64 Linux and runs it under qemu-user:
#  1. the CPU kernels' tests (test_kernels), so the NEON kernels are proven
#     against the scalar reference, not just compiled;
#  2. the whole runtime on the real model: libcacheblend.so, cb_bench and
#     rag_assistant built for aarch64; last-position logits within 1e-3 of
#     the float64 reference (ReferenceForward) and a greedy chat answer
#     (LlamaCppGolden.ChatAnswerNamesParis), cb_bench generate and ttft
#     (full, reuse, blend), and a rag_assistant ingest + ask whose chunk
#     comes from the KV store.  (The full llama.cpp greedy comparison takes
#     too long under emulation; it runs natively in the suite.)
#
#   scripts/test_arm.sh [BUILD_DIR]      (default: build-arm64)
#
# Installs what is missing first (idempotent): the cross compiler, qemu-user
# and the arm64 multiarch -dev packages the top-level CMakeLists.txt looks
# for.  QEMU_CPU picks the emulated CPU (default "max": NEON + dot product);
# set QEMU_CPU=cortex-a53 to run the NEON kernels without dot product.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build-arm64}"
JOBS="${JOBS:-$(nproc)}"

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
APT=(env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -y -q)

HOST_PKGS=(g++-aarch64-linux-gnu qemu-user cmake pkg-config nlohmann-json3-dev)
ARM_PKGS=(libstdc++6:arm64 libgcc-s1:arm64 libgtest-dev:arm64 libmimalloc-dev:arm64 libxxhash-dev:arm64 libzstd-dev:arm64
          libsqlite3-dev:arm64 libutf8proc-dev:arm64 libhiredis-dev:arm64 zlib1g-dev:arm64)
MODEL="${CB_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}"

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

missing=()
for p in "${HOST_PKGS[@]}" "${ARM_PKGS[@]}"; do installed "$p" || missing+=("$p"); done
if ((${#missing[@]})); then
  echo "test_arm: installing ${missing[*]}"
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    $SUDO dpkg --add-architecture arm64
  fi
  $SUDO "${APT[@]}" update
  $SUDO "${APT[@]}" install --no-install-recommends "${missing[@]}"
fi

cmake -S "$ROOT" -B "$BUILD" -DCMAKE_TOOLCHAIN_FILE="$ROOT/scripts/aarch64-linux-gnu.cmake" \
  -DCMAKE_BUILD_TYPE=Release -DCB_CUDA=OFF -DCB_WERROR=ON >/dev/null
cmake --build "$BUILD" -j"$JOBS" --target cb_platform cb_kernels test_kernels

export QEMU_CPU="${QEMU_CPU:-max}"
# -L /: the arm64 loader, libc and libraries (mimalloc, xxhash) come from the
# multiarch directories the -dev packages installed into.  (With the cross
# toolchain's copy, -L /usr/aarch64-linux-gnu, qemu-user 7.2 hangs in
# pthread_create of dynamically linked programs on this host.)
arm() { qemu-aarch64 -L / "$@"; }
say() { echo "test_arm: $*"; }
arm "$BUILD/bin/test_kernels" --gtest_brief=1

# 2. The runtime on the real model.
if [ ! -f "$MODEL" ]; then
  say "no model at $MODEL (scripts/setup.sh model): the runtime checks need it" >&2
  exit 1
fi
cmake --build "$BUILD" -j"$JOBS" --target cacheblend cb_bench rag_assistant test_integration
say "last-position logits against the float64 reference; a greedy chat answer"
bash "$ROOT/tests/oracle/run_reference.sh" "$MODEL" "$BUILD/oracle/reference"
# Two of the prompts (plain text and the chat template): emulated NEON
# prefills a few tokens per second.
CB_MODEL="$MODEL" CB_REFERENCE_PROMPTS=plain_france,chat_france arm "$BUILD/bin/test_integration" \
  --gtest_brief=1 --gtest_filter='ReferenceForward.LastLogitsMatchFloat64Reference:LlamaCppGolden.ChatAnswerNamesParis'

say "cb_bench generate"
out=$(arm "$BUILD/bin/cb_bench" generate --model "$MODEL" --threads 2 \
  --prompt "The capital of France is" --max-tokens 4 2>&1)
echo "$out"
grep -q "Paris" <<<"$out" || { say "generate did not continue with Paris" >&2; exit 1; }

say "cb_bench ttft: full, reuse and blend on 2 chunks"
out=$(arm "$BUILD/bin/cb_bench" ttft --model "$MODEL" --threads 2 --chunks 2 --chunk-tokens 16 \
  --query-tokens 8 --modes full,reuse,blend --repeat 1 2>&1)
echo "$out"
for mode in full reuse blend; do
  grep -q "^$mode " <<<"$out" || { say "ttft printed no $mode row" >&2; exit 1; }
done

say "rag_assistant ingest + ask"
store="$BUILD/rag_store"
rm -rf "$store"
docs="$BUILD/rag_docs"
mkdir -p "$docs"
printf '# Vault\n\nThe code of the vault is 4721. Only the manager knows it.\n' >"$docs/vault.md"
printf '# Museum\n\nThe museum opens at nine and closes at five.\n' >"$docs/museum.md"
arm "$BUILD/bin/rag_assistant" --store "$store" --model "$MODEL" --threads 2 ingest "$docs"
out=$(arm "$BUILD/bin/rag_assistant" --store "$store" --model "$MODEL" --threads 2 \
  ask "What is the code of the vault?" --max-tokens 12 --json 2>&1)
echo "$out"
grep -q '"cache_hits": *[1-9]' <<<"$out" || { say "the ask found no chunk in the KV store" >&2; exit 1; }
grep -q '4721' <<<"$out" || { say "the answer does not name the code" >&2; exit 1; }
say "aarch64 runtime checks passed"
