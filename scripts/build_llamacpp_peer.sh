#!/usr/bin/env bash
# Builds the llama.cpp "peer" (the reference implementation the benchmarks and
# the golden files are compared against) from the llama.cpp sources vendored in
# the pinned llama-cpp-python sdist.  Idempotent: every step is skipped when done.
#
#   scripts/build_llamacpp_peer.sh           build; print the llama-bench path
#   scripts/build_llamacpp_peer.sh --libdir  build; print the dir holding libllama.so
#   scripts/build_llamacpp_peer.sh --bench [llama-bench args...]
#                                            build, then run llama-bench on the model
#                                            (default: -t 2 -p 512,2048 -n 128 -r 5 --prio 2;
#                                            raised priority so that other jobs on a shared
#                                            machine disturb it less) and write
#                                            build/peer/llama-bench.json
#   scripts/build_llamacpp_peer.sh --cuda    build llama-bench and test-backend-ops (per-op
#                                            timings) with ggml's CUDA backend instead, for a
#                                            GPU machine (scripts/gpu_bundle.sh carries them);
#                                            print the folder of its binaries
#
# The sdist is cached in ${CB_CACHE_DIR:-~/.cache/cacheblend-rt}/sdist; sources go
# to build/peer/src, the build to build/peer/build (CPU only, -march=native,
# Release, shared libraries so llama-cpp-python can load the same libllama).
# llama-quantize is built too: regen_goldens.sh uses it to make an F32 copy of the
# model for the exact check of the float64 reference.
# CB_PEER_JOBS (default 2) sets the build parallelism.  The CUDA build goes to
# build/peer/build-cuda: native code for PEER_CUDA_ARCHS (default 90-real, H100
# and H200), no CPU extensions beyond x86-64's baseline (the GPU machine's CPU is
# not this one), flash attention compiled in as llama.cpp's default build has it;
# about 20 min on 2 cores the first time, and it needs nvcc.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../tests/oracle/pins.sh
source "$ROOT/tests/oracle/pins.sh"
CACHE_DIR="${CB_CACHE_DIR:-$HOME/.cache/cacheblend-rt}"
PEER_DIR="$ROOT/build/peer"
SRC="$PEER_DIR/src"
BLD="$PEER_DIR/build"
JOBS="${CB_PEER_JOBS:-2}"
MODEL="${CB_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
V="$CB_PIN_LLAMA_CPP_PYTHON"
SDIST_NAME="llama_cpp_python-$V.tar.gz"

log() { echo "build_llamacpp_peer: $*" >&2; }

fetch_sdist() {
  local sdist="$CACHE_DIR/sdist/$SDIST_NAME"
  if [ ! -s "$sdist" ]; then
    mkdir -p "$CACHE_DIR/sdist"
    log "downloading llama-cpp-python==$V sdist from PyPI"
    python3 -m pip download -q --no-binary :all: --no-deps --no-build-isolation \
      -d "$CACHE_DIR/sdist" "llama-cpp-python==$V" 2>/dev/null \
    || python3 -m pip download -q --no-binary :all: --no-deps -d "$CACHE_DIR/sdist" "llama-cpp-python==$V"
  fi
  [ -s "$sdist" ] || { log "sdist $sdist not found after download"; exit 1; }
  echo "$sdist"
}

extract_src() {
  local stamp="$SRC/.cb-extracted-$V"
  [ -f "$stamp" ] && return 0
  local sdist; sdist="$(fetch_sdist)"
  log "extracting vendored llama.cpp into $SRC"
  rm -rf "$SRC" "$SRC.tmp"
  mkdir -p "$SRC.tmp"
  tar -xzf "$sdist" -C "$SRC.tmp" --strip-components=3 "llama_cpp_python-$V/vendor/llama.cpp"
  mv "$SRC.tmp" "$SRC"
  touch "$stamp"
  rm -rf "$BLD"   # new sources: configure from scratch
}

# Some virtual machines list the amx flags in /proc/cpuinfo, so
# -march=native compiles ggml's AMX kernels, yet fault on their tile
# instructions (SIGILL: seen on a 2-core Sapphire Rapids guest).  The first
# build is smoke-tested on the model; where it dies of SIGILL, the marker
# below makes every later configure build without AMX (-mno-amx-*), keeping
# every other extension of -march=native.
AMX_FAULTS="$PEER_DIR/amx-faults"

# A fresh configure of the sources in DIR, its output in LOG: Release, shared
# libraries, no other backend, no examples or server; FLAGS on top.
configure_in() {  # DIR LOG FLAGS...
  local dir=$1 logf=$2
  shift 2
  rm -rf "$dir"
  mkdir -p "$dir"
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S "$SRC" -B "$dir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DGGML_BLAS=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_RPC=OFF -DGGML_BACKEND_DL=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_COMMIT="$CB_PIN_LLAMA_CPP_COMMIT" \
    "$@" >"$logf" 2>&1 \
    || { log "cmake configure failed, see $logf"; tail -30 "$logf" >&2; exit 1; }
}

configure() {
  local amx=on flags=()
  if [ -f "$AMX_FAULTS" ]; then
    amx=off
    flags=(-DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
      -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
  fi
  local stamp="$BLD/.cb-configured-$V-amx-$amx"
  [ -f "$stamp" ] && [ -f "$BLD/CMakeCache.txt" ] && return 0
  log "configuring llama.cpp ($CB_PIN_LLAMA_CPP_COMMIT) in $BLD (AMX $amx)"
  configure_in "$BLD" "$PEER_DIR/configure.log" -DGGML_NATIVE=ON -DGGML_CUDA=OFF \
    -DLLAMA_BUILD_TESTS=OFF "${flags[@]}"
  touch "$stamp"
}

build() {
  # cmake --build is a no-op when everything is up to date.
  local t
  for t in llama-bench llama-completion llama-quantize libllama.so; do
    if [ ! -e "$BLD/bin/$t" ]; then
      log "building llama-bench, llama-completion, llama-quantize, libllama (-j$JOBS; ~5 min on 2 idle cores)"
      break
    fi
  done
  cmake --build "$BLD" --target llama-bench llama-completion llama-quantize llama -j "$JOBS" >"$PEER_DIR/build.log" 2>&1 \
    || { log "build failed, see $PEER_DIR/build.log"; tail -30 "$PEER_DIR/build.log" >&2; exit 1; }
}

# Runs a short prefill of the Qwen 0.5B (its Q8_0, Q5_0, Q4_K and Q6_K
# matrices take ggml's AMX kernels where they are built), else of the
# model; on SIGILL with AMX compiled in, rebuilds without it.
smoke_test() {
  local stamp="$BLD/.cb-smoke-tested" model="$ROOT/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
  [ -f "$stamp" ] && return 0
  [ -f "$model" ] || model="$MODEL"
  [ -f "$model" ] || return 0
  local rc=0
  LD_LIBRARY_PATH="$BLD/bin" "$BLD/bin/llama-bench" -m "$model" -t 1 -p 32 -n 0 -r 1 >/dev/null 2>&1 || rc=$?
  if [ "$rc" = 132 ] && [ ! -f "$AMX_FAULTS" ] && grep -qw amx_tile /proc/cpuinfo; then
    log "llama-bench died of SIGILL in AMX code: rebuilding without AMX"
    touch "$AMX_FAULTS"
    configure
    build
    rc=0
    LD_LIBRARY_PATH="$BLD/bin" "$BLD/bin/llama-bench" -m "$model" -t 1 -p 32 -n 0 -r 1 >/dev/null 2>&1 || rc=$?
  fi
  [ "$rc" = 0 ] || { log "llama-bench fails on $model (exit $rc)"; exit 1; }
  touch "$stamp"
}

run_bench() {
  [ -f "$MODEL" ] || { log "model $MODEL not found (run scripts/setup.sh model)"; exit 1; }
  local args=("$@")
  [ ${#args[@]} -gt 0 ] || args=(-t 2 -p 512,2048 -n 128 -r 5 --prio 2)
  local out="$PEER_DIR/llama-bench.json"
  log "running llama-bench -m $MODEL ${args[*]} -o json"
  "$BLD/bin/llama-bench" -m "$MODEL" "${args[@]}" -o json >"$out.tmp"
  mv "$out.tmp" "$out"
  log "wrote $out"
  python3 - "$out" <<'PY' >&2
import json, sys
for r in json.load(open(sys.argv[1])):
    kind = f"pp{r['n_prompt']}" if r['n_gen'] == 0 else f"tg{r['n_gen']}"
    med = sorted(r['samples_ts'])[len(r['samples_ts']) // 2]
    print(f"  {kind:>8}: {r['avg_ts']:9.2f} ± {r['stddev_ts']:.2f} tok/s (median {med:.2f})  threads={r['n_threads']} "
          f"commit={r.get('build_commit')} cpu={r.get('cpu_info')}")
PY
}

# llama-bench, test-backend-ops and their shared libraries with ggml's CUDA
# backend.  ggml's CUDA library calls the driver (libcuda.so.1), which a
# machine without a GPU lacks: the programs are linked without resolving it
# (--allow-shlib-undefined; the GPU machine's driver provides it at run time).
build_cuda() {
  local bld="$PEER_DIR/build-cuda" archs="${PEER_CUDA_ARCHS:-90-real}"
  local stamp="$bld/.cb-configured-$V-$archs"
  command -v nvcc >/dev/null || { log "--cuda needs nvcc (the CUDA toolkit)"; exit 1; }
  if [ ! -f "$stamp" ] || [ ! -f "$bld/CMakeCache.txt" ]; then
    log "configuring llama.cpp ($CB_PIN_LLAMA_CPP_COMMIT) with CUDA for $archs in $bld"
    configure_in "$bld" "$PEER_DIR/configure-cuda.log" -DGGML_NATIVE=OFF -DGGML_CUDA=ON \
      "-DCMAKE_CUDA_ARCHITECTURES=$archs" -DGGML_CUDA_NCCL=OFF -DLLAMA_BUILD_TESTS=ON \
      -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined
    touch "$stamp"
  fi
  [ -e "$bld/bin/test-backend-ops" ] ||
    log "building llama-bench and test-backend-ops with CUDA (-j$JOBS; ~20 min on 2 idle cores)"
  cmake --build "$bld" --target llama-bench test-backend-ops -j "$JOBS" >"$PEER_DIR/build-cuda.log" 2>&1 \
    || { log "build failed, see $PEER_DIR/build-cuda.log"; tail -30 "$PEER_DIR/build-cuda.log" >&2; exit 1; }
  echo "$bld/bin"
}

mode="path"
case "${1:-}" in
  --bench) mode="bench"; shift ;;
  --cuda) mode="cuda"; shift ;;
  --libdir) mode="libdir"; shift ;;
  "") ;;
  -h|--help) sed -n 2,17p "$0"; exit 0 ;;
  *) log "unknown argument $1"; exit 2 ;;
esac

mkdir -p "$PEER_DIR" "$CACHE_DIR"
# One build at a time (several sessions share the checkout); the lock lives in
# the cache so that deleting build/ cannot break it.
exec 9>"$CACHE_DIR/.peer-build.lock"
if ! flock -n 9; then
  log "another build_llamacpp_peer.sh is running; waiting for it"
  flock 9
fi
extract_src
if [ "$mode" = cuda ]; then
  build_cuda
  exit 0
fi
configure
build
smoke_test
case "$mode" in
  bench) run_bench "$@"; echo "$PEER_DIR/llama-bench.json" ;;
  libdir) echo "$BLD/bin" ;;
  *) echo "$BLD/bin/llama-bench" ;;
esac
