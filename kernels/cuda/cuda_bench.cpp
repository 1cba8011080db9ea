// Throughput sanity check of the CUDA backend (a tool, not a test):
//   cuda_bench [device]
// Times whole backend calls, synchronisation included, because that is what
// the runtime pays per op: decode GEMV (weight bytes per second), prefill
// GEMM (dequantize + SGEMM, GFLOP/s) and attention over a long context.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
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

}  // namespace

int main(int argc, char** argv) {
  const int device = argc > 1 ? std::atoi(argv[1]) : 0;
  try {
    auto be = cb::make_cuda_backend(device);
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
    // The fixed cost of one op (launch, pointer checks, synchronisation).
    const double tiny = time_it(100, [&] { be->add(x, x, 1, y); });
    std::printf("add of 1 element (per-op overhead):            %8.1f us\n", tiny * 1e6);
    for (void* p : {static_cast<void*>(x), static_cast<void*>(y), static_cast<void*>(k),
                    static_cast<void*>(v), static_cast<void*>(q), static_cast<void*>(o),
                    static_cast<void*>(pos)})
      be->free_buffer(p);
  } catch (const cb::Error& e) {
    std::fprintf(stderr, "cuda_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
