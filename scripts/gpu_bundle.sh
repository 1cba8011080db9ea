#!/usr/bin/env bash
# Builds what scripts/gpu_check.sh runs on a GPU machine that has no build
# tools for this project and cannot download anything, and gathers it in
# one folder of a few tens of MiB: the binaries (native code for sm_90,
# H100/H200, and sm_87, Jetson Orin), the shared libraries they need that
# such a machine may lack, a same-shape clone of the model
# (scripts/gguf_shape_clone.py: the real file is too large to move) and a
# MuSiQue-style dev split for the quality command.  Also a clone of the C
# API suite's model (TEST_MODEL) and a tiny random-weight model of each
# architecture.  And, in a folder of its own (PEER_BUNDLE, default
# BUNDLE-peer: ~22 MB, too much beside the rest for one transfer of 64 MiB),
# the peer: llama.cpp's llama-bench and test-backend-ops with its CUDA
# backend and their libraries, xz-compressed (scripts/build_llamacpp_peer.sh
# --cuda, ~20 min to build the first time; PEER=0 leaves it out), so that
# both run on the same GPU and file.
#
#   scripts/gpu_bundle.sh [MODEL.gguf] [DATASET.json]
#
# Environment: BUILD (default build-cuda), BUNDLE (default .gpu),
# CUDA_ARCHS (default "90-real;87-real"), PYTHON (a Python with the gguf
# package; default the oracle venv of scripts/oracle_venv.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MODEL=${1:-models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}
DATASET=${2:-${CB_DEV_DATA:-}}
BUILD=${BUILD:-build-cuda}
BUNDLE=${BUNDLE:-.gpu}
PEER_BUNDLE=${PEER_BUNDLE:-$BUNDLE-peer}
CUDA_ARCHS=${CUDA_ARCHS:-90-real;87-real}
PYTHON=${PYTHON:-${CB_CACHE_DIR:-$HOME/.cache/cacheblend-rt}/venv/bin/python}

[ -f "$MODEL" ] || { echo "gpu_bundle: no model at $MODEL" >&2; exit 1; }
if [ ! -x "$PYTHON" ]; then
  bash scripts/oracle_venv.sh >/dev/null
fi

cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCB_CUDA=ON -DCB_WERROR=ON \
  "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS" >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target cacheblend_cuda cb_bench test_cuda test_c_api \
  test_integration cuda_bench cb_layer_bench

rm -rf "${BUNDLE:?}"/{bin,lib,model,test_model,data,arch}
mkdir -p "$BUNDLE/bin" "$BUNDLE/lib" "$BUNDLE/data"
for b in cb_bench test_cuda test_c_api test_integration cuda_bench cb_layer_bench; do
  cp "$BUILD/bin/$b" "$BUNDLE/bin/"
done
cp -P "$BUILD"/lib/libcacheblend.so* "$BUILD"/lib/libcacheblend-cuda.so* "$BUNDLE/lib/"
# The Debian libraries the core links; CUDA's own come from the GPU
# machine's toolkit.
ldd "$BUILD/lib/libcacheblend.so.0" | awk '/=> \// {print $3}' |
  grep -Ev 'lib(c|m|gcc_s|stdc\+\+|pthread|dl|rt)\.so' | while read -r lib; do
    cp -L "$lib" "$BUNDLE/lib/"
  done
"$PYTHON" scripts/gguf_shape_clone.py pack "$MODEL" "$BUNDLE/model"
# The C API suite's model (its clone: the suite's answer-content checks fail
# on it, everything else runs).
TEST_MODEL=${TEST_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$TEST_MODEL" ] && "$PYTHON" scripts/gguf_shape_clone.py pack "$TEST_MODEL" "$BUNDLE/test_model"
[ -n "$DATASET" ] && cp "$DATASET" "$BUNDLE/data/dev.json"
# A tiny random-weight model of each architecture (a few hundred KiB in
# all): the CUDA sessions run on every layer kind, not only the clones'.
for arch in llama llama3 qwen2 qwen3 gemma3; do
  "$PYTHON" tests/oracle/write_random_gguf.py --arch "$arch" --out "$BUNDLE/arch" >/dev/null
done
rm -f "$BUNDLE"/arch/*.json
if [ "${PEER:-1}" = 1 ]; then
  PEER_BIN=$(bash scripts/build_llamacpp_peer.sh --cuda)
  stage=$(mktemp -d)
  cp "$PEER_BIN/llama-bench" "$PEER_BIN/test-backend-ops" "$stage/"
  cp -P "$PEER_BIN"/lib*.so* "$stage/"
  # ggml's CPU backend takes OpenMP's runtime; CUDA's own libraries and the
  # driver come from the GPU machine.
  ldd "$PEER_BIN/libggml-cpu.so" | awk '/libgomp/ {print $3}' | xargs -r -I{} cp -L {} "$stage/"
  rm -rf "${PEER_BUNDLE:?}"
  mkdir -p "$PEER_BUNDLE"
  XZ_OPT=-T0 tar -C "$stage" -cJf "$PEER_BUNDLE/peer.tar.xz" .
  rm -rf "$stage"
  du -sh "$PEER_BUNDLE"
fi
du -sh "$BUNDLE"
echo "gpu_bundle: carry $BUNDLE (and $PEER_BUNDLE, in a call of its own) and run scripts/gpu_check.sh $BUNDLE"
