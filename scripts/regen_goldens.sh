#!/usr/bin/env bash
# Regenerates the llama.cpp golden files (tests/golden/llamacpp.json and
# tests/golden/reference_prompts.json; for Gemma 3 270M llamacpp_gemma3.json and
# reference_prompts_gemma3.json, for Qwen2.5-Coder 0.5B llamacpp_qwen2_0.5b.json
# and reference_prompts_qwen2_0.5b.json, both with the points where llama.cpp
# parts from the float64 reference), then validates the float64 NumPy reference
# against llama.cpp on the same prompts and on a random-weight model of every
# architecture.  Not part of CI: run it by hand after changing a model, the
# pins or the golden prompts; commit the files it writes.  The validation fails (exit 1) if the reference and llama.cpp
# disagree: to float32 precision on an F32 copy of the model, or by more than
# 0.2 relative L2 / a non-near-tie argmax on the quantized model.
#
#   scripts/regen_goldens.sh            regenerate + validate
#   scripts/regen_goldens.sh --check    only validate (reference vs llama.cpp)
#
# llama-cpp-python (pinned in tests/oracle/pins.sh) goes into
# ${CB_CACHE_DIR:-~/.cache/cacheblend-rt}/venv-llamacpp, installed from its sdist
# with LLAMA_BUILD=OFF: it loads the libllama.so of the llama.cpp peer built by
# scripts/build_llamacpp_peer.sh (same vendored sources, CPU only), through
# llama-cpp-python's LLAMA_CPP_LIB_PATH, so llama.cpp is compiled once.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../tests/oracle/pins.sh
source "$ROOT/tests/oracle/pins.sh"
CACHE_DIR="${CB_CACHE_DIR:-$HOME/.cache/cacheblend-rt}"
VENV="$CACHE_DIR/venv-llamacpp"
MODEL="${CB_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
GOLDEN="$ROOT/tests/golden/llamacpp.json"
PROMPTS="$ROOT/tests/golden/reference_prompts.json"
LOGITS="$ROOT/build/peer/golden-logits"
QWEN05="$ROOT/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN05_GOLDEN="$ROOT/tests/golden/llamacpp_qwen2_0.5b.json"
QWEN05_PROMPTS="$ROOT/tests/golden/reference_prompts_qwen2_0.5b.json"
QWEN05_LOGITS="$ROOT/build/peer/golden-logits-qwen2_0.5b"
V="$CB_PIN_LLAMA_CPP_PYTHON"
WANT="llama-cpp-python==$V numpy==$CB_PIN_NUMPY lib=peer"

log() { echo "regen_goldens: $*" >&2; }

check_only=0
case "${1:-}" in
  --check) check_only=1 ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

[ -f "$MODEL" ] || { log "model $MODEL not found (run scripts/setup.sh model)"; exit 1; }

LIBDIR="$("$ROOT/scripts/build_llamacpp_peer.sh" --libdir)"

ensure_venv() {
  if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.cb-pins" 2>/dev/null)" = "$WANT" ]; then
    return 0
  fi
  local sdist="$CACHE_DIR/sdist/llama_cpp_python-$V.tar.gz"
  [ -s "$sdist" ] || { log "missing $sdist (build_llamacpp_peer.sh downloads it)"; exit 1; }
  log "creating $VENV with llama-cpp-python==$V (bindings only, using the peer's libllama)"
  rm -rf "$VENV"
  "${CB_PYTHON:-python3}" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "numpy==$CB_PIN_NUMPY"
  CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" \
    "$VENV/bin/pip" install -q --disable-pip-version-check "$sdist"
  echo "$WANT" >"$VENV/.cb-pins"
}

if [ "$check_only" = 0 ]; then
  ensure_venv
  log "generating goldens with llama.cpp $CB_PIN_LLAMA_CPP_COMMIT"
  CB_LLAMA_CPP_COMMIT="$CB_PIN_LLAMA_CPP_COMMIT" LLAMA_CPP_LIB_PATH="$LIBDIR" \
    "$VENV/bin/python" "$ROOT/tests/oracle/llamacpp_golden.py" \
      --model "$MODEL" --golden "$GOLDEN" --prompts "$PROMPTS" --dump-logits "$LOGITS"
  # Gemma 3 one token at a time: this peer's batched path fails on it.
  GEMMA="$ROOT/models/gemma-3-270m-q4_k_m.gguf"
  [ -f "$GEMMA" ] || { log "$GEMMA not found (run scripts/setup.sh model)"; exit 1; }
  CB_LLAMA_CPP_COMMIT="$CB_PIN_LLAMA_CPP_COMMIT" LLAMA_CPP_LIB_PATH="$LIBDIR" \
    "$VENV/bin/python" "$ROOT/tests/oracle/llamacpp_golden.py" --model "$GEMMA" \
      --golden "$ROOT/tests/golden/llamacpp_gemma3.json" --chat gemma --n-batch 1 \
      --prompts "$ROOT/tests/golden/reference_prompts_gemma3.json"
  "$("$ROOT/scripts/oracle_venv.sh" --print-python)" "$ROOT/tests/oracle/reference_divergences.py" \
    --model "$GEMMA" --golden "$ROOT/tests/golden/llamacpp_gemma3.json" \
    --prompts "$ROOT/tests/golden/reference_prompts_gemma3.json"
  # Qwen2.5-Coder 0.5B: its own prompts (code, ChatML with Qwen's system turn) and
  # tokenizer cases after the common ones, and its chat template's renderings.
  [ -f "$QWEN05" ] || { log "$QWEN05 not found (run scripts/setup.sh model qwen0.5b)"; exit 1; }
  CB_LLAMA_CPP_COMMIT="$CB_PIN_LLAMA_CPP_COMMIT" LLAMA_CPP_LIB_PATH="$LIBDIR" \
    "$VENV/bin/python" "$ROOT/tests/oracle/llamacpp_golden.py" --model "$QWEN05" \
      --golden "$QWEN05_GOLDEN" --prompts "$QWEN05_PROMPTS" --prompt-set qwen --tokenize-set qwen \
      --chat-template --dump-logits "$QWEN05_LOGITS"
  "$("$ROOT/scripts/oracle_venv.sh" --print-python)" "$ROOT/tests/oracle/reference_divergences.py" \
    --model "$QWEN05" --golden "$QWEN05_GOLDEN" --prompts "$QWEN05_PROMPTS"
fi

ensure_venv
[ -d "$LOGITS" ] || { log "no llama.cpp logits in $LOGITS: run without --check first"; exit 1; }
PY="$("$ROOT/scripts/oracle_venv.sh" --print-python)"
"$PY" "$ROOT/tests/oracle/reference_forward.py" --model "$MODEL" --prompts "$PROMPTS" \
  --out "$ROOT/build/peer/reference"

# Exact check: llama.cpp on an F32 copy of the model (llama-quantize dequantizes with
# ggml's own code) with an F32 KV cache quantizes no activation, so its logits must
# equal the float64 reference's to float32 precision.
F32_MODEL="$CACHE_DIR/diag/$(basename "$MODEL" .gguf).$(stat -c %s "$MODEL").f32.gguf"
if [ ! -s "$F32_MODEL" ]; then
  mkdir -p "$CACHE_DIR/diag"
  log "making an F32 copy of the model: $F32_MODEL"
  "$LIBDIR/llama-quantize" --allow-requantize --pure "$MODEL" "$F32_MODEL.tmp" F32 2 >/dev/null 2>&1 \
    || { log "llama-quantize failed"; exit 1; }
  mv "$F32_MODEL.tmp" "$F32_MODEL"
fi
LLAMA_CPP_LIB_PATH="$LIBDIR" "$VENV/bin/python" "$ROOT/tests/oracle/llamacpp_logits.py" \
  --model "$F32_MODEL" --prompts "$PROMPTS" --out "$ROOT/build/peer/f32-logits" --kv f32
log "reference vs llama.cpp, F32 weights and KV cache (must agree to ~1e-6):"
"$PY" "$ROOT/tests/oracle/compare_reference.py" --reference "$ROOT/build/peer/reference" \
  --llamacpp "$ROOT/build/peer/f32-logits" --max-rel-l2 1e-4
log "reference vs llama.cpp on the quantized model as shipped (activations rounded to 8 bits; ~1e-2):"
"$PY" "$ROOT/tests/oracle/compare_reference.py" --reference "$ROOT/build/peer/reference" \
  --llamacpp "$LOGITS" --golden "$GOLDEN" --max-rel-l2 0.2
# The same on Qwen2.5-Coder 0.5B's golden prompts (its *_at points have no llama.cpp logits).
[ -d "$QWEN05_LOGITS" ] || { log "no llama.cpp logits in $QWEN05_LOGITS: run without --check first"; exit 1; }
"$PY" "$ROOT/tests/oracle/reference_forward.py" --model "$QWEN05" --prompts "$QWEN05_PROMPTS" \
  --out "$ROOT/build/peer/reference-qwen2_0.5b"
log "reference vs llama.cpp on Qwen2.5-Coder 0.5B as shipped (~1e-2):"
"$PY" "$ROOT/tests/oracle/compare_reference.py" --reference "$ROOT/build/peer/reference-qwen2_0.5b" \
  --llamacpp "$QWEN05_LOGITS" --golden "$QWEN05_GOLDEN" --max-rel-l2 0.2
# The float64 reference's reading of every architecture against llama.cpp's: a
# random-weight model of each in F32 (write_random_gguf.py --type f32), F32 KV
# cache, prompts fed one token at a time.  Agreement to float32 precision, but
# for gemma3, where llama.cpp rounds GELU's inputs to f16 (~3e-4).
ARCH_DIR="$ROOT/build/peer/arch-f32"
mkdir -p "$ARCH_DIR"
for arch in llama llama3 qwen2 qwen3 gemma3; do
  "$PY" "$ROOT/tests/oracle/write_random_gguf.py" --arch "$arch" --type f32 --out "$ARCH_DIR"
  "$PY" "$ROOT/tests/oracle/reference_forward.py" --no-cache --model "$ARCH_DIR/$arch.gguf" \
    --prompts "$ARCH_DIR/$arch.prompts.json" --out "$ARCH_DIR/$arch-reference"
  LLAMA_CPP_LIB_PATH="$LIBDIR" "$VENV/bin/python" "$ROOT/tests/oracle/llamacpp_logits.py" \
    --model "$ARCH_DIR/$arch.gguf" --prompts "$ARCH_DIR/$arch.prompts.json" \
    --out "$ARCH_DIR/$arch-llamacpp" --kv f32 --n-batch 1
  log "reference vs llama.cpp, random-weight $arch, F32 weights and KV cache:"
  "$PY" "$ROOT/tests/oracle/compare_reference.py" --reference "$ARCH_DIR/$arch-reference" \
    --llamacpp "$ARCH_DIR/$arch-llamacpp" --max-rel-l2 "$([ "$arch" = gemma3 ] && echo 1e-3 || echo 1e-4)"
done
log "done"
