#!/usr/bin/env bash
# The whole GPU check in one run, on a machine with an NVIDIA GPU and the
# CUDA 13 runtime but none of this project's build tools: the folder made by
# scripts/gpu_bundle.sh (binaries, libraries, a same-shape model clone, a
# dev split) is all it needs.  Order: model, GPU benchmarks, the same on the
# CPU, per-op GPU profiles, tests, quality; each step has its own time limit
# so a slow one costs its own result only.
#
#   scripts/gpu_check.sh BUNDLE OUT_DIR
#
# Writes OUT_DIR/log.txt (everything) and OUT_DIR/results.jsonl (every
# cb_bench --json line, each with "step" added), and ends with the headline
# figures as tables (scripts/gpu_summary.py).  CPU rows use all cores.
# With BUNDLE/base/libcacheblend-cuda.so.0 (an earlier build of the plugin)
# the GPU benchmarks run with it first ("base_" steps), for a comparison on
# the same machine.  With REAL_TEST_MODEL naming the real file of the C API
# suite's model (brought over in pieces: scripts/gpu_stage_model.sh), the
# CUDA sessions, test_c_api (with and without CB_CUDA_BF16) and the float64
# check also run on it.  With REAL_MODEL naming a real model file (the one
# the bundle's clone was made from, brought over the same way), everything
# runs on it instead of the clone, and its fidelity is measured too, GPU and
# CPU.
#
# PARTS (default all of them) picks what runs, so that a check too long for
# one call can be split over two: gpu (the GPU benchmarks), peer (llama.cpp's
# llama-bench on the same file and GPU, from PEER_BUNDLE (default
# BUNDLE-peer, brought over in a call of its own) where it is there, and
# decode's products against the peer's), variants (f32
# activations, bf16 products, dequantization per call, one thread reading
# the chunk KV, an earlier plugin), cpu, profile, tests, quality.
set -uo pipefail
BUNDLE=$(cd "${1:?usage: gpu_check.sh BUNDLE OUT_DIR}" && pwd)
OUT=${2:?usage: gpu_check.sh BUNDLE OUT_DIR}
mkdir -p "$OUT"
LOG=$OUT/log.txt
RESULTS=$OUT/results.jsonl
: >"$LOG"
: >"$RESULTS"
exec > >(tee -a "$LOG") 2>&1

# CUDA's runtime and cuBLAS: the toolkit's, or the pip wheels'.
CUDA_LIBS=$( (ls -d /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib 2>/dev/null;
  find / -xdev -name 'libcublas.so.13' -printf '%h\n' 2>/dev/null) | head -3 | paste -sd:)
export LD_LIBRARY_PATH=$BUNDLE/lib:$CUDA_LIBS:${LD_LIBRARY_PATH:-}
BIN=$BUNDLE/bin
PEER_BUNDLE=${PEER_BUNDLE:-$BUNDLE-peer}
CPU_THREADS=$(nproc)
MODEL=${REAL_MODEL:-/tmp/cb_gpu_check_model.gguf}
export CB_MODEL=$MODEL
PARTS=" ${PARTS:-gpu peer variants cpu profile tests quality} "
want() { [[ $PARTS == *" $1 "* ]]; }

step() {  # step NAME LIMIT_S COMMAND...: runs, times, keeps --json lines
  local name=$1 limit=$2
  shift 2
  echo "=== $name ($(date +%T), limit ${limit}s): $*"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/.step" 2>&1
  local rc=$?
  cat "$OUT/.step"
  grep '^{' "$OUT/.step" | sed "s/^{/{\"step\":\"$name\",/" >>"$RESULTS"
  echo "=== $name: rc $rc, $((SECONDS - t0)) s"
}

echo "host: $(nproc) cores; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
uptime
if [ -n "${REAL_MODEL:-}" ]; then
  echo "model: $REAL_MODEL (real), $(stat -c %s "$REAL_MODEL") bytes"
else
  python3 "$(dirname "$0")/gguf_shape_clone.py" unpack "$BUNDLE/model" "$MODEL" || exit 1
fi

GPU="--backend cuda"
CPU="--backend cpu --threads $CPU_THREADS"
gpu_benchmarks() {  # PREFIX
  for n in 512 2048 8192; do
    step "${1}prefill_$n" 60 "$BIN/cb_bench" prefill --tokens $n --repeat 3 $GPU --json
  done
  step "${1}decode" 60 "$BIN/cb_bench" decode --tokens 128 --repeat 3 $GPU --json
  # Decode tokens issued op by op instead of replayed from one CUDA graph
  # each (the default).
  CB_CUDA_GRAPHS=0 step "${1}decode_issued" 60 "$BIN/cb_bench" decode --tokens 128 --repeat 3 \
    $GPU --json
  step "${1}ttft" 120 "$BIN/cb_bench" ttft --chunks 8 --chunk-tokens 512 --modes full,reuse,blend \
    --repeat 3 $GPU --json
  # The buffers in managed memory instead of device memory (the default),
  # on the same requests: what page migration and first touch cost.
  CB_CUDA_MEMORY=managed step "${1}ttft_managed" 120 "$BIN/cb_bench" ttft --chunks 8 \
    --chunk-tokens 512 --modes full,reuse,blend --repeat 3 $GPU --json
  CB_CUDA_MEMORY=managed step "${1}decode_managed" 60 "$BIN/cb_bench" decode --tokens 128 \
    --repeat 3 $GPU --json
  # Decode's products on int8 activations (the CPU's matmul_q8) instead of
  # f32 ones.
  CB_CUDA_INT8=1 step "${1}decode_int8" 60 "$BIN/cb_bench" decode --tokens 128 --repeat 3 \
    $GPU --json
  # The residual adds and the gated activation folded into the GEMVs (three
  # launches fewer a layer), alone and with int8 activations.
  CB_CUDA_FUSED_GEMV=1 step "${1}decode_fused" 60 "$BIN/cb_bench" decode --tokens 128 --repeat 3 \
    $GPU --json
  CB_CUDA_FUSED_GEMV=1 CB_CUDA_INT8=1 step "${1}decode_fused_int8" 60 "$BIN/cb_bench" decode \
    --tokens 128 --repeat 3 $GPU --json
  # Decode after a long prompt (a RAG request's 4k tokens), its attention
  # one block a head or with the keys split across blocks; and every
  # opt-in of decode at once.
  step "${1}decode_ctx4096" 60 "$BIN/cb_bench" decode --tokens 128 --ctx 4096 --repeat 3 \
    $GPU --json
  CB_CUDA_ATTN_SPLIT=1 step "${1}decode_ctx4096_split" 60 "$BIN/cb_bench" decode --tokens 128 \
    --ctx 4096 --repeat 3 $GPU --json
  CB_CUDA_ATTN_SPLIT=1 step "${1}decode_split" 60 "$BIN/cb_bench" decode --tokens 128 \
    --repeat 3 $GPU --json
  CB_CUDA_FUSED_GEMV=1 CB_CUDA_ATTN_SPLIT=1 CB_CUDA_INT8=1 step "${1}decode_ctx4096_all" 60 \
    "$BIN/cb_bench" decode --tokens 128 --ctx 4096 --repeat 3 $GPU --json
  # Attention of many rows by the tiled kernel instead of cuBLAS: the blend's
  # spread rows score only the keys they see; 8192 tokens, the most
  # attention a prefill here has.
  CB_CUDA_ATTN=tiles step "${1}ttft_attn_tiles" 120 "$BIN/cb_bench" ttft --chunks 8 \
    --chunk-tokens 512 --modes full,reuse,blend --repeat 3 $GPU --json
  CB_CUDA_ATTN=tiles step "${1}prefill_8192_attn_tiles" 60 "$BIN/cb_bench" prefill --tokens 8192 \
    --repeat 3 $GPU --json
}
gpu_variants() {  # PREFIX
  # Every request reading its chunks from the chunk cache and sending them
  # over PCIe (no resident chunks): what keeping them on the device gains.
  step "${1}ttft_resident_off" 120 "$BIN/cb_bench" ttft --chunks 8 --chunk-tokens 512 \
    --modes full,reuse,blend --repeat 3 --resident-kv-mb 0 $GPU --json
  step "${1}ttft_f32" 120 "$BIN/cb_bench" ttft --chunks 8 --chunk-tokens 512 --modes full,blend \
    --repeat 3 --activations f32 $GPU --json
  CB_CUDA_BF16=1 step "${1}ttft_bf16" 120 "$BIN/cb_bench" ttft --chunks 8 --chunk-tokens 512 \
    --modes full,reuse,blend --repeat 3 $GPU --json
  CB_CUDA_BF16=1 step "${1}prefill_8192_bf16" 60 "$BIN/cb_bench" prefill --tokens 8192 --repeat 3 \
    $GPU --json
  # What a blend costs apart from its recomputed rows: several ratios, with
  # and without lookahead's pass of its own (HKVD ranks in the one pass),
  # and without the chunk shift.
  step "${1}ttft_blend_costs" 120 "$BIN/cb_bench" ttft --chunks 8 --chunk-tokens 512 \
    --modes blend --ratio 0.05,0.1,0.2,0.4 --select lookahead,hkvd --repeat 3 $GPU --json
  step "${1}ttft_no_shift" 120 "$BIN/cb_bench" ttft --chunks 8 --chunk-tokens 512 \
    --modes blend --chunk-shift off --repeat 3 $GPU --json
  # The loading controller on the GPU (chunks read from a store on flash):
  # its first-use compute probe, then the ratio it picks against r = 0.2.
  step "${1}ttft_auto" 120 "$BIN/cb_bench" ttft --chunks 8 --chunk-tokens 512 --modes blend \
    --ratio auto,0.2 --codec f16 --repeat 3 $GPU --json
}
# GPU first: the figures this run exists for.
want gpu && gpu_benchmarks gpu_
# The peer beside them: llama.cpp on the same file, every layer on the GPU,
# its default flash attention; prefill at the same lengths, decode 128
# tokens (from an empty context; cb_bench's decode follows a 16-token prompt)
# and after 4096 tokens.
# Then decode's products alone, ours and the peer's, at the same shape
# (4096 outputs of 14336 inputs, Q4_K and Q6_K, weights read from memory):
# how near each comes to the memory bandwidth.
if want peer; then
  step gemv 240 "$BIN/cuda_bench" --gemv
  PEER=/tmp/cb_gpu_check_peer
  rm -rf "$PEER"
  if [ -f "$PEER_BUNDLE/peer.tar.xz" ] && mkdir -p "$PEER" &&
    python3 - "$PEER_BUNDLE/peer.tar.xz" "$PEER" <<'PY'; then
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    try:
        t.extractall(sys.argv[2], filter="data")
    except TypeError:  # a Python without extraction filters
        t.extractall(sys.argv[2])
PY
    LD_LIBRARY_PATH=$PEER:$LD_LIBRARY_PATH step peer_gpu 180 "$PEER/llama-bench" \
      -m "$MODEL" -ngl 99 -p 512,2048,8192 -n 128 -r 3 -o jsonl
    LD_LIBRARY_PATH=$PEER:$LD_LIBRARY_PATH step peer_gpu_depth 120 "$PEER/llama-bench" \
      -m "$MODEL" -ngl 99 -p 0 -n 128 -d 4096 -r 3 -o jsonl
    LD_LIBRARY_PATH=$PEER:$LD_LIBRARY_PATH step peer_gemv 120 "$PEER/test-backend-ops" perf \
      -b CUDA0 -o MUL_MAT -p 'type_a=q[46]_K,type_b=f32,m=4096,n=1,k=14336,'
  else
    echo "=== peer: no $PEER_BUNDLE/peer.tar.xz (scripts/gpu_bundle.sh writes it), skipped"
  fi
fi
if want variants; then
  if [ -f "$BUNDLE/base/libcacheblend-cuda.so.0" ]; then
    CB_CUDA_PLUGIN=$BUNDLE/base/libcacheblend-cuda.so.0 gpu_benchmarks base_gpu_
  fi
  gpu_variants gpu_
  # Without the kept f32 weights (CudaBackendOptions::f32_weight_bytes):
  # what dequantizing at every call costs, on the same machine.
  CB_CUDA_F32_WEIGHTS_MB=0 step gpu_ttft_dequant_per_call 120 "$BIN/cb_bench" ttft --chunks 8 \
    --chunk-tokens 512 --modes full,reuse,blend --repeat 3 $GPU --json
  CB_CUDA_F32_WEIGHTS_MB=0 step gpu_prefill_512_dequant_per_call 60 "$BIN/cb_bench" prefill \
    --tokens 512 --repeat 3 $GPU --json
  # The chunk KV read by one host thread instead of the default (up to 4):
  # what the parallel reads gain the reuse pass (reuse mode is all loads);
  # without resident chunks, which skip the reads.
  step gpu_ttft_fetch_threads_1 120 "$BIN/cb_bench" ttft --chunks 8 --chunk-tokens 512 \
    --modes reuse,blend --repeat 3 --fetch-threads 1 --resident-kv-mb 0 $GPU --json
fi
# The CPU on the same machine (CPU_ROWS=0 skips it and the quality runs).
CPU_ROWS=${CPU_ROWS:-1}
if [ "$CPU_ROWS" = 1 ] && want cpu; then
  step cpu_decode 60 "$BIN/cb_bench" decode --tokens 128 --repeat 1 $CPU --json
  step cpu_prefill_512 60 "$BIN/cb_bench" prefill --tokens 512 --repeat 3 $CPU --json
  step cpu_prefill_2048 60 "$BIN/cb_bench" prefill --tokens 2048 --repeat 1 $CPU --json
  step cpu_ttft 150 "$BIN/cb_bench" ttft --chunks 8 --chunk-tokens 512 --modes full,reuse,blend \
    --repeat 1 $CPU --json
fi
# Where the GPU time goes: per-op totals of 4 requests after the same
# warm-up, full and blend apart (their difference is the blend's), and of
# decode; then where the host's time goes in a request.
if want profile; then
  for mode in full blend; do
    CB_CUDA_PROFILE=1 step "profile_$mode" 60 "$BIN/cb_bench" ttft --chunks 8 --chunk-tokens 512 \
      --modes $mode --repeat 4 $GPU
  done
  CB_CUDA_ATTN=tiles CB_CUDA_PROFILE=1 step profile_blend_attn_tiles 60 "$BIN/cb_bench" ttft \
    --chunks 8 --chunk-tokens 512 --modes blend --repeat 4 $GPU
  CB_CUDA_PROFILE=1 step profile_decode 60 "$BIN/cb_bench" decode --tokens 128 --repeat 1 $GPU
  CB_CUDA_FUSED_GEMV=1 CB_CUDA_PROFILE=1 step profile_decode_fused 60 "$BIN/cb_bench" decode \
    --tokens 128 --repeat 1 $GPU
  # Attention alone, cuBLAS against the tiled kernel, at a blend's, a
  # prefill chunk's and a question's rows.
  step attention 60 "$BIN/cuda_bench" --attention
  # The host's side of a reuse and a blend request (8 x 512 tokens): its
  # time in each kind of op's call (queueing, or waiting where an op reads
  # results back), at batch ends (waiting for the GPU) and in the
  # runtime's own work.
  step host_request 120 "$BIN/cb_layer_bench" request --backend cuda --repeat 3
fi
# Tests: the kernels; a CUDA session against a CPU session on this model
# (prefill, decode, the blend's selected rows and fused cache); the C API.
if want tests; then
  step test_cuda_kernels 120 "$BIN/test_cuda" --gtest_filter='-CudaSession*' --gtest_brief=1
  step test_cuda_session 150 "$BIN/test_cuda" --gtest_filter='CudaSession*'
  CB_CUDA_ATTN=tiles step test_cuda_session_attn_tiles 150 "$BIN/test_cuda" \
    --gtest_filter='CudaSession*'
  CB_CUDA_FUSED_GEMV=1 CB_CUDA_ATTN_SPLIT=1 step test_cuda_session_fused_split 150 \
    "$BIN/test_cuda" --gtest_filter='CudaSession*'
  if command -v compute-sanitizer >/dev/null; then
    step memcheck 150 compute-sanitizer --tool memcheck "$BIN/test_cuda" \
      --gtest_filter='Cuda.Matmul*:Cuda.Int8*:Cuda.Fused*:Cuda.Attention*:Cuda.SplitAttention*:Cuda.TiledAttention*:Cuda.SegmentMeans*:Cuda.KeptF32*:CudaSession.BlendSelection*'
  fi
  # Every architecture's layers on the GPU (tiny random-weight models):
  # against the CPU, graphs against plain decode, the blend.
  for f in "$BUNDLE"/arch/*.gguf; do
    [ -f "$f" ] || continue
    CB_MODEL=$f step "arch_$(basename "$f" .gguf)_cuda_session" 60 "$BIN/test_cuda" \
      --gtest_filter='CudaSession*'
  done
  if [ -d "$BUNDLE/test_model" ]; then
    python3 "$(dirname "$0")/gguf_shape_clone.py" unpack "$BUNDLE/test_model" /tmp/cb_gpu_check_smol.gguf &&
      CB_MODEL=/tmp/cb_gpu_check_smol.gguf step test_c_api 120 "$BIN/test_c_api"
  fi
  if [ -n "${REAL_TEST_MODEL:-}" ]; then
    CB_MODEL=$REAL_TEST_MODEL step real_cuda_session 120 "$BIN/test_cuda" --gtest_filter='CudaSession*'
    for bf16 in 0 1; do  # the C API's defaults take the bf16 products with CB_CUDA_BF16=1
      CB_CUDA_BF16=$bf16 CB_MODEL=$REAL_TEST_MODEL step "real_test_c_api_bf16_$bf16" 120 \
        "$BIN/test_c_api"
    done
    # Decode's products on int8 activations (the C API decodes with
    # matmul_q8 by default): its answers and identities on real weights.
    CB_CUDA_INT8=1 CB_MODEL=$REAL_TEST_MODEL step real_test_c_api_int8 120 "$BIN/test_c_api"
    CB_CUDA_ATTN=tiles CB_MODEL=$REAL_TEST_MODEL step real_test_c_api_attn_tiles 120 \
      "$BIN/test_c_api"
    CB_CUDA_FUSED_GEMV=1 CB_CUDA_ATTN_SPLIT=1 CB_MODEL=$REAL_TEST_MODEL \
      step real_test_c_api_fused_split 120 "$BIN/test_c_api"
    # Against the float64 oracle: its logits are read from the build's
    # oracle/reference folder (the path compiled in), so it runs where that
    # folder was brought to the same path.
    CB_MODEL=$REAL_TEST_MODEL step real_float64_reference 120 "$BIN/test_integration" \
      --gtest_filter='ReferenceForward.Cuda*'
  fi
fi
# Fidelity of the same requests on both backends: on a clone only a
# comparison of the two (its answers mean nothing), on REAL_MODEL the
# blend's fidelity on real weights.
if [ "$CPU_ROWS" = 1 ] && want quality && [ -f "$BUNDLE/data/dev.json" ]; then
  [ -n "${REAL_MODEL:-}" ] && LIMIT=${QUALITY_LIMIT:-10} || LIMIT=${QUALITY_LIMIT:-5}
  for dev in gpu cpu; do
    [ $dev = gpu ] && B=$GPU || B=$CPU
    step "${dev}_quality" 240 "$BIN/cb_bench" quality --dataset "$BUNDLE/data/dev.json" \
      --limit "$LIMIT" --max-chunks 6 --modes full,reuse,blend --tf-tokens 16 $B --json
  done
fi
rm -f "$OUT/.step"
rm -rf /tmp/cb_gpu_check_peer
# At the end, so that the output's tail holds them: the headline figures side by side.
python3 "$(dirname "$0")/gpu_summary.py" "$RESULTS" || true  # a run of tests alone has no figures
[ -n "${REAL_MODEL:-}" ] || rm -f "$MODEL"
echo "=== done $(date +%T)"
