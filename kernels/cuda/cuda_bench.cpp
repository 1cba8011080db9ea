// Throughput sanity check of the CUDA backend (a tool, not a test):
//   cuda_bench [device] [--pipeline] [--gemv] [--attention] [--layers N] [--ratio R]
// Times whole backend calls, synchronisation included, because that is what
// the runtime pays per op: decode GEMV (weight bytes per second), prefill
// GEMM (dequantize + SGEMM, GFLOP/s), attention over a long context, the
// per-op cost in and out of a batch, top_k, uploads; then the layerwise
// pipeline's overlap of KV uploads (a loader thread) with layer compute
// (--pipeline: only that part).  --gemv: only decode's products as a decode
// token runs them, beside the shape llama.cpp's test-backend-ops times, on
// f32 and on int8 activations (CB_CUDA_INT8, in every launch shape), and a
// decode token's products with and without the ops beside them folded in
// (CB_CUDA_FUSED_GEMV).
// --attention: only attention of many rows, cuBLAS against the tiled kernel
// (CB_CUDA_ATTN=tiles), at a blend's, a prefill chunk's and a question's
// rows over an 8 x 512-token request, and how far their outputs differ.
// The single ops and the products run on managed memory, which this tool
// fills from the host; uploads and the pipeline on the runtime's default,
// device memory.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <latch>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "platform/error.h"

namespace {

using Clock = std::chrono::steady_clock;

// Median seconds of `reps` runs of f, after one warm-up run.
template <class F>
double time_it(int reps, F&& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    f();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Random bytes with every f16 scale field forced to a small finite value, so
// no NaN or infinity slows anything down.  Scale offsets per block as in
// quant_blocks.h.
std::vector<uint8_t> random_weight(std::mt19937& rng, cb::DType t, int64_t n_out, int64_t n_in) {
  std::vector<uint8_t> w(cb::dtype_row_bytes(t, n_in) * static_cast<size_t>(n_out));
  for (uint8_t& b : w) b = static_cast<uint8_t>(rng());
  std::vector<size_t> scales;
  switch (t) {
    case cb::DType::Q4_0:
    case cb::DType::Q8_0:
      scales = {0};
      break;
    case cb::DType::Q4_1:
    case cb::DType::Q4_K:
      scales = {0, 2};
      break;
    case cb::DType::Q6_K:
      scales = {208};
      break;
    default:
      break;
  }
  const uint16_t small = 0x1800;  // f16 2^-9
  const size_t bb = cb::dtype_block_bytes(t);
  for (size_t off = 0; off < w.size(); off += bb) {
    for (size_t s : scales) std::memcpy(w.data() + off + s, &small, 2);
  }
  return w;
}

// upload() of 64 MiB into device memory, from page-locked staging and from
// pageable memory.
void run_uploads(cb::Backend& be) {
  const size_t bytes = size_t{64} << 20;
  auto* dst = static_cast<unsigned char*>(be.alloc_buffer(bytes));
  auto* staging = static_cast<unsigned char*>(be.alloc_host_staging(bytes));
  std::vector<unsigned char> pageable(bytes, 3);
  std::memset(staging, 5, bytes);
  struct Case {
    const char* what;
    const void* src;
  };
  for (const Case& c :
       {Case{"staging -> device", staging}, Case{"pageable -> device", pageable.data()}}) {
    std::vector<double> copy, wall;
    for (int rep = 0; rep < 6; ++rep) {
      const auto t0 = Clock::now();
      be.upload(dst, c.src, bytes);
      const double ms = be.wait_uploads();
      if (rep == 0) continue;  // warm-up
      wall.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      copy.push_back(ms);
    }
    std::sort(copy.begin(), copy.end());
    std::sort(wall.begin(), wall.end());
    std::printf("upload 64 MiB %-26s copy %7.2f ms (%5.1f GB/s), call + wait %7.2f ms\n", c.what,
                copy[copy.size() / 2], static_cast<double>(bytes) / (copy[copy.size() / 2] * 1e6),
                wall[wall.size() / 2]);
  }
  be.free_host_staging(staging);
  be.free_buffer(dst);
}

// Single ops, per-op overhead and top_k.
void run_kernels(cb::Backend& b) {
  cb::Backend* be = &b;
  {
    std::mt19937 rng(1);
    const int64_t n_in = 4096, n_out = 4096;  // a 7B-class projection
    float* x = static_cast<float*>(be->alloc_buffer(512 * n_in * sizeof(float)));
    float* y = static_cast<float*>(be->alloc_buffer(512 * n_out * sizeof(float)));
    for (int64_t i = 0; i < 512 * n_in; ++i) x[i] = static_cast<float>(rng() % 1000) / 1000.0f;
    for (cb::DType t : {cb::DType::Q4_0, cb::DType::Q4_1, cb::DType::Q8_0, cb::DType::Q4_K,
                        cb::DType::Q6_K, cb::DType::F16}) {
      const std::vector<uint8_t> host = random_weight(rng, t, n_out, n_in);
      const cb::WeightView w = be->prepare_weight({host.data(), t, n_in, n_out});
      const double gemv = time_it(20, [&] { be->matmul(w, x, 1, y); });
      const double gemm = time_it(5, [&] { be->matmul(w, x, 512, y); });
      std::printf(
          "%-5s %lldx%lld  gemv(1 row) %8.1f us %7.1f GB/s   gemm(512 rows) %8.1f us %7.0f "
          "GFLOP/s\n",
          cb::dtype_name(t), static_cast<long long>(n_out), static_cast<long long>(n_in),
          gemv * 1e6, static_cast<double>(host.size()) / gemv / 1e9, gemm * 1e6,
          2.0 * 512 * n_in * n_out / gemm / 1e9);
    }
    // Decode attention: 1 query over 4096 keys, 32 heads, 8 KV heads of 128.
    const int64_t n_kv = 4096, n_head = 32, n_head_kv = 8, hd = 128;
    float* k = static_cast<float*>(be->alloc_buffer(n_kv * n_head_kv * hd * sizeof(float)));
    float* v = static_cast<float*>(be->alloc_buffer(n_kv * n_head_kv * hd * sizeof(float)));
    float* q = static_cast<float*>(be->alloc_buffer(512 * n_head * hd * sizeof(float)));
    float* o = static_cast<float*>(be->alloc_buffer(512 * n_head * hd * sizeof(float)));
    int32_t* pos = static_cast<int32_t*>(be->alloc_buffer(512 * sizeof(int32_t)));
    for (int64_t i = 0; i < n_kv * n_head_kv * hd; ++i) k[i] = v[i] = 0.01f * (i % 97);
    for (int64_t i = 0; i < 512 * n_head * hd; ++i) q[i] = 0.01f * (i % 89);
    for (int i = 0; i < 512; ++i) pos[i] = static_cast<int32_t>(n_kv - 512 + i);
    for (int64_t n_q : {1, 512}) {
      cb::AttentionArgs a;
      a.q = q;
      a.q_pos = pos + (512 - n_q);
      a.n_q = n_q;
      a.k = k;
      a.v = v;
      a.n_kv = n_kv;
      a.n_head = n_head;
      a.n_head_kv = n_head_kv;
      a.head_dim = hd;
      a.scale = 0.088f;
      a.out = o;
      const double t = time_it(5, [&] { be->attention(a); });
      std::printf("attention %lld queries x %lld keys (32/8 heads of 128): %8.1f us\n",
                  static_cast<long long>(n_q), static_cast<long long>(n_kv), t * 1e6);
    }
    // A 4x taller weight separates the fixed cost of a call from the
    // per-byte cost of the GEMV.
    {
      const std::vector<uint8_t> host = random_weight(rng, cb::DType::Q4_0, 4 * n_out, n_in);
      const cb::WeightView w = be->prepare_weight({host.data(), cb::DType::Q4_0, n_in, 4 * n_out});
      float* y4 = static_cast<float*>(be->alloc_buffer(4 * n_out * sizeof(float)));
      const double gemv = time_it(20, [&] { be->matmul(w, x, 1, y4); });
      std::printf("Q4_0  %lldx%lld gemv(1 row) %8.1f us %7.1f GB/s\n",
                  static_cast<long long>(4 * n_out), static_cast<long long>(n_in), gemv * 1e6,
                  static_cast<double>(host.size()) / gemv / 1e9);
      be->free_buffer(y4);
    }
    // The fixed cost of one op (launch, pointer checks, synchronisation),
    // and inside a batch, where only the last op waits (1000 dependent
    // adds, one synchronisation).
    const double tiny = time_it(100, [&] { be->add(x, x, 1, y); });
    std::printf("add of 1 element (per-op overhead):            %8.1f us\n", tiny * 1e6);
    const double batched = time_it(5, [&] {
      be->begin_batch();
      for (int i = 0; i < 1000; ++i) be->add(y, x, 1, y);
      be->end_batch();
    });
    std::printf("add of 1 element inside a batch (per op):       %8.2f us\n", batched * 1e3);
    // HKVD selection: 20000 deviations in backend memory, 15 % of them.
    {
      float* dev_sq = static_cast<float*>(be->alloc_buffer(20000 * sizeof(float)));
      for (int i = 0; i < 20000; ++i) dev_sq[i] = static_cast<float>(rng() % 100000) / 7.0f;
      std::vector<int32_t> picks(3000);
      const double tk = time_it(20, [&] { be->top_k(dev_sq, 20000, 3000, picks.data()); });
      std::printf("top_k 3000 of 20000 (backend values, host out): %8.1f us\n", tk * 1e6);
      be->free_buffer(dev_sq);
    }
    for (void* p : {static_cast<void*>(x), static_cast<void*>(y), static_cast<void*>(k),
                    static_cast<void*>(v), static_cast<void*>(q), static_cast<void*>(o),
                    static_cast<void*>(pos)})
      be->free_buffer(p);
  }
}

// Decode's products as a token runs them: one batch replayed from a
// recording (a CUDA graph; queued call by call with CB_CUDA_GRAPHS=0), one
// wait at its end.  Each call reads another copy of the weight, so that, as in a
// model larger than the GPU's L2 cache, the weights come from memory: the
// rate is the one the memory bandwidth bounds.  The shapes of
// Qwen2.5-1.5B's projections and the one llama.cpp's `test-backend-ops perf
// -o MUL_MAT` times (4096 outputs of 14336 inputs), in Q4_K and Q6_K (a
// Q4_K_M file's two types).  q8: matmul_q8 (int8 activations on a backend
// made with CB_CUDA_INT8) instead of matmul; `label` names it in the table.
void run_gemv(cb::Backend& be, bool q8, const std::string& label) {
  struct GemvShape {
    const char* name;
    int64_t n_out, n_in;
  };
  const GemvShape shapes[] = {{"q, o (1.5B)", 1536, 1536},     {"k, v (1.5B)", 256, 1536},
                              {"gate, up (1.5B)", 8960, 1536}, {"down (1.5B)", 1536, 8960},
                              {"output (1.5B)", 151936, 1536}, {"test-backend-ops", 4096, 14336}};
  constexpr size_t kBytesPerShape = size_t{256} << 20;  // several times any L2
  constexpr int kCalls = 256;
  std::mt19937 rng(3);
  uint64_t replay_key = 0;
  float* x = static_cast<float*>(be.alloc_buffer(14336 * sizeof(float)));
  float* y = static_cast<float*>(be.alloc_buffer(151936 * sizeof(float)));
  for (int64_t i = 0; i < 14336; ++i) x[i] = static_cast<float>(rng() % 1000) / 1000.0f;
  std::printf(
      "decode GEMV (%s), %d calls in a replayed batch, each on another of the weight's copies\n",
      label.c_str(), kCalls);
  for (cb::DType t : {cb::DType::Q4_K, cb::DType::Q6_K}) {
    for (const GemvShape& sh : shapes) {
      const std::vector<uint8_t> host = random_weight(rng, t, sh.n_out, sh.n_in);
      const size_t copies = std::clamp<size_t>(kBytesPerShape / host.size(), 2, kCalls);
      std::vector<cb::WeightView> ws;
      for (size_t c = 0; c < copies; ++c)
        ws.push_back(be.prepare_weight({host.data(), t, sh.n_in, sh.n_out}));
      const uint64_t key = ++replay_key;
      auto run = [&] {
        if (be.begin_replay(key) != cb::Backend::ReplayStart::kReplayed) {
          for (int i = 0; i < kCalls; ++i) {
            const cb::WeightView& w = ws[static_cast<size_t>(i) % copies];
            if (q8) {
              be.matmul_q8(w, x, 1, y);
            } else {
              be.matmul(w, x, 1, y);
            }
          }
        }
        be.end_batch();
      };
      run();  // with time_it's own warm-up: the batch looked at, then recorded
      const double s = time_it(5, run);
      be.forget_replay(key);
      const double per_call = s / kCalls;
      std::printf("%-5s %-17s %5lldx%-5lld %7.1f kB %8.2f us/call %7.1f GB/s\n", cb::dtype_name(t),
                  sh.name, static_cast<long long>(sh.n_out), static_cast<long long>(sh.n_in),
                  static_cast<double>(host.size()) / 1e3, per_call * 1e6,
                  static_cast<double>(host.size()) / per_call / 1e9);
    }
  }
  be.free_buffer(x);
  be.free_buffer(y);
}

// A decode token's products, layer after layer, as the graph hands them
// over (Backend::product, Backend::products): Q, K and V of one input with
// their biases, the output projection added to the residual, gate and up,
// the down projection of silu(gate) * up added to the residual; V and down
// Q6_K in every other layer, the rest Q4_K, as in Qwen2.5-1.5B's Q4_K_M
// file.  One batch replayed from a recording, each layer its own weights
// (28 layers: the weights come from memory).  On a backend made with
// CB_CUDA_FUSED_GEMV the adds and SiLU go into the products and the
// products of one input into one launch; `label` names it.
void run_decode_products(cb::Backend& be, const std::string& label) {
  constexpr int kLayers = 28;
  constexpr int64_t kHidden = 1536, kKv = 256, kFfn = 8960;
  std::mt19937 rng(5);
  struct Layer {
    cb::WeightView q, k, v, o, gate, up, down;
  };
  // One random matrix a type and shape, a copy of it in each layer.
  std::map<std::tuple<cb::DType, int64_t, int64_t>, std::vector<uint8_t>> host;
  auto weight = [&](cb::DType t, int64_t n_out, int64_t n_in) {
    std::vector<uint8_t>& h = host[{t, n_out, n_in}];
    if (h.empty()) h = random_weight(rng, t, n_out, n_in);
    return be.prepare_weight({h.data(), t, n_in, n_out});
  };
  std::vector<Layer> layers;
  for (int l = 0; l < kLayers; ++l) {
    const cb::DType odd = l % 2 == 1 ? cb::DType::Q6_K : cb::DType::Q4_K;
    layers.push_back({weight(cb::DType::Q4_K, kHidden, kHidden),
                      weight(cb::DType::Q4_K, kKv, kHidden), weight(odd, kKv, kHidden),
                      weight(cb::DType::Q4_K, kHidden, kHidden),
                      weight(cb::DType::Q4_K, kFfn, kHidden),
                      weight(cb::DType::Q4_K, kFfn, kHidden), weight(odd, kHidden, kFfn)});
  }
  auto buffer = [&](int64_t n) {
    float* p = static_cast<float*>(be.alloc_buffer(static_cast<size_t>(n) * sizeof(float)));
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(rng() % 1000) / 1e4f;
    return p;
  };
  float *x = buffer(kHidden), *h = buffer(kHidden), *q = buffer(kHidden), *k = buffer(kKv),
        *v = buffer(kKv), *gate = buffer(kFfn), *up = buffer(kFfn), *scratch = buffer(kHidden),
        *bq = buffer(kHidden), *bk = buffer(kKv), *bv = buffer(kKv);
  auto run = [&] {
    if (be.begin_replay(1) != cb::Backend::ReplayStart::kReplayed) {
      for (const Layer& L : layers) {
        const cb::ProductArgs qkv[3] = {
            {.w = &L.q, .x = h, .n_rows = 1, .bias = bq, .q8 = true, .y = q},
            {.w = &L.k, .x = h, .n_rows = 1, .bias = bk, .q8 = true, .y = k},
            {.w = &L.v, .x = h, .n_rows = 1, .bias = bv, .q8 = true, .y = v}};
        be.products(qkv, 3);
        be.product({.w = &L.o,
                    .x = q,
                    .n_rows = 1,
                    .q8 = true,
                    .accumulate = true,
                    .scratch = scratch,
                    .y = x});
        const cb::ProductArgs gate_up[2] = {
            {.w = &L.gate, .x = h, .n_rows = 1, .q8 = true, .y = gate},
            {.w = &L.up, .x = h, .n_rows = 1, .q8 = true, .y = up}};
        be.products(gate_up, 2);
        be.product({.w = &L.down,
                    .x = gate,
                    .up = up,
                    .gate = cb::ProductArgs::Gate::kSilu,
                    .n_rows = 1,
                    .q8 = true,
                    .accumulate = true,
                    .scratch = scratch,
                    .y = x});
      }
    }
    be.end_batch();
  };
  run();  // looked at, then recorded (with time_it's warm-up)
  const double s = time_it(5, run);
  be.forget_replay(1);
  std::printf("decode products of %d layers (%s): %8.1f us a layer, %7.1f us a token\n", kLayers,
              label.c_str(), s * 1e6 / kLayers, s * 1e6);
  for (float* p : {x, h, q, k, v, gate, up, scratch, bq, bk, bv}) be.free_buffer(p);
}

// ------------------------------------------------------------ pipeline --//
// ------------------------------------------------------------ pipeline --

// A layer of a Llama-style model, for the compute side of the pipeline.
struct Shape {
  const char* name;
  int64_t hidden, n_head, n_head_kv, head_dim, ffn;
  int64_t q_dim() const { return n_head * head_dim; }
  int64_t kv_dim() const { return n_head_kv * head_dim; }
};

struct PipelineOptions {
  int layers = 8;
  double ratio = 0.15;  // rows recomputed per layer (CacheBlend's r)
};

// One configuration: `layers` layers of `tokens` cached tokens.  Per layer
// the loader uploads K and V (tokens x kv_dim f32 each, from page-locked
// staging) into the layer's KV cache and rotates K; the compute side runs
// the layer for ratio * tokens rows (QKV, RoPE, scatter of the new K/V,
// attention over every token, output projection, FFN) as one batch.
// Serial: load then compute, layer by layer, on one thread.  Overlapped: the
// loader thread runs ahead while the main thread computes each layer as
// soon as it is loaded -- what the runtime's layerwise pipeline does.
class PipelineBench {
 public:
  PipelineBench(cb::Backend& be, const Shape& sh, int64_t tokens, const PipelineOptions& o)
      : be_(be), sh_(sh), t_(tokens), layers_(o.layers) {
    rows_ = std::max<int64_t>(1, static_cast<int64_t>(o.ratio * static_cast<double>(tokens)));
    std::mt19937 rng(7);
    auto weight = [&](int64_t n_out, int64_t n_in) {
      const std::vector<uint8_t> h = random_weight(rng, cb::DType::Q4_0, n_out, n_in);
      return be_.prepare_weight({h.data(), cb::DType::Q4_0, n_in, n_out});
    };
    wq_ = weight(sh.q_dim(), sh.hidden);
    wk_ = weight(sh.kv_dim(), sh.hidden);
    wv_ = weight(sh.kv_dim(), sh.hidden);
    wo_ = weight(sh.hidden, sh.q_dim());
    wg_ = weight(sh.ffn, sh.hidden);
    wu_ = weight(sh.ffn, sh.hidden);
    wd_ = weight(sh.hidden, sh.ffn);
    norm_.assign(static_cast<size_t>(sh.hidden), 1.0f);
    x0_.resize(static_cast<size_t>(rows_ * sh.hidden));
    for (float& v : x0_) v = static_cast<float>(rng() % 2001) / 1000.0f - 1.0f;
    x_ = buf(rows_ * sh.hidden);
    xn_ = buf(rows_ * sh.hidden);
    q_ = buf(rows_ * sh.q_dim());
    kn_ = buf(rows_ * sh.kv_dim());
    vn_ = buf(rows_ * sh.kv_dim());
    att_ = buf(rows_ * sh.q_dim());
    o_ = buf(rows_ * sh.hidden);
    gate_ = buf(rows_ * sh.ffn);
    up_ = buf(rows_ * sh.ffn);
    // The recomputed rows are spread over the context, as HKVD rows are.
    qpos_.resize(static_cast<size_t>(rows_));
    for (int64_t i = 0; i < rows_; ++i) qpos_[i] = static_cast<int32_t>((i + 1) * t_ / rows_ - 1);
    qpos_dev_ = static_cast<int32_t*>(be_.alloc_buffer(qpos_.size() * sizeof(int32_t)));
    be_.upload(qpos_dev_, qpos_.data(), qpos_.size() * sizeof(int32_t));
    be_.wait_uploads();
    kv_pos_.resize(static_cast<size_t>(t_));
    for (int64_t i = 0; i < t_; ++i) kv_pos_[i] = static_cast<int32_t>(i);
    for (int l = 0; l < layers_; ++l) {
      k_.push_back(buf(t_ * sh.kv_dim()));
      v_.push_back(buf(t_ * sh.kv_dim()));
    }
    staging_ = static_cast<float*>(be_.alloc_host_staging(2 * layer_bytes()));
    for (size_t i = 0; i < 2 * layer_bytes() / sizeof(float); ++i) {
      staging_[i] = static_cast<float>(rng() % 2001) / 1000.0f - 1.0f;
    }
  }

  ~PipelineBench() {
    for (void* p : bufs_) be_.free_buffer(p);
    be_.free_buffer(qpos_dev_);
    be_.free_host_staging(staging_);
  }

  size_t layer_bytes() const { return static_cast<size_t>(t_ * sh_.kv_dim()) * sizeof(float); }

  struct Times {
    double wall_ms = 0, gpu_ms = 0, copy_ms = 0, compute_ms = 0, loader_ms = 0;
  };

  Times serial() {
    reset();
    Times t;
    const auto w0 = Clock::now();
    const cb::CudaMark m0 = cb::cuda_mark(be_);
    for (int l = 0; l < layers_; ++l) {
      const auto l0 = Clock::now();
      load(l);
      t.loader_ms += ms_since(l0);
      t.compute_ms += compute(l);
    }
    const cb::CudaMark m1 = cb::cuda_mark(be_);
    t.gpu_ms = cb::cuda_elapsed_ms(m0, m1);
    t.wall_ms = ms_since(w0);
    t.copy_ms = be_.wait_uploads();
    return t;
  }

  Times overlapped() {
    reset();
    Times t;
    std::mutex mu;
    std::condition_variable cv;
    int loaded = 0;
    cb::CudaMark start;
    std::latch go(2);
    std::thread loader([&] {
      go.arrive_and_wait();
      start = cb::cuda_mark(be_);  // the loader's stream, before its first copy
      const auto l0 = Clock::now();
      for (int l = 0; l < layers_; ++l) {
        load(l);  // returns after its rope, which waited for the copies
        std::lock_guard<std::mutex> lock(mu);
        loaded = l + 1;
        cv.notify_one();
      }
      t.loader_ms = ms_since(l0);
      t.copy_ms = be_.wait_uploads();
    });
    go.arrive_and_wait();
    const auto w0 = Clock::now();
    for (int l = 0; l < layers_; ++l) {
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return loaded > l; });
      }
      t.compute_ms += compute(l);
    }
    const cb::CudaMark end = cb::cuda_mark(be_);
    loader.join();
    t.wall_ms = ms_since(w0);
    t.gpu_ms = cb::cuda_elapsed_ms(start, end);
    return t;
  }

  int64_t rows() const { return rows_; }

 private:
  static double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }

  float* buf(int64_t n) {
    auto* p = static_cast<float*>(be_.alloc_buffer(static_cast<size_t>(n) * sizeof(float)));
    bufs_.push_back(p);
    return p;
  }

  void reset() {
    be_.upload(x_, x0_.data(), x0_.size() * sizeof(float));
    be_.wait_uploads();
  }

  // The loader's work for one layer (as runtime/blend/layer_pipeline.cpp).
  void load(int l) {
    const size_t bytes = layer_bytes();
    be_.upload(k_[l], staging_, bytes);
    be_.upload(v_[l], staging_ + bytes / sizeof(float), bytes);
    be_.rope(k_[l], kv_pos_.data(), t_, sh_.n_head_kv, sh_.head_dim, sh_.head_dim, 500000.0f,
             nullptr);
  }

  // One layer for rows_ rows as one batch; returns its GPU time (events).
  double compute(int l) {
    const Shape& s = sh_;
    const int64_t r = rows_;
    const cb::CudaMark m0 = cb::cuda_mark(be_);
    be_.begin_batch();
    be_.rmsnorm(x_, norm_.data(), r, s.hidden, 1e-5f, xn_);
    be_.matmul(wq_, xn_, r, q_);
    be_.matmul(wk_, xn_, r, kn_);
    be_.matmul(wv_, xn_, r, vn_);
    be_.rope(q_, qpos_.data(), r, s.n_head, s.head_dim, s.head_dim, 500000.0f, nullptr);
    be_.rope(kn_, qpos_.data(), r, s.n_head_kv, s.head_dim, s.head_dim, 500000.0f, nullptr);
    be_.scatter_rows(kn_, s.kv_dim(), qpos_dev_, r, k_[l]);
    be_.scatter_rows(vn_, s.kv_dim(), qpos_dev_, r, v_[l]);
    cb::AttentionArgs a;
    a.q = q_;
    a.q_pos = qpos_dev_;
    a.n_q = r;
    a.k = k_[l];
    a.v = v_[l];
    a.n_kv = t_;
    a.n_head = s.n_head;
    a.n_head_kv = s.n_head_kv;
    a.head_dim = s.head_dim;
    a.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    a.out = att_;
    be_.attention(a);
    be_.matmul(wo_, att_, r, o_);
    be_.add(x_, o_, r * s.hidden, x_);
    be_.rmsnorm(x_, norm_.data(), r, s.hidden, 1e-5f, xn_);
    be_.matmul(wg_, xn_, r, gate_);
    be_.matmul(wu_, xn_, r, up_);
    be_.silu_mul(gate_, up_, r * s.ffn, gate_);
    be_.matmul(wd_, gate_, r, o_);
    be_.add(x_, o_, r * s.hidden, x_);
    const cb::CudaMark m1 = cb::cuda_mark(be_);
    be_.end_batch();
    return cb::cuda_elapsed_ms(m0, m1);
  }

  cb::Backend& be_;
  Shape sh_;
  int64_t t_, rows_ = 0;
  int layers_;
  cb::WeightView wq_, wk_, wv_, wo_, wg_, wu_, wd_;
  std::vector<float> norm_, x0_;
  float *x_, *xn_, *q_, *kn_, *vn_, *att_, *o_, *gate_, *up_;
  std::vector<int32_t> qpos_, kv_pos_;
  int32_t* qpos_dev_ = nullptr;
  std::vector<float*> k_, v_;
  std::vector<void*> bufs_;
  float* staging_ = nullptr;
};

void run_pipeline(cb::Backend& be, const PipelineOptions& o) {
  // kv_dim 320: SmolLM2-360M's attention (15 heads, 5 KV heads of 64);
  // kv_dim 1024: Llama 3 8B's (32 heads, 8 KV heads of 128).
  const Shape shapes[] = {
      {"kv_dim 320 (hidden 960, 15/5 heads of 64, ffn 2560)", 960, 15, 5, 64, 2560},
      {"kv_dim 1024 (hidden 4096, 32/8 heads of 128, ffn 14336)", 4096, 32, 8, 128, 14336}};
  for (const Shape& sh : shapes) {
    for (int64_t tokens : {4096, 8192}) {
      PipelineBench pb(be, sh, tokens, o);
      pb.serial();  // warm-up: memory pools, cuBLAS, first touches
      pb.overlapped();
      auto median = [](std::vector<PipelineBench::Times> v) {
        std::sort(v.begin(), v.end(),
                  [](const auto& a, const auto& b) { return a.gpu_ms < b.gpu_ms; });
        return v[v.size() / 2];
      };
      std::vector<PipelineBench::Times> ser, ovl;
      for (int rep = 0; rep < 3; ++rep) {
        ser.push_back(pb.serial());
        ovl.push_back(pb.overlapped());
      }
      const PipelineBench::Times s = median(ser), v = median(ovl);
      const double mb = static_cast<double>(2 * pb.layer_bytes()) / 1e6;
      std::printf(
          "pipeline %s, %lld tokens, %lld rows (ratio %.2f), %d layers, K+V %.1f MB/layer\n",
          sh.name, static_cast<long long>(tokens), static_cast<long long>(pb.rows()), o.ratio,
          o.layers, mb);
      std::printf(
          "  serial     %9.2f ms GPU (%9.2f ms wall): copy %8.2f ms (%.1f GB/s), compute %8.2f "
          "ms\n",
          s.gpu_ms, s.wall_ms, s.copy_ms, mb * o.layers / s.copy_ms, s.compute_ms);
      std::printf(
          "  overlapped %9.2f ms GPU (%9.2f ms wall): copy %8.2f ms (%.1f GB/s), compute %8.2f ms, "
          "loader busy %8.2f ms\n",
          v.gpu_ms, v.wall_ms, v.copy_ms, mb * o.layers / v.copy_ms, v.compute_ms, v.loader_ms);
      std::printf("  overlapped / max(copy, compute) = %.2f   serial / overlapped = %.2f\n",
                  v.gpu_ms / std::max(v.copy_ms, v.compute_ms), s.gpu_ms / v.gpu_ms);
    }
  }
}

// Attention of many query rows over a 4,158-token request with an f16
// cache, as a request of 8 chunks of 512 tokens and a question makes it:
// the blend's recomputed rows (0.214 of the request, spread over it), a
// prefill chunk (2,048 rows from position 2,048) and the question (33 rows
// at the end); at the head shapes of Qwen2.5-Coder-1.5B (12 query heads, 2
// KV heads of 128) and 0.5B (14, 2 of 64).  GFLOP/s counts 4 head_dim
// flops per visible (row, head, key).  `gemm` runs the cuBLAS path,
// `tiles` the tiled kernel (CB_CUDA_ATTN=tiles), on the same inputs: the
// largest difference of their outputs is printed too.
void run_attention(cb::Backend& gemm, cb::Backend& tiles) {
  cb::Backend& be = gemm;  // owns the buffers; the other reads them in place
  const int64_t n_kv = 4158;
  struct Rows {
    const char* name;
    std::vector<int32_t> pos;
  };
  std::vector<Rows> sets(3);
  sets[0].name = "blend, 890 spread rows";
  for (int i = 0; i < 890; ++i) sets[0].pos.push_back(static_cast<int32_t>(i * n_kv / 890));
  sets[1].name = "prefill chunk, 2048 rows";
  for (int i = 0; i < 2048; ++i) sets[1].pos.push_back(2048 + i);
  sets[2].name = "question, 33 rows";
  for (int i = 0; i < 33; ++i) sets[2].pos.push_back(static_cast<int32_t>(n_kv - 33 + i));
  struct Heads {
    const char* model;
    int64_t n_head, n_head_kv, hd;
  };
  std::mt19937 rng(3);
  for (const Heads& h : {Heads{"1.5B", 12, 2, 128}, Heads{"0.5B", 14, 2, 64}}) {
    const int64_t kv_elems = n_kv * h.n_head_kv * h.hd, q_elems = 2048 * h.n_head * h.hd;
    auto* k = static_cast<uint16_t*>(be.alloc_buffer(kv_elems * sizeof(uint16_t)));
    auto* v = static_cast<uint16_t*>(be.alloc_buffer(kv_elems * sizeof(uint16_t)));
    auto* q = static_cast<float*>(be.alloc_buffer(q_elems * sizeof(float)));
    auto* o = static_cast<float*>(be.alloc_buffer(q_elems * sizeof(float)));
    auto* pos = static_cast<int32_t*>(be.alloc_buffer(2048 * sizeof(int32_t)));
    std::uniform_int_distribution<int> half(0x3000, 0x3bff);  // f16 values in [0.125, 1)
    for (int64_t i = 0; i < kv_elems; ++i) {
      k[i] = static_cast<uint16_t>(half(rng) | (rng() % 2 ? 0x8000 : 0));
      v[i] = static_cast<uint16_t>(half(rng) | (rng() % 2 ? 0x8000 : 0));
    }
    for (int64_t i = 0; i < q_elems; ++i) q[i] = static_cast<float>(rng() % 2001) / 1000.0f - 1.0f;
    for (const Rows& r : sets) {
      std::copy(r.pos.begin(), r.pos.end(), pos);
      const cb::AttentionArgs a{.q = q,
                                .q_pos = pos,
                                .n_q = static_cast<int64_t>(r.pos.size()),
                                .k = k,
                                .v = v,
                                .kv_type = cb::DType::F16,
                                .n_kv = n_kv,
                                .n_head = h.n_head,
                                .n_head_kv = h.n_head_kv,
                                .head_dim = h.hd,
                                .scale = 1.0f / std::sqrt(static_cast<float>(h.hd)),
                                .window = 0,
                                .key_bias = {},
                                .out = o};
      double visible = 0.0;
      for (int32_t p : r.pos) visible += static_cast<double>(std::min<int64_t>(p + 1, n_kv));
      const size_t n_out = r.pos.size() * static_cast<size_t>(h.n_head * h.hd);
      std::vector<float> by_gemm;
      for (cb::Backend* b : {&gemm, &tiles}) {
        const double t = time_it(10, [&] { b->attention(a); });
        std::printf("attention %-6s %s heads %lld/%lld of %lld, %-26s %9.1f us %8.0f GFLOP/s",
                    b == &gemm ? "cublas" : "tiles", h.model, static_cast<long long>(h.n_head),
                    static_cast<long long>(h.n_head_kv), static_cast<long long>(h.hd), r.name,
                    t * 1e6, 4.0 * static_cast<double>(h.hd * h.n_head) * visible / t / 1e9);
        if (b == &gemm) {
          by_gemm.assign(o, o + n_out);  // managed memory
          std::printf("\n");
        } else {
          double worst = 0.0;
          for (size_t i = 0; i < n_out; ++i)
            worst = std::max(worst, static_cast<double>(std::fabs(o[i] - by_gemm[i])));
          std::printf("  max |tiles - cublas| %.2e\n", worst);
        }
      }
    }
    for (void* p : {static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(q),
                    static_cast<void*>(o), static_cast<void*>(pos)}) {
      be.free_buffer(p);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int device = 0;
  bool pipeline_only = false, gemv_only = false, attention_only = false;
  PipelineOptions po;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--pipeline") {
      pipeline_only = true;
    } else if (a == "--gemv") {
      gemv_only = true;
    } else if (a == "--attention") {
      attention_only = true;
    } else if (a == "--layers" && i + 1 < argc) {
      po.layers = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--ratio" && i + 1 < argc) {
      po.ratio = std::clamp(std::atof(argv[++i]), 0.0, 1.0);
    } else if (!a.empty() && a[0] != '-') {
      device = std::atoi(a.c_str());
    } else {
      std::fprintf(stderr,
                   "usage: cuda_bench [device] [--pipeline] [--gemv] [--attention] [--layers N] "
                   "[--ratio R]\n");
      return 2;
    }
  }
  try {
    cb::CudaBackendOptions managed;
    managed.memory = cb::CudaMemory::kManaged;
    if (gemv_only) {
      run_gemv(*cb::make_cuda_backend(device, managed), false, "matmul");
      // The int8 GEMV as the backend launches it, then every launch shape
      // (weight rows a warp x warps a row) for choosing its defaults.
      for (const char* shape : {"1", "1x1", "1x2", "1x4", "2x1", "2x2", "4x1"}) {
        setenv("CB_CUDA_INT8", shape, 1);  // read when the backend is made
        run_gemv(*cb::make_cuda_backend(device, managed), true,
                 std::string("matmul_q8, CB_CUDA_INT8=") + shape);
      }
      // A decode token's products, the ops beside them one by one and
      // folded in (CB_CUDA_FUSED_GEMV), on f32 and on int8 activations.
      for (const char* int8 : {"0", "1"}) {
        setenv("CB_CUDA_INT8", int8, 1);
        for (const char* fused : {"0", "1"}) {
          setenv("CB_CUDA_FUSED_GEMV", fused, 1);
          run_decode_products(*cb::make_cuda_backend(device, managed),
                              std::string("CB_CUDA_FUSED_GEMV=") + fused + " CB_CUDA_INT8=" + int8);
        }
      }
      return 0;
    }
    if (attention_only) {
      auto gemm = cb::make_cuda_backend(device, managed);
      setenv("CB_CUDA_ATTN", "tiles", 1);  // read when the backend is made
      auto tiles = cb::make_cuda_backend(device, managed);
      run_attention(*gemm, *tiles);
      return 0;
    }
    if (!pipeline_only) run_kernels(*cb::make_cuda_backend(device, managed));
    auto be = cb::make_cuda_backend(device);
    if (!pipeline_only) run_uploads(*be);
    run_pipeline(*be, po);
  } catch (const cb::Error& e) {
    std::fprintf(stderr, "cuda_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
