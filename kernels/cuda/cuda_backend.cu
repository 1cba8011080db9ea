// The CUDA backend.  Semantics are those of the scalar reference kernels
// (kernels/cpu/reference_ops.h), op by op:
//
//  - Weight decoding reproduces dequantize_row() bit for bit: the same f32
//    operations in the same order, written with __fmul_rn / __fadd_rn so
//    that nvcc cannot contract them into FMAs (which would change the last
//    bit).  get_rows() is therefore exact.
//  - matmul: up to gemv_max_rows activation rows run a GEMV that decodes the
//    quantized blocks in registers (decode reads each weight once per token,
//    so it is bound by weight bytes and must not expand them); more rows
//    (prefill) dequantize the weight, a slice of output rows at a time, to
//    f32 in a scratch buffer and call cuBLAS SGEMM: the exact path, held to
//    a float64 reference at a relative L2 of 1e-3.  matmul_q8 (the rounded
//    product the runtime uses by default, as for the CPU's int8
//    activations) rounds weights and activations to bf16 on both paths and
//    runs its GEMM on tensor cores.
//  - attention: few query rows (decode) run a kernel, one block per (row,
//    head); many rows go through cuBLAS SGEMM per head and a softmax kernel.
//  - rmsnorm and row_sq_diff accumulate in f64 like the reference; rope
//    computes its angles in f64 and rounds once; the attention kernel is an
//    online (one pass) softmax, so it matches the two-pass reference to
//    rounding.
//
// Streams and synchronisation (docs/CUDA.md "Synchronisation"): every
// calling thread gets its own stream (the KV loader thread's uploads and RoPE
// run beside the compute thread's work).  Outside a batch an op waits for its
// stream before returning, because the runtime's host code may read results
// right after a call; between begin_batch() and end_batch() ops only enqueue,
// except those with an output in host memory.  Host inputs are copied into
// page-locked memory before their asynchronous upload, so the caller may
// reuse them as soon as the op returns, as the Backend contract says.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cub/device/device_radix_sort.cuh>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cuda/cuda_attention.cuh"
#include "kernels/cuda/cuda_attention_tiles.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_gemv.cuh"
#include "kernels/cuda/cuda_plugin.h"
#include "kernels/cuda/cuda_quant.cuh"
#include "kernels/cuda/cuda_row_kernels.cuh"
#include "kernels/cuda/cuda_thread_state.cuh"
#include "platform/error.h"

namespace cb {

// A CUDA event owned by a CudaMark (cuda_backend.h).
struct CudaEvent {
  cudaEvent_t ev = nullptr;
  CudaEvent() = default;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent() {
    if (ev != nullptr) cudaEventDestroy(ev);
  }
};

namespace {

// ------------------------------------------------------------- backend --

// Bytes of f32 scratch for the dequantized weight of the SGEMM path: the
// weight is converted a slice of output rows at a time, so memory stays
// bounded whatever the vocabulary size.
constexpr size_t kGemmScratchBytes = size_t{64} << 20;

// Where a pointer's memory is, for an op argument.
enum class Where {
  kBackend,  // usable in place: this backend's blocks, device or managed memory
  kPinned,   // page-locked host memory the device can address at the same pointer
  kHost,     // pageable host memory
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const CudaBackendOptions& opts)
      : device_(device),
        gemv_max_rows_(std::clamp(opts.gemv_max_rows, 0, kGemvMaxRows)),
        table_(std::make_shared<CtxTable>()) {
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
    int pools = 0, integrated = 0, concurrent = 0;
    cuda_check(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device_),
               "cudaDeviceGetAttribute");
    cuda_check(cudaDeviceGetAttribute(&integrated, cudaDevAttrIntegrated, device_),
               "cudaDeviceGetAttribute");
    cuda_check(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, device_),
               "cudaDeviceGetAttribute");
    // Before the pool, as the budget below: a malformed CB_CUDA_MEMORY throws.
    memory_ = memory_kind(opts.memory, integrated != 0);
    // Prefetching a managed destination before a copy only helps where pages
    // migrate (a discrete GPU with concurrent managed access).
    prefetch_ = memory_ == CudaMemory::kManaged && integrated == 0 && concurrent != 0;
    if (memory_ != CudaMemory::kMapped) {
      // Chunk KV kept on the card between requests: a sixteenth of it, at
      // most 4 GiB (about 100,000 cached tokens of a 1.5B model with an f16
      // cache), beside the weights and their kept f32 copies.
      size_t free_bytes = 0, total = 0;
      cuda_check(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
      resident_kv_bytes_ = std::min<uint64_t>(total / 16, uint64_t{4} << 30);
    }
    // Before the pool: a malformed CB_CUDA_F32_WEIGHTS_MB throws, and a
    // throwing constructor runs no destructor to free it.
    f32_budget_ = f32_weight_budget(opts.f32_weight_bytes, integrated != 0);
    int8_gemv_ = int8_gemv_from_env(&int8_shape_);  // may throw, so before the pool too
    fused_gemv_ = switch_from_env("CB_CUDA_FUSED_GEMV");
    split_attention_ = switch_from_env("CB_CUDA_ATTN_SPLIT");
    if (attention_tiles_from_env()) tiles_max_head_dim_ = prepare_attention_tiles();
    if (pools != 0) create_pool();
    profile_ = std::getenv("CB_CUDA_PROFILE") != nullptr;
    const char* bf16 = std::getenv("CB_CUDA_BF16");
    round_bf16_ = bf16 != nullptr && std::strcmp(bf16, "0") != 0;
    const char* graphs = std::getenv("CB_CUDA_GRAPHS");
    replay_ = graphs != nullptr ? std::strcmp(graphs, "0") != 0 : opts.replay_batches;
  }

  ~CudaBackend() override {
    // Errors cannot be reported from a destructor; the process is usually
    // exiting or the session is being torn down.
    cudaSetDevice(device_);
    recordings_.clear();
    std::vector<std::unique_ptr<ThreadCtx>> ctxs;
    {
      std::lock_guard<std::mutex> lock(table_->mu);
      ctxs.swap(ctxs_);
      table_->by_thread.clear();
      table_->idle.clear();
    }
    for (auto& c : ctxs) {
      if (!c->timed.empty() && cudaStreamSynchronize(c->stream) == cudaSuccess) fold_profile(*c);
      destroy_ctx(*c);
    }
    print_profile();
    for (void* p : weights_) cudaFree(p);
    for (const auto& [w, f] : f32_weights_) cudaFree(const_cast<float*>(f));
    if (pool_ != nullptr) cudaMemPoolDestroy(pool_);
  }

  const char* name() const override { return "cuda"; }
  // Larger chunks than the CPU's: big GEMMs keep the GPU busy, and each
  // call's weight dequantization is spread over more rows.  On an H200 (1.5B
  // Q4_K_M shapes) a 4096-token prefill took 348 ms in 2048-row chunks
  // against 404 in 512-row ones, for ~100 MiB more activations (in device
  // memory); docs/bench/cuda_runs.md has the sizes compared.
  int64_t default_batch_rows() const override { return 2048; }

  // ------------------------------------------------------------ memory --

  void* alloc_buffer(size_t bytes) override {
    const size_t n = bytes == 0 ? 1 : bytes;
    use_device();
    void* p = nullptr;
    cudaError_t e;
    const char* what = "device memory";
    if (memory_ == CudaMemory::kMapped) {
      what = "mapped host memory";
      // Mapped page-locked host memory: the host and the GPU use the same
      // pointer (unified addressing), and unlike managed memory the host may
      // write it while kernels run, which Jetson's managed memory forbids.
      e = cudaHostAlloc(&p, n, cudaHostAllocMapped | cudaHostAllocPortable);
      if (e == cudaSuccess) {
        void* d = nullptr;
        const cudaError_t e2 = cudaHostGetDevicePointer(&d, p, 0);
        if (e2 != cudaSuccess || d != p) {
          cudaGetLastError();
          cudaFreeHost(p);
          fail(ErrorCode::kUnsupported,
               "cuda backend: zero-copy buffers need unified addressing (the device pointer of "
               "mapped host memory differs from the host pointer)");
        }
      }
    } else if (memory_ == CudaMemory::kManaged) {
      what = "managed memory";
      // Managed memory is 256-byte aligned (> the interface's 64).
      e = cudaMallocManaged(&p, n, cudaMemAttachGlobal);
    } else {
      // cudaMalloc's blocks are 256-byte aligned too.
      e = cudaMalloc(&p, n);
    }
    // Any refusal is reported as out of memory, as the CPU backend does.
    if (e != cudaSuccess || p == nullptr) {
      cudaGetLastError();
      fail(ErrorCode::kOutOfMemory, "cuda backend: cannot allocate " + std::to_string(bytes) +
                                        " bytes of " + what + ": " + cudaGetErrorString(e));
    }
    std::lock_guard<std::mutex> lock(table_->mu);
    owned_[reinterpret_cast<uintptr_t>(p)] =
        Block{n, memory_ == CudaMemory::kMapped ? Kind::kMapped : Kind::kBuffer};
    return p;
  }

  void free_buffer(void* p) override {
    if (p == nullptr) return;
    Kind kind;
    {
      std::lock_guard<std::mutex> lock(table_->mu);
      auto it = owned_.find(reinterpret_cast<uintptr_t>(p));
      check(it != owned_.end() && it->second.kind != Kind::kWeight,
            "free_buffer: not a buffer from this backend's alloc_buffer()");
      kind = it->second.kind;
      owned_.erase(it);
    }
    // Outside the lock: freeing may wait for the device.
    use_device();
    // Inside a batch, ops the calling thread queued may still use the
    // memory (Backend::free_buffer): they complete first.
    ThreadCtx* c = nullptr;
    {
      std::lock_guard<std::mutex> lock(table_->mu);
      auto it = table_->by_thread.find(std::this_thread::get_id());
      if (it != table_->by_thread.end()) c = it->second;
    }
    // Nothing is thrown from here on (buffers are freed by destructors and
    // deleters): a fault of a queued kernel is sticky and surfaces at the
    // thread's next synchronisation, end_batch() inside a batch.
    // A stream being captured cannot wait: the capture fails instead, and
    // its ops are issued again.
    if (c != nullptr && c->replay == ReplayMode::kCapture)
      c->capturable = false;
    else if (c != nullptr && c->depth > 0 && cudaStreamSynchronize(c->stream) == cudaSuccess)
      after_sync(*c);
    if ((kind == Kind::kMapped ? cudaFreeHost(p) : cudaFree(p)) != cudaSuccess) cudaGetLastError();
  }

  WeightView prepare_weight(const WeightView& host) override {
    check(host.n_in >= 0 && host.n_out >= 0, "prepare_weight: negative size");
    check(host.n_in % dtype_block_elems(host.type) == 0,
          "prepare_weight: n_in is not a whole number of blocks");
    const size_t bytes = dtype_row_bytes(host.type, host.n_in) * static_cast<size_t>(host.n_out);
    WeightView dev = host;
    if (bytes == 0) {
      dev.data = nullptr;
      return dev;
    }
    ThreadCtx& c = this_thread_ctx();
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, bytes), "cudaMalloc (weight)");
    // Waited for on the thread's own stream: a plain cudaMemcpy from
    // pageable memory may return before its DMA lands, and kernels on other
    // (non-blocking) streams would not wait for it.
    cudaError_t e = cudaMemcpyAsync(p, host.data, bytes, cudaMemcpyDefault, c.stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c.stream);
    if (e != cudaSuccess) {
      cudaFree(p);
      cuda_check(e, "cudaMemcpy (weight upload)");
    }
    std::lock_guard<std::mutex> lock(table_->mu);
    weights_.push_back(p);
    owned_[reinterpret_cast<uintptr_t>(p)] = Block{bytes, Kind::kWeight};
    dev.data = p;
    return dev;
  }

  // --------------------------------------------------------------- ops --

  void matmul(const WeightView& w, const float* x, int64_t n_rows, float* y) override {
    run_product(w, x, n_rows, nullptr, y, false);
  }

  // The exact product, unless CB_CUDA_BF16 asks for the rounded one the
  // interface allows here: weights and activations rounded to bf16 (8-bit
  // significands, f32's range), products summed in f32.  Many rows run on
  // tensor cores (the exact f32 SGEMM reached ~18 TFLOP/s on a 1.5B model's
  // prefill on an H100); few rows take the GEMV with the same rounding, so
  // rows round alike on either path.  Not the default: on the real
  // SmolLM2 it misses the float64 reference's bar (1.15e-2 against 1e-2)
  // and the C API's identities (prefix reuse reproduces full prefill to
  // 1e-3) that the exact path meets (docs/bench/cuda_runs.md, "The real
  // SmolLM2 on a GPU").  With CB_CUDA_INT8, few rows of Q4_K and Q6_K
  // weights (decode's products on a Q4_K_M file) take int8 activations in
  // blocks of 32, as the CPU's matmul_q8 does (gemv_k_q8_kernel); not the
  // default until it has been measured against the f32 GEMV on a GPU.
  void matmul_q8(const WeightView& w, const float* x, int64_t n_rows, float* y) override {
    run_product(w, x, n_rows, nullptr, y, true);
  }

  // The GEMV adds the bias as it writes each output (one launch less per
  // biased projection: three a layer in decode on Qwen2).
  void matmul_bias(const WeightView& w, const float* x, int64_t n_rows, const float* bias, float* y,
                   bool q8) override {
    run_product(w, x, n_rows, bias, y, q8);
  }

  // With CB_CUDA_FUSED_GEMV, a product of few rows that the GEMV kernels
  // take is one launch: the kernel forms act(gate) * up as it loads its
  // input and adds its outputs to y, with the same expressions and
  // additions as the kernels it replaces (the same bits).  Anything else
  // runs Backend::product's ops.  Not the default until it has been
  // measured on a GPU.
  void product(const ProductArgs& a) override {
    if (!fused_gemv_ || !fused_gemv_applies(a)) return Backend::product(a);
    const WeightView& w = *a.w;
    const bool gated = a.gate != ProductArgs::Gate::kNone;
    const int n_rows = static_cast<int>(a.n_rows);
    Call c(*this, "product gemv");
    const float* dx = c.in(a.x, a.n_rows * w.n_in);
    const float* du = gated ? c.in(a.up, a.n_rows * w.n_in) : nullptr;
    const float* db = c.in(a.bias, w.n_out);
    float* dy = c.out(a.y, a.n_rows * w.n_out, a.accumulate);
    auto launch = [&](auto in) {
      if (a.q8 && int8_gemv_ &&
          launch_gemv_int8(w, in, n_rows, db, dy, a.accumulate, c.stream(), int8_shape_)) {
        c.name("product gemv int8");
        return true;
      }
      return launch_gemv_k_fused(w, in, n_rows, db, dy, a.accumulate, c.stream());
    };
    const bool gelu = a.gate == ProductArgs::Gate::kGeluTanh;
    if (!(gated ? launch(GemvInput<true>{dx, du, gelu}) : launch(GemvInput<false>{dx}))) {
      fail(ErrorCode::kInternal, "cuda backend: a fused product found no GEMV");
    }
    c.finish();
  }

  // With CB_CUDA_FUSED_GEMV, consecutive products of one input that
  // gemv_k_kernel would each take in the same launch shape (a layer's Q, K
  // and V projections in decode, its gate and up) are one launch
  // (gemv_k_merged_kernel), each output the bits of its own launch.  Others
  // go through product() one by one.
  void products(const ProductArgs* a, int64_t n) override {
    for (int64_t i = 0; i < n;) {
      int64_t m = 1;
      if (fused_gemv_ && mergeable(a[i])) {
        const GemvKShape sh = gemv_k_shape(static_cast<int>(a[i].n_rows), a[i].w->n_out);
        while (i + m < n && m < kGemvMaxParts && mergeable(a[i + m]) && a[i + m].x == a[i].x &&
               a[i + m].n_rows == a[i].n_rows && a[i + m].w->type == a[i].w->type &&
               a[i + m].w->n_in == a[i].w->n_in &&
               gemv_k_shape(static_cast<int>(a[i].n_rows), a[i + m].w->n_out) == sh) {
          ++m;
        }
      }
      if (m == 1) {
        product(a[i]);
      } else {
        merged_products(a + i, m);
      }
      i += m;
    }
  }

  void get_rows(const WeightView& w, const int32_t* ids, int64_t n, float* out) override {
    check(n >= 0, "get_rows: negative count");
    if (n == 0 || w.n_in == 0) return;
    Call c(*this);
    const int32_t* dids = c.in(ids, n);
    float* dout = c.out(out, n * w.n_in, false);
    dispatch_type<LaunchDequant>(w.type, w, dids, int64_t{0}, n, dout, c.stream());
    c.finish();
  }

  void rmsnorm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps,
               float* out) override {
    check(n_rows >= 0 && dim > 0, "rmsnorm: bad shape");
    check(n_rows <= INT32_MAX, "rmsnorm: too many rows");
    if (n_rows == 0) return;
    Call c(*this);
    const float* dx = c.in(x, n_rows * dim);
    const float* dw = c.in(weight, dim);
    float* dout = c.out(out, n_rows * dim, false);
    rmsnorm_kernel<<<static_cast<unsigned>(n_rows), kRowThreads, 0, c.stream()>>>(dx, dw, dim, eps,
                                                                                  dout);
    launch_check("rmsnorm_kernel");
    c.finish();
  }

  void rope(float* x, const int32_t* pos, int64_t n_rows, int64_t n_heads, int64_t head_dim,
            int64_t rot_dim, float freq_base, const float* freq_factors) override {
    check(n_rows >= 0 && n_heads > 0 && head_dim > 0, "rope: bad shape");
    check(rot_dim >= 0 && rot_dim <= head_dim && rot_dim % 2 == 0,
          "rope: rot_dim must be even and at most head_dim");
    if (n_rows == 0 || rot_dim == 0) return;
    // The kernel's table of rot_dim / 2 doubles fits the 48 KiB of shared
    // memory any launch may take.
    check(rot_dim <= 4096, "rope: rot_dim above 4096 is not supported");
    Call c(*this);
    float* dx = c.out(x, n_rows * n_heads * head_dim, true);
    const int32_t* dpos = c.in(pos, n_rows);
    const float* dfactors = freq_factors ? c.in(freq_factors, rot_dim / 2) : nullptr;
    const int64_t total = n_rows * (rot_dim / 2);
    const size_t table = static_cast<size_t>(rot_dim / 2) * sizeof(double);
    rope_kernel<<<grid_for(total), kEltThreads, table, c.stream()>>>(
        dx, dpos, n_rows, n_heads, head_dim, rot_dim, freq_base, dfactors);
    launch_check("rope_kernel");
    c.finish();
  }

  void attention(const AttentionArgs& a) override {
    check(a.n_q >= 0 && a.n_kv >= 0 && a.head_dim > 0, "attention: bad shape");
    check(a.n_head > 0 && a.n_head_kv > 0 && a.n_head % a.n_head_kv == 0,
          "attention: n_head must be a multiple of n_head_kv");
    if (a.head_dim > kMaxHeadDim) {
      fail(ErrorCode::kUnsupported, "cuda backend: attention head_dim above " +
                                        std::to_string(kMaxHeadDim) + " is not supported");
    }
    check(a.kv_type == DType::F32 || a.kv_type == DType::F16, "attention: K/V must be F32 or F16");
    if (a.n_q == 0) return;
    check(a.n_q * a.n_head <= INT32_MAX, "attention: too many query rows x heads");
    Call c(*this);
    AttentionArgs d = a;
    const int64_t q_elems = a.n_q * a.n_head * a.head_dim;
    d.q = c.in(a.q, q_elems);
    d.q_pos = c.in(a.q_pos, a.n_q);
    stage_kv(c, a, d);
    d.out = c.out(a.out, q_elems, false);
    if (a.n_q >= kAttnGemmMinRows && a.n_kv > 0 && launch_attention_tiles(c, d)) {
      c.finish();
      return;
    }
    if (a.n_q >= kAttnGemmMinRows && a.n_kv > 0) {
      c.name("attention gemm");
      c.uncapturable("its GEMMs take scratch memory");
      attention_gemm(c, d, a.q_pos);
      c.finish();
      return;
    }
    const size_t smem = static_cast<size_t>(kAttnWarps * (a.head_dim + 2)) * sizeof(float);
    const unsigned blocks = static_cast<unsigned>(a.n_q * a.n_head);
    // With CB_CUDA_ATTN_SPLIT, keys in splits of kAttnSplitKeys (one pass of
    // the block's warps each), merged by attention_merge_kernel.
    const bool split = split_attention_ && a.n_kv > kAttnSplitKeys &&
                       (a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256);
    const int64_t splits = split ? (a.n_kv + kAttnSplitKeys - 1) / kAttnSplitKeys : 1;
    check(splits <= 65535, "attention: too many keys to split");
    float* partial = nullptr;
    if (split) {
      c.name("attention split");
      partial = attention_partials(
          c, static_cast<size_t>(a.n_q * a.n_head * splits * (a.head_dim + 2)) * sizeof(float));
    }
    const dim3 grid(blocks, static_cast<unsigned>(splits));
    const int64_t split_keys = split ? kAttnSplitKeys : 0;
    if (a.kv_type == DType::F16) {
      attention_kernel<uint16_t><<<grid, 32 * kAttnWarps, smem, c.stream()>>>(
          d, a.n_head / a.n_head_kv, split_keys, partial);
    } else {
      attention_kernel<float><<<grid, 32 * kAttnWarps, smem, c.stream()>>>(
          d, a.n_head / a.n_head_kv, split_keys, partial);
    }
    launch_check("attention_kernel");
    if (split) {
      const unsigned rows = static_cast<unsigned>(a.n_q);
      if (a.head_dim == 64) {
        attention_merge_kernel<64><<<rows, kRowThreads, 0, c.stream()>>>(d, partial, split_keys);
      } else if (a.head_dim == 128) {
        attention_merge_kernel<128><<<rows, kRowThreads, 0, c.stream()>>>(d, partial, split_keys);
      } else {
        attention_merge_kernel<256><<<rows, kRowThreads, 0, c.stream()>>>(d, partial, split_keys);
      }
      launch_check("attention_merge_kernel");
    }
    c.finish();
  }

  void attention_contributions(const AttentionArgs& a, float* out) override {
    check(a.n_q >= 0 && a.n_kv >= 0 && a.head_dim > 0, "attention_contributions: bad shape");
    check(a.n_head > 0 && a.n_head_kv > 0 && a.n_head % a.n_head_kv == 0,
          "attention_contributions: n_head must be a multiple of n_head_kv");
    check(a.kv_type == DType::F32 || a.kv_type == DType::F16,
          "attention_contributions: K/V must be F32 or F16");
    if (a.n_q == 0 || a.n_kv == 0) return;
    check(a.n_q * a.n_head <= INT32_MAX, "attention_contributions: too many query rows x heads");
    Call c(*this);
    AttentionArgs d = a;
    d.q = c.in(a.q, a.n_q * a.n_head * a.head_dim);
    d.q_pos = c.in(a.q_pos, a.n_q);
    stage_kv(c, a, d);
    float* dout = c.out(out, a.n_kv, true);
    attention_gemm(c, d, a.q_pos, dout);
    c.finish();
  }

  void silu_mul(const float* gate, const float* up, int64_t n, float* out) override {
    check(n >= 0, "silu_mul: negative size");
    if (n == 0) return;
    Call c(*this);
    const float* dg = c.in(gate, n);
    const float* du = c.in(up, n);
    float* dout = c.out(out, n, false);
    silu_mul_kernel<<<grid_for(n), kEltThreads, 0, c.stream()>>>(dg, du, n, dout);
    launch_check("silu_mul_kernel");
    c.finish();
  }

  void gelu_mul(const float* gate, const float* up, int64_t n, float* out) override {
    check(n >= 0, "gelu_mul: negative size");
    if (n == 0) return;
    Call c(*this);
    const float* dg = c.in(gate, n);
    const float* du = c.in(up, n);
    float* dout = c.out(out, n, false);
    gelu_mul_kernel<<<grid_for(n), kEltThreads, 0, c.stream()>>>(dg, du, n, dout);
    launch_check("gelu_mul_kernel");
    c.finish();
  }

  void scale(float* x, int64_t n, float s) override {
    check(n >= 0, "scale: negative size");
    if (n == 0) return;
    Call c(*this);
    float* dx = c.out(x, n, true);
    scale_kernel<<<grid_for(n), kEltThreads, 0, c.stream()>>>(dx, n, s);
    launch_check("scale_kernel");
    c.finish();
  }

  void add(const float* a, const float* b, int64_t n, float* out) override {
    check(n >= 0, "add: negative size");
    if (n == 0) return;
    Call c(*this);
    const float* da = c.in(a, n);
    const float* db = c.in(b, n);
    float* dout = c.out(out, n, false);
    add_kernel<<<grid_for(n), kEltThreads, 0, c.stream()>>>(da, db, n, dout);
    launch_check("add_kernel");
    c.finish();
  }

  void add_bias(float* x, const float* bias, int64_t n_rows, int64_t dim) override {
    check(n_rows >= 0 && dim > 0, "add_bias: bad shape");
    if (n_rows == 0) return;
    Call c(*this);
    float* dx = c.out(x, n_rows * dim, true);
    const float* db = c.in(bias, dim);
    add_bias_kernel<<<grid_for(n_rows * dim), kEltThreads, 0, c.stream()>>>(dx, db, n_rows * dim,
                                                                            dim);
    launch_check("add_bias_kernel");
    c.finish();
  }

  void gather_rows(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                   float* dst) override {
    check(n >= 0 && row_len >= 0, "gather_rows: negative size");
    if (n == 0 || row_len == 0) return;
    Call c(*this);
    // A host source's extent is known only from the indices, so it is
    // staged up to the largest one; the runtime passes backend buffers.
    const int32_t* didx = c.in(idx, n);
    const float* dsrc = c.in_unknown_extent(src, row_len, idx, n);
    float* ddst = c.out(dst, n * row_len, false);
    gather_rows_kernel<<<grid_for(n * row_len), kEltThreads, 0, c.stream()>>>(dsrc, row_len, didx,
                                                                              n, ddst);
    launch_check("gather_rows_kernel");
    c.finish();
  }

  void segment_means(float* x, int64_t row_len, const int32_t* seg, int64_t n_seg,
                     float* out) override {
    check(row_len >= 0, "segment_means: negative size");
    check_segments(seg, n_seg);  // host memory by contract
    if (n_seg == 0 || row_len == 0) return;
    Call c(*this);
    const int32_t* dseg = c.in(seg, n_seg + 1);
    float* dx = c.out(x, seg[n_seg] * row_len, true);
    float* dout = c.out(out, n_seg * row_len, false);
    segment_means_kernel<<<grid_for(n_seg * row_len), kEltThreads, 0, c.stream()>>>(
        dx, row_len, dseg, n_seg, dout);
    launch_check("segment_means_kernel");
    c.finish();
  }

  void scatter_rows(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                    float* dst) override {
    check(n >= 0 && row_len >= 0, "scatter_rows: negative size");
    if (n == 0 || row_len == 0) return;
    Call c(*this);
    const int32_t* didx = c.in(idx, n);
    const float* dsrc = c.in(src, n * row_len);
    // dst's extent is not part of the call, so it cannot be staged: it must
    // be memory the device writes in place.
    float* ddst = c.out_in_place(dst);
    check(ddst != nullptr, "scatter_rows: dst must be backend memory");
    scatter_rows_kernel<<<grid_for(n * row_len), kEltThreads, 0, c.stream()>>>(dsrc, row_len, didx,
                                                                               n, ddst);
    launch_check("scatter_rows_kernel");
    c.finish();
  }

  void scatter_rows_f16(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                        uint16_t* dst) override {
    check(n >= 0 && row_len >= 0, "scatter_rows_f16: negative size");
    if (n == 0 || row_len == 0) return;
    Call c(*this);
    const int32_t* didx = c.in(idx, n);
    const float* dsrc = c.in(src, n * row_len);
    // As scatter_rows: dst's extent is not part of the call.
    uint16_t* ddst = c.out_in_place(dst);
    check(ddst != nullptr, "scatter_rows_f16: dst must be backend memory");
    scatter_rows_f16_kernel<<<grid_for(n * row_len), kEltThreads, 0, c.stream()>>>(dsrc, row_len,
                                                                                   didx, n, ddst);
    launch_check("scatter_rows_f16_kernel");
    c.finish();
  }

  void gather_rows_f16(const uint16_t* src, int64_t row_len, const int32_t* idx, int64_t n,
                       float* dst) override {
    check(n >= 0 && row_len >= 0, "gather_rows_f16: negative size");
    if (n == 0 || row_len == 0) return;
    Call c(*this);
    const int32_t* didx = c.in(idx, n);
    const uint16_t* dsrc = c.in_unknown_extent(src, row_len, idx, n);
    float* ddst = c.out(dst, n * row_len, false);
    gather_rows_f16_kernel<<<grid_for(n * row_len), kEltThreads, 0, c.stream()>>>(dsrc, row_len,
                                                                                  didx, n, ddst);
    launch_check("gather_rows_f16_kernel");
    c.finish();
  }

  void row_sq_diff(const float* a, const float* b, int64_t n_rows, int64_t row_len,
                   float* out) override {
    check(n_rows >= 0 && row_len >= 0, "row_sq_diff: negative size");
    check(n_rows <= INT32_MAX, "row_sq_diff: too many rows");
    if (n_rows == 0) return;
    Call c(*this);
    const float* da = c.in(a, n_rows * row_len);
    const float* db = c.in(b, n_rows * row_len);
    float* dout = c.out(out, n_rows, false);
    row_sq_diff_kernel<<<static_cast<unsigned>(n_rows), kRowThreads, 0, c.stream()>>>(
        da, db, row_len, dout);
    launch_check("row_sq_diff_kernel");
    c.finish();
  }

  // A stable radix sort of (key, index) by the keys of topk_keys_kernel
  // lists the indices best first with ties in index order; the first k of
  // them, sorted again, are the answer.  Only k indices cross to the host,
  // not the n deviations.
  void top_k(const float* values, int64_t n, int64_t k, int32_t* out) override {
    check(n >= 0 && k >= 0 && k <= n, "top_k: need 0 <= k <= n");
    check(n == 0 || values != nullptr, "top_k: values is null");
    check(k == 0 || out != nullptr, "top_k: out is null");
    check(n <= INT32_MAX, "top_k: more than 2^31 - 1 values");
    if (k == 0) return;
    Call c(*this);
    const float* dv = c.in(values, n);
    int32_t* dout = c.out(out, k, false);
    const int ni = static_cast<int>(n), ki = static_cast<int>(k);
    size_t sort_bytes = 0, final_bytes = 0;
    cuda_check(
        cub::DeviceRadixSort::SortPairs(
            nullptr, sort_bytes, static_cast<uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
            static_cast<int32_t*>(nullptr), static_cast<int32_t*>(nullptr), ni, 0, 32, c.stream()),
        "cub SortPairs (size)");
    cuda_check(
        cub::DeviceRadixSort::SortKeys(nullptr, final_bytes, static_cast<int32_t*>(nullptr),
                                       static_cast<int32_t*>(nullptr), ki, 0, 32, c.stream()),
        "cub SortKeys (size)");
    const size_t arr = (static_cast<size_t>(n) * 4 + 255) & ~size_t{255};
    char* t = static_cast<char*>(c.temp(4 * arr + std::max(sort_bytes, final_bytes)));
    uint32_t* keys_in = reinterpret_cast<uint32_t*>(t);
    uint32_t* keys_out = reinterpret_cast<uint32_t*>(t + arr);
    int32_t* idx_in = reinterpret_cast<int32_t*>(t + 2 * arr);
    int32_t* idx_out = reinterpret_cast<int32_t*>(t + 3 * arr);
    void* work = t + 4 * arr;
    topk_keys_kernel<<<grid_for(n), kEltThreads, 0, c.stream()>>>(dv, n, keys_in, idx_in);
    launch_check("topk_keys_kernel");
    cuda_check(cub::DeviceRadixSort::SortPairs(work, sort_bytes, keys_in, keys_out, idx_in, idx_out,
                                               ni, 0, 32, c.stream()),
               "cub SortPairs");
    cuda_check(
        cub::DeviceRadixSort::SortKeys(work, final_bytes, idx_out, dout, ki, 0, 32, c.stream()),
        "cub SortKeys");
    c.finish();
  }

  // ----------------------------------------------------------- batches --

  void begin_batch() override { ++this_thread_ctx().depth; }

  void end_batch() override {
    ThreadCtx& c = this_thread_ctx();
    check(c.depth > 0, "end_batch without a matching begin_batch on this thread");
    if (--c.depth > 0) return;
    const ReplayMode mode = c.replay;
    c.replay = ReplayMode::kOff;
    if (mode == ReplayMode::kProbe) {
      auto r = std::make_unique<Recording>();
      r->state = c.capturable ? Recording::State::kProbed : Recording::State::kIssued;
      r->output_bytes.swap(c.probed_outputs);
      std::lock_guard<std::mutex> lock(table_->mu);
      recordings_[c.replay_key] = std::move(r);
    } else if (mode == ReplayMode::kCapture) {
      end_capture(c);
    }
    const std::vector<HostCopy>* copies = c.host_copies;
    c.host_copies = nullptr;
    sync(c);
    if (copies != nullptr)
      for (const HostCopy& h : *copies) std::memcpy(h.host, h.pinned, h.bytes);
  }

  // Replayed batches as CUDA graphs (cuda_replay.cuh); with
  // CudaBackendOptions::replay_batches (or CB_CUDA_GRAPHS), and not while
  // CB_CUDA_PROFILE times every op.
  ReplayStart begin_replay(uint64_t key) override {
    ThreadCtx& c = this_thread_ctx();
    check(key != 0, "begin_replay: key 0 names no batch");
    check(c.depth == 0, "begin_replay inside a batch");
    if (!replay_.load() || profile_) {
      ++c.depth;
      return ReplayStart::kIssue;
    }
    std::unique_lock<std::mutex> lock(table_->mu);
    auto it = recordings_.find(key);
    Recording* r = it == recordings_.end() ? nullptr : it->second.get();
    if (r == nullptr) {
      lock.unlock();
      c.replay = ReplayMode::kProbe;
      c.replay_key = key;
      c.capturable = true;
      c.probed_outputs.clear();
      ++c.depth;
      return ReplayStart::kIssue;
    }
    if (r->state == Recording::State::kReplayable) {
      // The caller forgets a key only between its batches, so r stays.
      lock.unlock();
      cuda_check(cudaGraphLaunch(r->exec, c.stream), "cudaGraphLaunch");
      ++graph_launches_;
      c.host_copies = &r->host_copies;
      ++c.depth;
      return ReplayStart::kReplayed;
    }
    if (r->state == Recording::State::kIssued) {
      ++c.depth;
      return ReplayStart::kIssue;
    }
    // Probed: this batch is captured.  Memory for its host outputs first,
    // since nothing is allocated while capturing.
    std::vector<size_t> sizes = r->output_bytes;
    lock.unlock();
    auto rec = std::make_unique<Recording>();
    cudaError_t e = cudaSuccess;
    for (size_t bytes : sizes) {
      void* d = nullptr;
      void* h = nullptr;
      if (e == cudaSuccess) e = cudaMalloc(&d, bytes);
      if (d != nullptr) rec->device.push_back(d);
      if (e == cudaSuccess) e = cudaHostAlloc(&h, bytes, cudaHostAllocDefault);
      if (h != nullptr) rec->pinned.push_back(h);
    }
    rec->output_bytes = std::move(sizes);
    // Relaxed: the ops' own driver queries (pointer attributes of a host
    // output) stay allowed; nothing in a probed batch allocates or waits.
    if (e == cudaSuccess) e = cudaStreamBeginCapture(c.stream, cudaStreamCaptureModeRelaxed);
    if (e != cudaSuccess) {
      // No memory for the outputs, say: this key's batches run as usual.
      cudaGetLastError();
      auto issued = std::make_unique<Recording>();
      issued->state = Recording::State::kIssued;
      {
        std::lock_guard<std::mutex> relock(table_->mu);
        recordings_[key] = std::move(issued);
      }
      ++c.depth;
      return ReplayStart::kIssue;
    }
    c.capture = std::move(rec);
    c.captured_outputs = 0;
    c.capturable = true;
    c.replay = ReplayMode::kCapture;
    c.replay_key = key;
    ++c.depth;
    return ReplayStart::kRecord;
  }

  void forget_replay(uint64_t key) override {
    std::unique_ptr<Recording> r;
    {
      std::lock_guard<std::mutex> lock(table_->mu);
      auto it = recordings_.find(key);
      if (it == recordings_.end()) return;
      r = std::move(it->second);
      recordings_.erase(it);
    }
    use_device();
    r.reset();  // outside the lock: cudaFree waits for the device
  }

  // ----------------------------------------------------------- uploads --

  bool wants_staged_uploads() const override { return memory_ != CudaMemory::kMapped; }
  uint64_t resident_kv_bytes() const override { return resident_kv_bytes_; }

  void* alloc_host_staging(size_t bytes) override {
    use_device();
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable);
    if (e != cudaSuccess || p == nullptr) {
      cudaGetLastError();
      fail(ErrorCode::kOutOfMemory,
           "cuda backend: cannot allocate " + std::to_string(bytes) +
               " bytes of page-locked staging memory: " + cudaGetErrorString(e));
    }
    std::lock_guard<std::mutex> lock(table_->mu);
    staging_.insert(p);
    return p;
  }

  void free_host_staging(void* p) override {
    if (p == nullptr) return;
    {
      std::lock_guard<std::mutex> lock(table_->mu);
      check(staging_.erase(p) == 1,
            "free_host_staging: not memory from this backend's alloc_host_staging()");
    }
    use_device();
    cuda_check(cudaFreeHost(p), "cudaFreeHost");
  }

  void upload(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    check(dst != nullptr && src != nullptr, "upload: null pointer");
    ThreadCtx& c = this_thread_ctx();
    if (c.replay != ReplayMode::kOff) {
      c.capturable = false;  // a replay would copy what src held at the capture
      check(c.replay == ReplayMode::kProbe, "upload: inside a replayed batch being captured");
    }
    bool buffer = false;
    {
      std::lock_guard<std::mutex> lock(table_->mu);
      const auto [start, block] = owned_block(dst);
      check(block != nullptr && block->kind != Kind::kWeight,
            "upload: dst must lie in a buffer from alloc_buffer()");
      check(bytes <= block->bytes - (reinterpret_cast<uintptr_t>(dst) - start),
            "upload: dst + bytes runs past the end of its buffer");
      buffer = block->kind == Kind::kBuffer;
    }
    if (buffer && prefetch_) {
      // Pages of a managed buffer last touched by the host live in host
      // memory, and a copy into them would not be a DMA to the GPU; moving
      // them first keeps the timed copy a plain host-to-device transfer.
#if CUDART_VERSION >= 13000
      cudaMemLocation loc{};
      loc.type = cudaMemLocationTypeDevice;
      loc.id = device_;
      cuda_check(cudaMemPrefetchAsync(dst, bytes, loc, 0, c.stream), "cudaMemPrefetchAsync");
#else
      cuda_check(cudaMemPrefetchAsync(dst, bytes, device_, c.stream), "cudaMemPrefetchAsync");
#endif
    }
    ThreadCtx::Upload u{event(c), event(c)};
    const cudaError_t e1 = cudaEventRecord(u.start, c.stream);
    const cudaError_t e2 =
        e1 == cudaSuccess ? cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c.stream) : e1;
    const cudaError_t e3 = e2 == cudaSuccess ? cudaEventRecord(u.end, c.stream) : e2;
    if (e3 != cudaSuccess) {
      c.spare.push_back(u.start);
      c.spare.push_back(u.end);
      cuda_check(e3, "upload (cudaMemcpyAsync)");
    }
    c.uploads.push_back(u);
    // A caller that never asks for the time must not make the list grow
    // without bound: completed copies are summed and their events reused.
    if (c.uploads.size() >= 256) fold_uploads(c);
  }

  double wait_uploads() override {
    ThreadCtx& c = this_thread_ctx();
    if (!c.uploads.empty()) {
      cuda_check(cudaEventSynchronize(c.uploads.back().end), "upload");
    }
    fold_uploads(c);
    const double ms = c.upload_ms;
    c.upload_ms = 0.0;
    return ms;
  }

  // A GPU timestamp on the calling thread's stream (cuda_mark()).
  std::shared_ptr<CudaEvent> mark() {
    ThreadCtx& c = this_thread_ctx();
    auto e = std::make_shared<CudaEvent>();
    cuda_check(cudaEventCreate(&e->ev), "cudaEventCreate");
    cuda_check(cudaEventRecord(e->ev, c.stream), "cudaEventRecord");
    return e;
  }

  // Batches replayed from a CUDA graph so far (cuda_graph_launches()).
  int64_t graph_launches() const {
    return graph_launches_.load();
  }

  // Attention calls run by attention_tiles_kernel (cuda_attention_tiles_launches()).
  int64_t attention_tiles_launches() const {
    return attention_tiles_launches_.load();
  }

  // Bytes of the f32 weight copies kept so far (cuda_kept_f32_bytes()).
  int64_t kept_f32_bytes() {
    std::lock_guard<std::mutex> lock(f32_mu_);
    return f32_kept_;
  }

 private:
  // The K and V of an attention call on the device: staged when host memory
  // (tests), as elements of the call's kv_type.
  template <class C>
  static void stage_kv(C& c, const AttentionArgs& a, AttentionArgs& d) {
    const int64_t kv_elems = a.n_kv * a.n_head_kv * a.head_dim;
    if (a.kv_type == DType::F16) {
      d.k = c.in(static_cast<const uint16_t*>(a.k), kv_elems);
      d.v = c.in(static_cast<const uint16_t*>(a.v), kv_elems);
    } else {
      d.k = c.in(static_cast<const float*>(a.k), kv_elems);
      d.v = c.in(static_cast<const float*>(a.v), kv_elems);
    }
  }

  // y = x W^T (+ bias): the GEMV for few rows, the GEMM (f32 SGEMM, or bf16
  // on tensor cores when rounded) for more; the GEMM's bias is its own pass.
  // q8: matmul_q8's product (rounded with CB_CUDA_BF16, int8 activations in
  // the GEMV with CB_CUDA_INT8 where it applies).
  void run_product(const WeightView& w, const float* x, int64_t n_rows, const float* bias, float* y,
                   bool q8) {
    const bool rounded = q8 && round_bf16_;
    check(n_rows >= 0 && w.n_in >= 0 && w.n_out >= 0, "matmul: negative size");
    check(w.n_in % dtype_block_elems(w.type) == 0, "matmul: n_in is not a whole number of blocks");
    if (n_rows == 0 || w.n_out == 0) return;
    Call c(*this, rounded ? "matmul_q8 gemv bf16" : "matmul gemv");
    const float* dx = c.in(x, n_rows * w.n_in);
    const float* db = c.in(bias, w.n_out);
    float* dy = c.out(y, n_rows * w.n_out, false);
    if (w.n_in == 0) {
      cuda_check(
          cudaMemsetAsync(dy, 0, static_cast<size_t>(n_rows * w.n_out) * sizeof(float), c.stream()),
          "cudaMemsetAsync");
    } else if (n_rows <= gemv_max_rows_) {
      if (q8 && int8_gemv_ &&
          launch_gemv_int8(w, GemvInput<false>{dx}, static_cast<int>(n_rows), db, dy, false,
                           c.stream(), int8_shape_)) {
        c.name("matmul_q8 gemv int8");
      } else if (rounded) {
        dispatch_type<LaunchGemvBf16>(w.type, w, dx, static_cast<int>(n_rows), db, dy, c.stream());
      } else {
        dispatch_type<LaunchGemv>(w.type, w, dx, static_cast<int>(n_rows), db, dy, c.stream());
      }
      c.finish();
      return;
    } else if (rounded) {
      c.name("matmul_q8 gemm bf16");
      c.uncapturable("its GEMM takes scratch memory");
      gemm_bf16(c.ctx(), w, dx, n_rows, dy);
    } else {
      c.name("matmul gemm");
      c.uncapturable("its GEMM takes scratch memory");
      gemm(c.ctx(), w, dx, n_rows, dy);
    }
    if (db != nullptr) {
      add_bias_kernel<<<grid_for(n_rows * w.n_out), kEltThreads, 0, c.stream()>>>(
          dy, db, n_rows * w.n_out, w.n_out);
      launch_check("add_bias_kernel");
    }
    c.finish();
  }

  // Whether product() fuses `a` into one GEMV launch: few rows, no bf16
  // rounding, and a weight and input that the kernel run_product() would
  // pick takes with a gate and accumulation (the int8 GEMV's types when
  // CB_CUDA_INT8 applies to it, else Q4_K and Q6_K).  Pointers mirrored to
  // the device keep their 16-byte alignment (allocations are aligned more).
  bool fused_gemv_applies(const ProductArgs& a) const {
    const WeightView& w = *a.w;
    if (a.n_rows < 1 || a.n_rows > gemv_max_rows_ || w.n_in <= 0 || w.n_out <= 0) return false;
    if (w.n_in % dtype_block_elems(w.type) != 0 || (a.q8 && round_bf16_)) return false;
    if (a.gate != ProductArgs::Gate::kNone && a.up == nullptr) return false;
    if (a.accumulate && a.y == nullptr) return false;
    const bool aligned =
        reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.up) % 16 == 0;
    if (!aligned) return false;
    const bool q4k_aligned = reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
    const bool int8 = a.q8 && int8_gemv_ && gemv_q8_shared_bytes(w.n_in) <= kGemvQ8MaxShared &&
                      (w.type != DType::Q4_K || q4k_aligned) && has_int8_slice(w.type);
    return int8 || w.type == DType::Q6_K || (w.type == DType::Q4_K && q4k_aligned);
  }

  // Whether products() may put `a` in a merged launch: a plain product
  // (no gate, no accumulation) of few rows that run_product() would give
  // to gemv_k_kernel (not the int8 or the bf16 GEMV).
  bool mergeable(const ProductArgs& a) const {
    const WeightView& w = *a.w;
    return a.gate == ProductArgs::Gate::kNone && !a.accumulate && a.n_rows >= 1 &&
           a.n_rows <= gemv_max_rows_ && w.n_in > 0 && w.n_out > 0 && w.n_in % 256 == 0 &&
           !(a.q8 && (int8_gemv_ || round_bf16_)) && gemv_k_applies(w, GemvInput<false>{a.x});
  }

  // a[0, n) (mergeable, one input, type and launch shape) as one launch.
  void merged_products(const ProductArgs* a, int64_t n) {
    const WeightView& w0 = *a[0].w;
    const int n_rows = static_cast<int>(a[0].n_rows);
    Call c(*this, "products gemv");
    const float* dx = c.in(a[0].x, a[0].n_rows * w0.n_in);
    GemvParts parts;
    parts.n = static_cast<int>(n);
    for (int64_t i = 0; i < n; ++i) {
      const WeightView& w = *a[i].w;
      parts.w[i] = static_cast<const uint8_t*>(w.data);
      parts.n_out[i] = w.n_out;
      parts.bias[i] = c.in(a[i].bias, w.n_out);
      parts.y[i] = c.out(a[i].y, a[i].n_rows * w.n_out, false);
    }
    const GemvKShape sh = gemv_k_shape(n_rows, w0.n_out);
    if (w0.type == DType::Q4_K) {
      launch_gemv_k_merged<DType::Q4_K>(parts, w0.n_in, GemvInput<false>{dx}, n_rows, sh,
                                        c.stream());
    } else {
      launch_gemv_k_merged<DType::Q6_K>(parts, w0.n_in, GemvInput<false>{dx}, n_rows, sh,
                                        c.stream());
    }
    c.finish();
  }

  // kBuffer: alloc_buffer()'s device or managed memory (memory_ says which).
  enum class Kind { kBuffer, kMapped, kWeight };
  struct Block {
    size_t bytes;
    Kind kind;
  };

  // One op: makes host arguments usable on the device (mirrors, staging
  // through bounce memory, outputs copied back), and ends by waiting for the
  // thread's stream unless inside a batch.  Holds no lock: everything it
  // touches belongs to the calling thread's context.
  class Call {
   public:
    // `op` names the op in the CB_CUDA_PROFILE totals: the calling member
    // function unless given.
    explicit Call(CudaBackend& be, const char* op = __builtin_FUNCTION())
        : be_(be),
          ctx_(be.this_thread_ctx()),
          op_(op),
          capturing_(ctx_.replay == ReplayMode::kCapture),
          exceptions_(std::uncaught_exceptions()) {
      // Mirrors are freed on the stream, which a capture would record.
      if (!capturing_ &&
          (ctx_.mirror_bytes > kMirrorMaxTotal || ctx_.mirrors.size() > kMirrorMaxEntries)) {
        be_.drop_mirrors(ctx_);
      }
      if (be_.profile_) {
        start_ = be_.event(ctx_);
        cuda_check(cudaEventRecord(start_, ctx_.stream), "cudaEventRecord");
      }
    }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;
    // Frees are stream-ordered, so they also run after work this call
    // queued before an exception.
    ~Call() {
      // An op that failed while probed was not checked to its end; while
      // captured, it leaves a graph without its work.
      if ((capturing_ || ctx_.replay == ReplayMode::kProbe) &&
          std::uncaught_exceptions() > exceptions_)
        ctx_.capturable = false;
      release_temps();
      if (start_ != nullptr) ctx_.spare.push_back(start_);
    }

    // This op cannot be replayed from a graph (why: for the message): a
    // probe notes it, a capture fails.
    void uncapturable(const char* why) {
      if (ctx_.replay == ReplayMode::kProbe) ctx_.capturable = false;
      if (capturing_)
        fail(ErrorCode::kInternal, std::string("cuda backend: ") + op_ +
                                       " cannot be captured in a replayed batch: " + why);
    }

    cudaStream_t stream() const { return ctx_.stream; }
    void name(const char* op) { op_ = op; }
    ThreadCtx& ctx() { return ctx_; }
    bool capturing() const { return capturing_; }

    template <class T>
    const T* in(const T* p, int64_t n) {
      if (p == nullptr || n == 0 || be_.where(p) == Where::kBackend) return p;
      uncapturable("it reads host memory");
      const size_t bytes = static_cast<size_t>(n) * sizeof(T);
      if (bytes <= kMirrorMaxBytes) return static_cast<const T*>(mirror(p, bytes));
      void* d = temp(bytes);
      to_device(d, p, bytes);
      return static_cast<const T*>(d);
    }

    // An output of n elements; with copy_in it is also an input (in place).
    // Host memory makes the op complete before it returns, batch or not.
    template <class T>
    T* out(T* p, int64_t n, bool copy_in) {
      if (p == nullptr || n == 0) return p;
      if (T* d = out_in_place(p)) return d;
      const size_t bytes = static_cast<size_t>(n) * sizeof(T);
      if (copy_in) uncapturable("it reads host memory");
      if (ctx_.replay == ReplayMode::kProbe) ctx_.probed_outputs.push_back(bytes);
      if (capturing_) return static_cast<T*>(captured_output(p, bytes));
      void* d = alloc_temp(bytes);
      if (copy_in) to_device(d, p, bytes);
      backs_.push_back({p, d, nullptr, bytes});
      host_out_ = true;
      return static_cast<T*>(d);
    }

    // p itself when the device can write it (page-locked host memory makes
    // the op complete before returning), else null.
    template <class T>
    T* out_in_place(T* p) {
      const Where w = be_.where(p);
      // A graph writes page-locked memory at each replay, read after the wait.
      if (w == Where::kPinned && !capturing_) host_out_ = true;
      return w == Where::kHost ? nullptr : p;
    }

    // A gather source in host memory: its extent is 1 + the largest row
    // index, read from idx wherever it lives.
    template <class T>
    const T* in_unknown_extent(const T* src, int64_t row_len, const int32_t* idx, int64_t n) {
      if (be_.where(src) == Where::kBackend) return src;
      const int32_t* hidx = host_ints(idx, n);
      const int64_t rows = 1 + static_cast<int64_t>(*std::max_element(hidx, hidx + n));
      check(rows > 0, "gather_rows: negative row index");
      return in(src, rows * row_len);
    }

    // n ints readable on the host: p itself, or a copy of backend memory
    // (queued work may still write it: waits for the thread's stream; no
    // lock is held).  The copy lives until the thread's next bounce use.
    const int32_t* host_ints(const int32_t* p, int64_t n) {
      if (be_.where(p) != Where::kBackend) return p;
      uncapturable("it reads indices back to the host");
      void* b = ctx_.arena.get(static_cast<size_t>(n) * sizeof(int32_t));
      cuda_check(cudaMemcpyAsync(b, p, static_cast<size_t>(n) * sizeof(int32_t), cudaMemcpyDefault,
                                 ctx_.stream),
                 "cudaMemcpyAsync (indices)");
      cuda_check(cudaStreamSynchronize(ctx_.stream), "cudaStreamSynchronize");
      return static_cast<const int32_t*>(b);
    }

    // Device scratch for this op, freed (stream-ordered) when the op ends.
    void* temp(size_t bytes) {
      uncapturable("it takes temporary device memory");
      return alloc_temp(bytes);
    }

    // Copies staged outputs back and, outside a batch or for a host output,
    // waits for everything the thread queued.
    void finish() {
      for (const auto& [h, dev] : captured_) {
        cuda_check(cudaMemcpyAsync(const_cast<void*>(h.pinned), dev, h.bytes,
                                   cudaMemcpyDeviceToHost, ctx_.stream),
                   "cudaMemcpyAsync (replayed output)");
        ctx_.capture->host_copies.push_back(h);
      }
      for (Back& b : backs_) {
        b.bounce = ctx_.arena.get(b.bytes);
        cuda_check(cudaMemcpyAsync(b.bounce, b.dev, b.bytes, cudaMemcpyDeviceToHost, ctx_.stream),
                   "cudaMemcpyAsync (stage out)");
      }
      release_temps();
      if (start_ != nullptr) {
        cudaEvent_t end = be_.event(ctx_);
        cuda_check(cudaEventRecord(end, ctx_.stream), "cudaEventRecord");
        ctx_.timed.push_back({op_, start_, end});
        start_ = nullptr;
      }
      if (ctx_.depth > 0 && !host_out_) return;  // end_batch() waits
      cuda_check(cudaStreamSynchronize(ctx_.stream), "kernel execution");
      for (const Back& b : backs_) std::memcpy(b.host, b.bounce, b.bytes);
      be_.after_sync(ctx_);
    }

   private:
    struct Back {
      void* host;
      const void* dev;
      void* bounce;
      size_t bytes;
    };

    void* alloc_temp(size_t bytes) {
      void* d = be_.dev_alloc(ctx_, bytes, "staging");
      temps_.push_back(d);
      return d;
    }

    // A captured op's output bound for host memory `host`: the recording's
    // next device buffer, copied to its page-locked twin when the op ends
    // and from there to `host` after each wait.
    void* captured_output(void* host, size_t bytes) {
      Recording& r = *ctx_.capture;
      const size_t i = ctx_.captured_outputs++;
      if (i >= r.output_bytes.size() || r.output_bytes[i] != bytes)
        fail(ErrorCode::kInternal, std::string("cuda backend: ") + op_ +
                                       " in a replayed batch has host outputs unlike its first "
                                       "batch's");
      captured_.push_back({{host, r.pinned[i], bytes}, r.device[i]});
      return r.device[i];
    }

    // Host bytes -> device, through bounce memory (see PinnedArena).
    void to_device(void* d, const void* h, size_t bytes) {
      void* b = ctx_.arena.get(bytes);
      std::memcpy(b, h, bytes);
      cuda_check(cudaMemcpyAsync(d, b, bytes, cudaMemcpyHostToDevice, ctx_.stream),
                 "cudaMemcpyAsync (stage in)");
    }

    // The device mirror of host input [p, p + bytes), uploaded when its
    // content differs from what the mirror holds.  Rewriting a mirror that
    // queued kernels still read is safe: the copy is ordered after them on
    // the same stream.
    const void* mirror(const void* p, size_t bytes) {
      Mirror& m = ctx_.mirrors[p];
      if (m.host.size() == bytes && std::memcmp(m.host.data(), p, bytes) == 0) return m.dev;
      m.host.clear();  // stays empty (a miss) if the upload below fails
      if (m.cap < bytes) {
        // An earlier argument of this very op may use the old copy, and its
        // kernel is not queued yet: free it when the op ends.
        if (m.dev != nullptr) retired_.push_back(m.dev);
        ctx_.mirror_bytes -= m.cap;
        m.dev = nullptr;
        m.cap = 0;
        m.dev = be_.dev_alloc(ctx_, bytes, "mirror");
        m.cap = bytes;
        ctx_.mirror_bytes += bytes;
      }
      to_device(m.dev, p, bytes);
      m.host.assign(static_cast<const unsigned char*>(p),
                    static_cast<const unsigned char*>(p) + bytes);
      return m.dev;
    }

    void release_temps() {
      for (void* p : temps_) be_.dev_free(ctx_, p);
      for (void* p : retired_) be_.dev_free(ctx_, p);
      temps_.clear();
      retired_.clear();
    }

    CudaBackend& be_;
    ThreadCtx& ctx_;
    std::vector<void*> temps_;
    std::vector<void*> retired_;
    std::vector<Back> backs_;
    std::vector<std::pair<HostCopy, const void*>> captured_;  // and the device output
    bool host_out_ = false;
    const char* op_;
    const bool capturing_;
    const int exceptions_;
    cudaEvent_t start_ = nullptr;
  };

  // The device is per host thread in the CUDA runtime; a session may call
  // from any thread, so every entry point selects it.
  void use_device() const {
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
  }

  // The calling thread's context: found, or handed over from an exited
  // thread, or created (a stream per thread).
  ThreadCtx& this_thread_ctx() {
    use_device();
    const std::thread::id id = std::this_thread::get_id();
    ThreadCtx* c = nullptr;
    {
      std::lock_guard<std::mutex> lock(table_->mu);
      auto it = table_->by_thread.find(id);
      if (it != table_->by_thread.end()) return *it->second;
      if (!table_->idle.empty()) {
        c = table_->idle.back();
        table_->idle.pop_back();
        table_->by_thread[id] = c;
      }
    }
    if (c != nullptr) {
      // What the exited thread left queued stays ordered before the new
      // thread's work on the same stream; only its bookkeeping is reset.
      c->depth = 0;
      for (const auto& u : c->uploads) {
        c->spare.push_back(u.start);
        c->spare.push_back(u.end);
      }
      c->uploads.clear();
      c->upload_ms = 0.0;
    } else {
      auto fresh = std::make_unique<ThreadCtx>();
      cuda_check(cudaStreamCreateWithFlags(&fresh->stream, cudaStreamNonBlocking),
                 "cudaStreamCreate");
      c = fresh.get();
      std::lock_guard<std::mutex> lock(table_->mu);
      ctxs_.push_back(std::move(fresh));
      table_->by_thread[id] = c;
    }
    t_exit_hook.add(table_);
    return *c;
  }

  void destroy_ctx(ThreadCtx& c) {
    for (auto& [p, m] : c.mirrors) dev_free(c, m.dev);
    c.mirrors.clear();
    dev_free(c, c.scratch);
    for (void* p : c.attn_partials) dev_free(c, p);
    cudaStreamSynchronize(c.stream);
    for (void* p : c.deferred) cudaFree(p);
    c.deferred.clear();
    c.arena.release();
    for (const auto& u : c.uploads) {
      cudaEventDestroy(u.start);
      cudaEventDestroy(u.end);
    }
    for (const auto& t : c.timed) {
      cudaEventDestroy(t.start);
      cudaEventDestroy(t.end);
    }
    for (cudaEvent_t e : c.spare) cudaEventDestroy(e);
    if (c.blas != nullptr) cublasDestroy(c.blas);
    cudaStreamDestroy(c.stream);
    cudaGetLastError();
  }

  // The block of owned_ holding p (its start and record), or {0, null}.
  // Caller holds the lock.
  std::pair<uintptr_t, const Block*> owned_block(const void* p) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = owned_.upper_bound(a);
    if (it == owned_.begin()) return {0, nullptr};
    --it;
    if (a - it->first >= it->second.bytes) return {0, nullptr};
    return {it->first, &it->second};
  }

  // Blocks this backend allocated are found without a driver call; other
  // pointers ask the driver once per argument.
  Where where(const void* p) const {
    {
      std::lock_guard<std::mutex> lock(table_->mu);
      if (owned_block(p).second != nullptr) return Where::kBackend;
    }
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
      cudaGetLastError();
      return Where::kHost;
    }
    switch (attr.type) {
      case cudaMemoryTypeDevice:
      case cudaMemoryTypeManaged:
        return Where::kBackend;
      case cudaMemoryTypeHost:
        return attr.devicePointer == p ? Where::kPinned : Where::kHost;
      default:
        return Where::kHost;
    }
  }

  // A pool of our own instead of the device's default one: a release
  // threshold keeps staging memory between synchronisations (the default
  // pool gives it back to the driver at every one), and no reuse across
  // streams by inserted dependencies, which would make the compute stream
  // wait for the loader's.
  void create_pool() {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device_;
    if (cudaMemPoolCreate(&pool_, &props) != cudaSuccess) {
      cudaGetLastError();
      pool_ = nullptr;  // plain cudaMalloc / deferred cudaFree
      return;
    }
    uint64_t keep = uint64_t{256} << 20;
    int no = 0;
    cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep);
    cudaMemPoolSetAttribute(pool_, cudaMemPoolReuseAllowInternalDependencies, &no);
    cudaGetLastError();
  }

  // Device memory used only on c.stream: stream-ordered from the pool where
  // the device has memory pools, else cudaMalloc.
  void* dev_alloc(ThreadCtx& c, size_t bytes, const char* what) {
    void* d = nullptr;
    const cudaError_t e = pool_ != nullptr
                              ? cudaMallocFromPoolAsync(&d, bytes == 0 ? 1 : bytes, pool_, c.stream)
                              : cudaMalloc(&d, bytes == 0 ? 1 : bytes);
    cuda_check(e, what);
    return d;
  }

  // Runs after the work already queued on c.stream, so kernels still reading
  // p are safe; without pools the free waits for the thread's next
  // synchronisation.
  void dev_free(ThreadCtx& c, void* p) {
    if (p == nullptr) return;
    if (pool_ != nullptr) {
      if (cudaFreeAsync(p, c.stream) != cudaSuccess) cudaGetLastError();
    } else {
      c.deferred.push_back(p);
    }
  }

  void drop_mirrors(ThreadCtx& c) {
    for (auto& [p, m] : c.mirrors) dev_free(c, m.dev);
    c.mirrors.clear();
    c.mirror_bytes = 0;
  }

  // After c.stream has drained: what waited for it can be reused or freed.
  void after_sync(ThreadCtx& c) {
    if (!c.timed.empty()) fold_profile(c);
    for (void* p : c.deferred) cudaFree(p);
    c.deferred.clear();
    c.arena.reset();
  }

  // Ends the capture of c's batch: its graph is instantiated, kept under
  // the batch's key and launched (the captured ops have not run yet).  A
  // capture that failed (an op threw, or the driver refused a call in it)
  // throws, so that the caller issues the ops again, and turns replays off
  // for this backend: a failure that is not the op's own would come back
  // at every key.
  void end_capture(ThreadCtx& c) {
    std::unique_ptr<Recording> rec = std::move(c.capture);
    cudaGraph_t graph = nullptr;
    cudaError_t e = cudaStreamEndCapture(c.stream, &graph);
    // An op failed, or fewer host outputs than the probe had.
    if (e == cudaSuccess && (!c.capturable || c.captured_outputs != rec->output_bytes.size()))
      e = cudaErrorInvalidValue;
    if (e == cudaSuccess) e = cudaGraphInstantiateWithFlags(&rec->exec, graph, 0);
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (e == cudaSuccess) e = cudaGraphLaunch(rec->exec, c.stream);
    if (e == cudaSuccess) ++graph_launches_;
    if (e != cudaSuccess) {
      cudaGetLastError();
      replay_ = false;  // begin_replay() looks at no recording from now on
      fail(ErrorCode::kUnsupported,
           std::string("cuda backend: a replayed batch could not be captured (") +
               cudaGetErrorString(e) +
               "); its ops did not run, and this backend runs batches without graphs "
               "from now on");
    }
    rec->state = Recording::State::kReplayable;
    std::lock_guard<std::mutex> lock(table_->mu);
    Recording* r = rec.get();
    recordings_[c.replay_key] = std::move(rec);
    c.host_copies = &r->host_copies;
  }

  // Waits for everything the thread queued.  Execution errors of any queued
  // kernel surface here.
  void sync(ThreadCtx& c) {
    cuda_check(cudaStreamSynchronize(c.stream), "kernel execution");
    after_sync(c);
  }

  // CB_CUDA_PROFILE: adds the thread's timed ops, all complete after a
  // synchronisation, to the per-op totals and recycles their events.  An
  // op's time runs from the stream reaching its start to its last work, so
  // it includes the GPU waiting for the host to queue that work.
  void fold_profile(ThreadCtx& c) {
    std::vector<std::pair<const char*, float>> times;
    times.reserve(c.timed.size());
    for (const ThreadCtx::TimedOp& t : c.timed) {
      float ms = 0.0f;
      if (cudaEventElapsedTime(&ms, t.start, t.end) != cudaSuccess) {
        cudaGetLastError();
        ms = 0.0f;
      }
      times.emplace_back(t.op, ms);
      c.spare.push_back(t.start);
      c.spare.push_back(t.end);
    }
    c.timed.clear();
    std::lock_guard<std::mutex> lock(table_->mu);
    for (const auto& [op, ms] : times) {
      ProfileTotal& total = profile_totals_[op];
      ++total.calls;
      total.ms += ms;
    }
  }

  void print_profile() const {
    if (!profile_ || profile_totals_.empty()) return;
    std::vector<std::pair<std::string, ProfileTotal>> rows(profile_totals_.begin(),
                                                           profile_totals_.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    double all = 0.0;
    for (const auto& r : rows) all += r.second.ms;
    std::fprintf(stderr, "cuda profile (CB_CUDA_PROFILE): GPU time per op, %.1f ms in all\n", all);
    std::fprintf(stderr, "  %-26s %9s %11s %6s %10s\n", "op", "calls", "total ms", "share",
                 "mean us");
    for (const auto& [op, t] : rows) {
      std::fprintf(stderr, "  %-26s %9lld %11.2f %5.1f%% %10.2f\n", op.c_str(), t.calls, t.ms,
                   all > 0 ? 100.0 * t.ms / all : 0.0,
                   1000.0 * t.ms / static_cast<double>(t.calls));
    }
  }

  cudaEvent_t event(ThreadCtx& c) {
    if (!c.spare.empty()) {
      cudaEvent_t e = c.spare.back();
      c.spare.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    cuda_check(cudaEventCreate(&e), "cudaEventCreate");
    return e;
  }

  // Adds the times of the completed uploads, oldest first, to c.upload_ms
  // and recycles their events.  Copies complete in stream order, so the
  // first unfinished one ends the scan.
  void fold_uploads(ThreadCtx& c) {
    size_t done = 0;
    for (; done < c.uploads.size(); ++done) {
      const ThreadCtx::Upload& u = c.uploads[done];
      const cudaError_t q = cudaEventQuery(u.end);
      if (q == cudaErrorNotReady) {
        cudaGetLastError();
        break;
      }
      float ms = 0.0f;
      const cudaError_t e = q == cudaSuccess ? cudaEventElapsedTime(&ms, u.start, u.end) : q;
      if (e != cudaSuccess) {
        // The copies summed so far leave the list before the error does,
        // so their events, now spare, are not reused or destroyed twice.
        c.uploads.erase(c.uploads.begin(), c.uploads.begin() + static_cast<std::ptrdiff_t>(done));
        cuda_check(e, "upload");
      }
      c.upload_ms += ms;
      c.spare.push_back(u.start);
      c.spare.push_back(u.end);
    }
    c.uploads.erase(c.uploads.begin(), c.uploads.begin() + static_cast<std::ptrdiff_t>(done));
  }

  cublasHandle_t blas(ThreadCtx& c) {
    if (c.blas == nullptr) {
      cublasHandle_t h = nullptr;
      if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        fail(ErrorCode::kInternal, "cuda backend: cublasCreate failed");
      }
      c.blas = h;
      cublas_check(cublasSetStream(h, c.stream), "cublasSetStream");
      // Plain f32 arithmetic (no TF32 tensor cores): see the numerics note
      // at the top of this file.
      cublas_check(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    }
    return c.blas;
  }

  // y = x W^T for many rows: W slice by slice to f32, then SGEMM.  In
  // column-major terms (cuBLAS), y^T[o][r] = sum_i W[o][i] x[r][i] is
  // C(n_out x n_rows, ld n_out) = A^T B with A = the weight slice seen as
  // an n_in x rows column-major matrix and B = x as n_in x n_rows.
  void gemm(ThreadCtx& c, const WeightView& w, const float* x, int64_t n_rows, float* y) {
    check(w.n_in <= INT32_MAX && w.n_out <= INT32_MAX && n_rows <= INT32_MAX,
          "matmul: dimension too large for cuBLAS");
    const float one = 1.0f, zero = 0.0f;
    cublasHandle_t h = blas(c);
    if (w.type == DType::F32) {
      cublas_check(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.n_out),
                               static_cast<int>(n_rows), static_cast<int>(w.n_in), &one,
                               static_cast<const float*>(w.data), static_cast<int>(w.n_in), x,
                               static_cast<int>(w.n_in), &zero, y, static_cast<int>(w.n_out)),
                   "cublasSgemm");
      return;
    }
    const int64_t row_floats = w.n_in;
    const int64_t slice = std::clamp<int64_t>(
        static_cast<int64_t>(kGemmScratchBytes / sizeof(float)) / row_floats, 1, w.n_out);
    // The kept f32 copy, else a slice at a time in the scratch; the same
    // slices either way, so the same SGEMMs and the same bits.
    const float* kept = f32_weight(c, w, slice);
    float* scratch = kept != nullptr
                         ? nullptr
                         : static_cast<float*>(gemm_scratch(
                               c, static_cast<size_t>(slice * row_floats) * sizeof(float)));
    for (int64_t o0 = 0; o0 < w.n_out; o0 += slice) {
      const int64_t rows = std::min(slice, w.n_out - o0);
      const float* wf = kept != nullptr ? kept + o0 * row_floats : scratch;
      // Same stream: the next slice's dequantization waits for this SGEMM.
      if (kept == nullptr) {
        dispatch_type<LaunchDequant>(w.type, w, static_cast<const int32_t*>(nullptr), o0, rows,
                                     scratch, c.stream);
      }
      cublas_check(
          cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(n_rows),
                      static_cast<int>(w.n_in), &one, wf, static_cast<int>(w.n_in), x,
                      static_cast<int>(w.n_in), &zero, y + o0, static_cast<int>(w.n_out)),
          "cublasSgemm");
    }
  }

  // What alloc_buffer() returns: `asked`, or for kAuto CB_CUDA_MEMORY when
  // set, else mapped memory on an integrated GPU and device memory on a
  // discrete one.
  static CudaMemory memory_kind(CudaMemory asked, bool integrated) {
    if (asked != CudaMemory::kAuto) return asked;
    if (const char* m = std::getenv("CB_CUDA_MEMORY")) {
      const std::string v = m;
      if (v == "device") return CudaMemory::kDevice;
      if (v == "mapped") return CudaMemory::kMapped;
      if (v == "managed") return CudaMemory::kManaged;
      fail(ErrorCode::kInvalidArgument,
           "CB_CUDA_MEMORY must be device, mapped or managed (got '" + v + "')");
    }
    return integrated ? CudaMemory::kMapped : CudaMemory::kDevice;
  }

  // CB_CUDA_ATTN: unset or "gemm": attention of many query rows through
  // cuBLAS; "tiles": attention_tiles_kernel (cuda_attention_tiles.cuh).
  static bool attention_tiles_from_env() {
    const char* e = std::getenv("CB_CUDA_ATTN");
    if (e == nullptr || std::strcmp(e, "gemm") == 0) return false;
    if (std::strcmp(e, "tiles") == 0) return true;
    fail(ErrorCode::kInvalidArgument,
         std::string("CB_CUDA_ATTN must be gemm or tiles (got '") + e + "')");
  }

  // Lets attention_tiles_kernel take the shared memory it needs for each
  // head size the device can hold (~89 KB a block at 128 dims, ~154 KB at
  // 256: above the 48 KB a launch gets by default); returns the largest.
  int64_t prepare_attention_tiles() {
    int optin = 0;
    cuda_check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_),
               "cudaDeviceGetAttribute");
    int64_t largest = 0;
    auto allow = [&](auto hd) {
      constexpr int kHd = decltype(hd)::value;
      constexpr size_t bytes = TileLayout<kHd>::kBytes;
      if (bytes > static_cast<size_t>(optin)) return;
      const int b = static_cast<int>(bytes);
      cuda_check(cudaFuncSetAttribute(attention_tiles_kernel<float, kHd>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, b),
                 "cudaFuncSetAttribute");
      cuda_check(cudaFuncSetAttribute(attention_tiles_kernel<uint16_t, kHd>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, b),
                 "cudaFuncSetAttribute");
      largest = kHd;
    };
    allow(std::integral_constant<int, 64>{});
    allow(std::integral_constant<int, 128>{});
    allow(std::integral_constant<int, 256>{});
    return largest;
  }

  // attention() of many rows by attention_tiles_kernel and its merge
  // (device arguments), where CB_CUDA_ATTN asks for it and the kernel has
  // the shape: head sizes 64, 128 and 256, at most 64 query heads a KV head.
  // Rows go in passes of at most kAttnScoreBytes of partial results.
  // False: nothing launched.
  template <class C>
  bool launch_attention_tiles(C& c, const AttentionArgs& d) {
    const int64_t group = d.n_head / d.n_head_kv, hd = d.head_dim;
    auto aligned = [](const void* p, uintptr_t to) {
      return reinterpret_cast<uintptr_t>(p) % to == 0;
    };
    const uintptr_t kv_align = d.kv_type == DType::F16 ? 8 : 16;  // its vector loads
    if (hd > tiles_max_head_dim_ || (hd != 64 && hd != 128 && hd != 256) || group > kTileRows ||
        d.n_kv > INT32_MAX || d.n_head_kv > 65535 || !aligned(d.q, 16) || !aligned(d.k, kv_align) ||
        !aligned(d.v, kv_align)) {
      return false;
    }
    const int64_t per_tile = kTileRows / group;
    const int64_t splits = (d.n_kv + kTileSplitKeys - 1) / kTileSplitKeys;
    const int64_t row_bytes = splits * d.n_head * (hd + 2) * static_cast<int64_t>(sizeof(float));
    const int64_t pass_rows = std::clamp<int64_t>(kAttnScoreBytes / row_bytes, per_tile, d.n_q);
    if (splits > 65535 || (pass_rows + per_tile - 1) / per_tile > INT32_MAX) return false;
    c.name("attention tiles");
    c.uncapturable("its partial results take scratch memory");
    auto* partial = static_cast<float*>(c.temp(static_cast<size_t>(pass_rows * row_bytes)));
    for (int64_t r0 = 0; r0 < d.n_q; r0 += pass_rows) {
      AttentionArgs p = d;
      p.n_q = std::min(pass_rows, d.n_q - r0);
      p.q += r0 * d.n_head * hd;
      p.q_pos += r0;
      p.out += r0 * d.n_head * hd;
      const dim3 grid(static_cast<unsigned>((p.n_q + per_tile - 1) / per_tile),
                      static_cast<unsigned>(d.n_head_kv), static_cast<unsigned>(splits));
      auto launch = [&](auto head_dim) {
        constexpr int kHd = decltype(head_dim)::value;
        constexpr size_t bytes = TileLayout<kHd>::kBytes;
        if (d.kv_type == DType::F16) {
          attention_tiles_kernel<uint16_t, kHd>
              <<<grid, kTileThreads, bytes, c.stream()>>>(p, group, kTileSplitKeys, partial);
        } else {
          attention_tiles_kernel<float, kHd>
              <<<grid, kTileThreads, bytes, c.stream()>>>(p, group, kTileSplitKeys, partial);
        }
        launch_check("attention_tiles_kernel");
        attention_merge_kernel<kHd><<<static_cast<unsigned>(p.n_q), kRowThreads, 0, c.stream()>>>(
            p, partial, kTileSplitKeys);
        launch_check("attention_merge_kernel");
      };
      if (hd == 64) {
        launch(std::integral_constant<int, 64>{});
      } else if (hd == 128) {
        launch(std::integral_constant<int, 128>{});
      } else {
        launch(std::integral_constant<int, 256>{});
      }
    }
    ++attention_tiles_launches_;
    return true;
  }

  // An on/off switch: unset or "0" off, "1" on, anything else refused.
  static bool switch_from_env(const char* name) {
    const char* e = std::getenv(name);
    if (e == nullptr || std::strcmp(e, "0") == 0) return false;
    if (std::strcmp(e, "1") == 0) return true;
    fail(ErrorCode::kInvalidArgument, std::string(name) + " must be 0 or 1 (got '" + e + "')");
  }

  // CB_CUDA_INT8: unset or "0" off; "1" on; "RxS" on with R weight rows a
  // warp and S warps a row (each 1, 2 or 4: a launch shape to measure).
  static bool int8_gemv_from_env(Int8GemvShape* shape) {
    const char* e = std::getenv("CB_CUDA_INT8");
    if (e == nullptr || std::strcmp(e, "0") == 0) return false;
    if (std::strcmp(e, "1") == 0) return true;
    auto ok = [](char c) { return c == '1' || c == '2' || c == '4'; };
    if (std::strlen(e) != 3 || !ok(e[0]) || e[1] != 'x' || !ok(e[2])) {
      fail(
          ErrorCode::kInvalidArgument,
          std::string("CB_CUDA_INT8 must be 0, 1 or a launch shape such as 2x1 (got '") + e + "')");
    }
    shape->rows_per_warp = e[0] - '0';
    shape->warps_per_row = e[2] - '0';
    return true;
  }

  // CudaBackendOptions::f32_weight_bytes in bytes.
  static int64_t f32_weight_budget(int64_t asked, bool integrated) {
    if (const char* mb = std::getenv("CB_CUDA_F32_WEIGHTS_MB")) {
      char* end = nullptr;
      const long long v = std::strtoll(mb, &end, 10);
      if (end == mb || *end != '\0' || v < 0 || v > (int64_t{1} << 40)) {
        fail(ErrorCode::kInvalidArgument,
             std::string("CB_CUDA_F32_WEIGHTS_MB must be a number of MiB (got '") + mb + "')");
      }
      return static_cast<int64_t>(v) << 20;
    }
    if (asked >= 0) return asked;
    if (integrated) return 0;
    // Half of what is free now, so that the copies, which are never given
    // back, leave room for the KV cache, the scores and the pool's scratch
    // on a card other processes share; at most a quarter of the card.
    size_t free_bytes = 0, total = 0;
    cuda_check(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
    return static_cast<int64_t>(std::min(total / 4, free_bytes / 2));
  }

  // The kept f32 copy of quantized weight w, made now (dequantized in the
  // SGEMM's slices of `slice` rows, then waited for, so that every stream
  // may read it) if the budget holds it; null when it does not.  Weights
  // live as long as the backend, so their device address names them.
  const float* f32_weight(ThreadCtx& c, const WeightView& w, int64_t slice) {
    std::lock_guard<std::mutex> lock(f32_mu_);
    const auto it = f32_weights_.find(w.data);
    if (it != f32_weights_.end()) return it->second;
    const int64_t bytes = w.n_in * w.n_out * static_cast<int64_t>(sizeof(float));
    if (bytes > f32_budget_) return nullptr;
    // The budget was set before the model's weights came to the device:
    // each copy also leaves at least as much free as it takes, for the KV
    // cache, activations and the pool's scratch.
    size_t free_bytes = 0, total = 0;
    void* p = nullptr;
    if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess ||
        static_cast<uint64_t>(bytes) > free_bytes / 2 ||
        cudaMalloc(&p, static_cast<size_t>(bytes)) != cudaSuccess) {
      cudaGetLastError();
      f32_budget_ = 0;  // the device is full: stop asking
      return nullptr;
    }
    struct Free {
      void operator()(float* f) const { cudaFree(f); }
    };
    std::unique_ptr<float, Free> f(static_cast<float*>(p));  // until it is kept
    for (int64_t o0 = 0; o0 < w.n_out; o0 += slice) {
      dispatch_type<LaunchDequant>(w.type, w, static_cast<const int32_t*>(nullptr), o0,
                                   std::min(slice, w.n_out - o0), f.get() + o0 * w.n_in, c.stream);
    }
    cuda_check(cudaStreamSynchronize(c.stream), "cudaStreamSynchronize (kept f32 weight)");
    f32_budget_ -= bytes;
    f32_kept_ += bytes;
    return f32_weights_.emplace(w.data, f.release()).first->second;
  }

  // attention() for many query rows, and attention_contributions(): per
  // block of rows (at most kAttnScoreBytes of scores) and per head, the
  // scores by cuBLAS SGEMM (f32, K and V widened from an f16 cache first),
  // softmax over each row's visible keys, and the weighted sum of V by a
  // second SGEMM.  A block's products stop at the last key one of its rows
  // sees (`positions`, the caller's q_pos, read on the host); keys masked
  // before that get weight 0, so a block of consecutive rows does up to
  // twice a causal kernel's arithmetic, but at cuBLAS's rate: the
  // one-block-per-(row, head) kernel ran a 4k-token prefill's attention at
  // ~4 TFLOP/s on an H100.  (Blocks of 128 rows, which skip more masked
  // keys, ran a 4k-token prefill 11 % slower on an H200: smaller GEMMs.)
  // The query heads of one KV head form one strided batch (K or V shared:
  // stride 0), so a block is 2 n_head_kv + 1 launches, not 2 n_head + 1.
  // The other arguments are device pointers (staged by the Call).  With
  // `contributions` (attention_contributions), each block's weights are
  // summed per key into it instead of applied to V.
  template <class C>
  void attention_gemm(C& c, const AttentionArgs& d, const int32_t* positions,
                      float* contributions = nullptr) {
    check(d.n_kv <= INT32_MAX && d.head_dim * d.n_head <= INT32_MAX,
          "attention: dimension too large for cuBLAS");
    const int64_t hd = d.head_dim, group = d.n_head / d.n_head_kv;
    const int64_t row_bytes = d.n_head * d.n_kv * static_cast<int64_t>(sizeof(float));
    const int64_t block_rows = std::clamp<int64_t>(kAttnScoreBytes / row_bytes, 1, d.n_q);
    // Each block's key count: 1 + its rows' last visible key (at least 1,
    // where every row sees none: their weights are all 0).
    std::vector<int64_t> block_keys;
    {
      const int32_t* pos = c.host_ints(positions, d.n_q);
      for (int64_t r0 = 0; r0 < d.n_q; r0 += block_rows) {
        const int64_t end = std::min(d.n_q, r0 + block_rows);
        const int64_t last = *std::max_element(pos + r0, pos + end);
        block_keys.push_back(std::clamp<int64_t>(last + 1, 1, d.n_kv));
      }
    }
    const int64_t keys = *std::max_element(block_keys.begin(), block_keys.end());
    const float* k = static_cast<const float*>(d.k);
    const float* v = static_cast<const float*>(d.v);
    if (d.kv_type == DType::F16) {
      const int64_t kv_elems = keys * d.n_head_kv * hd;
      auto* kv = static_cast<float*>(c.temp(static_cast<size_t>(2 * kv_elems) * sizeof(float)));
      widen_f16_kernel<<<grid_for(kv_elems), kEltThreads, 0, c.stream()>>>(
          static_cast<const uint16_t*>(d.k), kv_elems, kv);
      widen_f16_kernel<<<grid_for(kv_elems), kEltThreads, 0, c.stream()>>>(
          static_cast<const uint16_t*>(d.v), kv_elems, kv + kv_elems);
      launch_check("widen_f16_kernel");
      k = kv;
      v = kv + kv_elems;
    }
    auto* scores = static_cast<float*>(
        c.temp(static_cast<size_t>(block_rows * d.n_head * keys) * sizeof(float)));
    cublasHandle_t h = blas(c.ctx());
    const float zero = 0.0f, one = 1.0f;
    const int dim = static_cast<int>(hd), n_group = static_cast<int>(group);
    const int q_ld = static_cast<int>(d.n_head * hd), kv_ld = static_cast<int>(d.n_head_kv * hd);
    for (int64_t r0 = 0, b = 0; r0 < d.n_q; r0 += block_rows, ++b) {
      const int64_t rows = std::min(block_rows, d.n_q - r0);
      AttentionArgs blk = d;
      blk.n_kv = block_keys[static_cast<size_t>(b)];
      const int n_kv = static_cast<int>(blk.n_kv);
      const long long head_scores = static_cast<long long>(rows * blk.n_kv);
      for (int64_t g = 0; g < d.n_head_kv; ++g) {
        // Column-major, per query head h of group g:
        // scores_h^T (n_kv x rows) = K_g (n_kv x hd) Q_h^T.
        cublas_check(cublasSgemmStridedBatched(
                         h, CUBLAS_OP_T, CUBLAS_OP_N, n_kv, static_cast<int>(rows), dim, &d.scale,
                         k + g * hd, kv_ld, 0, d.q + r0 * q_ld + g * group * hd, q_ld, hd, &zero,
                         scores + g * group * head_scores, n_kv, head_scores, n_group),
                     "cublasSgemmStridedBatched (attention scores)");
      }
      attn_softmax_rows_kernel<<<static_cast<unsigned>(d.n_head * rows), kRowThreads, 0,
                                 c.stream()>>>(blk, r0, rows, scores);
      launch_check("attn_softmax_rows_kernel");
      if (contributions != nullptr) {
        attn_key_sums_kernel<<<grid_for(blk.n_kv), kEltThreads, 0, c.stream()>>>(blk, rows, scores,
                                                                                 v, contributions);
        launch_check("attn_key_sums_kernel");
        continue;
      }
      for (int64_t g = 0; g < d.n_head_kv; ++g) {
        // out_h^T (hd x rows) = V_g^T (hd x n_kv) weights_h^T (n_kv x rows).
        cublas_check(cublasSgemmStridedBatched(
                         h, CUBLAS_OP_N, CUBLAS_OP_N, dim, static_cast<int>(rows), n_kv, &one,
                         v + g * hd, kv_ld, 0, scores + g * group * head_scores, n_kv, head_scores,
                         &zero, d.out + r0 * q_ld + g * group * hd, q_ld, hd, n_group),
                     "cublasSgemmStridedBatched (attention values)");
      }
    }
  }

  // At least `bytes` for split attention's partial results.  A larger need
  // takes a new buffer and keeps the old one until the context ends (a
  // recorded graph may still name it), outside a capture: a capture fails
  // rather than allocate, but the run before it (the probe of the same
  // ops) has made the buffer.
  template <class C>
  float* attention_partials(C& c, size_t bytes) {
    ThreadCtx& t = c.ctx();
    if (t.attn_partial_bytes < bytes) {
      if (c.capturing()) c.uncapturable("its partial results outgrew their buffer");
      bytes = std::max(bytes, 2 * t.attn_partial_bytes);  // few buffers kept as contexts grow
      t.attn_partials.push_back(dev_alloc(t, bytes, "attention partials"));
      t.attn_partial_bytes = bytes;
    }
    return static_cast<float*>(t.attn_partials.back());
  }

  // The scratch of a thread's GEMMs: at least `bytes` (queued GEMMs may
  // still read the old one: its free is ordered after them).
  void* gemm_scratch(ThreadCtx& c, size_t bytes) {
    if (c.scratch_bytes < bytes) {
      dev_free(c, c.scratch);
      c.scratch = nullptr;
      c.scratch_bytes = 0;
      c.scratch = dev_alloc(c, bytes, "gemm scratch");
      c.scratch_bytes = bytes;
    }
    return c.scratch;
  }

  // matmul_q8's many-row product: bf16 operands on tensor cores, f32 sums.
  void gemm_bf16(ThreadCtx& c, const WeightView& w, const float* x, int64_t n_rows, float* y) {
    check(w.n_in <= INT32_MAX && w.n_out <= INT32_MAX && n_rows <= INT32_MAX,
          "matmul: dimension too large for cuBLAS");
    const int64_t x_elems = n_rows * w.n_in;
    // Freed (stream-ordered) however this ends.
    struct Temp {
      CudaBackend& be;
      ThreadCtx& c;
      void* p;
      ~Temp() { be.dev_free(c, p); }
    } xb{*this, c,
         dev_alloc(c, static_cast<size_t>(x_elems) * sizeof(__nv_bfloat16), "bf16 activations")};
    to_bf16_kernel<<<grid_for(x_elems), kEltThreads, 0, c.stream>>>(
        x, x_elems, static_cast<__nv_bfloat16*>(xb.p));
    launch_check("to_bf16_kernel");
    const int64_t slice = std::clamp<int64_t>(
        static_cast<int64_t>(kGemmScratchBytes / sizeof(__nv_bfloat16)) / w.n_in, 1, w.n_out);
    auto* wb = static_cast<__nv_bfloat16*>(
        gemm_scratch(c, static_cast<size_t>(slice * w.n_in) * sizeof(__nv_bfloat16)));
    const float one = 1.0f, zero = 0.0f;
    cublasHandle_t h = blas(c);
    for (int64_t o0 = 0; o0 < w.n_out; o0 += slice) {
      const int64_t rows = std::min(slice, w.n_out - o0);
      dispatch_type<LaunchDequant>(w.type, w, static_cast<const int32_t*>(nullptr), o0, rows, wb,
                                   c.stream);
      cublas_check(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows),
                                static_cast<int>(n_rows), static_cast<int>(w.n_in), &one, wb,
                                CUDA_R_16BF, static_cast<int>(w.n_in), xb.p, CUDA_R_16BF,
                                static_cast<int>(w.n_in), &zero, y + o0, CUDA_R_32F,
                                static_cast<int>(w.n_out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx (bf16)");
    }
  }

  const int device_;
  const int gemv_max_rows_;
  CudaMemory memory_ = CudaMemory::kDevice;
  bool prefetch_ = false;
  uint64_t resident_kv_bytes_ = 0;
  bool profile_ = false;      // CB_CUDA_PROFILE set: time every op
  bool round_bf16_ = false;   // CB_CUDA_BF16 set (not "0"): matmul_q8 rounds to bf16
  bool int8_gemv_ = false;    // CB_CUDA_INT8 set (not "0"): matmul_q8's GEMV takes int8 activations
  Int8GemvShape int8_shape_;  // CB_CUDA_INT8's launch shape, if it names one
  bool fused_gemv_ = false;  // CB_CUDA_FUSED_GEMV=1: product() folds its gate and add into the GEMV
  bool split_attention_ = false;  // CB_CUDA_ATTN_SPLIT=1: few rows' keys split across blocks
  // CB_CUDA_ATTN=tiles: the largest head size attention_tiles_kernel runs
  // on this device (0: the cuBLAS path for every shape).
  int64_t tiles_max_head_dim_ = 0;
  // CudaBackendOptions::replay_batches or CB_CUDA_GRAPHS, until a capture fails.
  std::atomic<bool> replay_{false};
  // begin_replay()'s recordings by key; under table_->mu.
  std::unordered_map<uint64_t, std::unique_ptr<Recording>> recordings_;
  std::atomic<int64_t> graph_launches_{0};
  std::atomic<int64_t> attention_tiles_launches_{0};
  struct ProfileTotal {
    long long calls = 0;
    double ms = 0.0;
  };
  std::map<std::string, ProfileTotal> profile_totals_;  // under table_->mu
  cudaMemPool_t pool_ = nullptr;
  // table_->mu guards table_'s maps, ctxs_, owned_, staging_ and weights_.
  std::shared_ptr<CtxTable> table_;
  std::vector<std::unique_ptr<ThreadCtx>> ctxs_;
  std::map<uintptr_t, Block> owned_;  // start -> alloc_buffer / prepare_weight blocks
  std::unordered_set<void*> staging_;
  std::vector<void*> weights_;
  // CudaBackendOptions::f32_weight_bytes: what is left of it, and the kept
  // copies by the weight's device address.
  std::mutex f32_mu_;
  int64_t f32_budget_ = 0;
  int64_t f32_kept_ = 0;
  std::unordered_map<const void*, const float*> f32_weights_;
};

// The plugin's entry points, reached through cb_cuda_plugin_api() (the core
// defines the functions of cuda_backend.h and forwards to these).
int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<Backend> make_backend(int device, const CudaBackendOptions& opts) {
  const int n = device_count();
  if (device < 0 || device >= n) {
    fail(ErrorCode::kUnsupported, "cuda backend: no CUDA device " + std::to_string(device) + " (" +
                                      std::to_string(n) + " visible)");
  }
  return std::make_unique<CudaBackend>(device, opts);
}

CudaMark mark(Backend& be) {
  auto* cb = dynamic_cast<CudaBackend*>(&be);
  if (cb == nullptr) fail(ErrorCode::kInvalidArgument, "cuda_mark: not a CUDA backend");
  return cb->mark();
}

int64_t kept_f32_bytes(Backend& be) {
  auto* cb = dynamic_cast<CudaBackend*>(&be);
  if (cb == nullptr) fail(ErrorCode::kInvalidArgument, "cuda_kept_f32_bytes: not a CUDA backend");
  return cb->kept_f32_bytes();
}

int64_t graph_launches(Backend& be) {
  auto* cb = dynamic_cast<CudaBackend*>(&be);
  if (cb == nullptr) fail(ErrorCode::kInvalidArgument, "cuda_graph_launches: not a CUDA backend");
  return cb->graph_launches();
}

int64_t attention_tiles_launches(Backend& be) {
  auto* cb = dynamic_cast<CudaBackend*>(&be);
  if (cb == nullptr) {
    fail(ErrorCode::kInvalidArgument, "cuda_attention_tiles_launches: not a CUDA backend");
  }
  return cb->attention_tiles_launches();
}

double elapsed_ms(const CudaMark& from, const CudaMark& to) {
  if (!from || !to) fail(ErrorCode::kInvalidArgument, "cuda_elapsed_ms: empty mark");
  const cudaEvent_t a = from->ev, b = to->ev;
  cuda_check(cudaEventSynchronize(a), "cudaEventSynchronize");
  cuda_check(cudaEventSynchronize(b), "cudaEventSynchronize");
  float ms = 0.0f;
  cuda_check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  return ms;
}

}  // namespace
}  // namespace cb

extern "C" __attribute__((visibility("default"))) const cb::CudaPluginApi* cb_cuda_plugin_api() {
  static const cb::CudaPluginApi api{
      cb::kCudaPluginInterface, CB_PROJECT_VERSION,  &cb::device_count,
      &cb::make_backend,        &cb::mark,           &cb::elapsed_ms,
      &cb::kept_f32_bytes,      &cb::graph_launches, &cb::attention_tiles_launches};
  return &api;
}
