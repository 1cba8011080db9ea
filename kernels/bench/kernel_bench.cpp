// kernel_bench: throughput sanity check of the CPU kernels (not a test).
//
//   kernel_bench [--threads N] [--level auto|scalar|avx2] [--n-in K] [--n-out N]
//                [--rows R]... [--type Q4_1]... [--attn-kv N]...
//
// Prints one line per (type, rows): milliseconds per matmul and GFLOP/s
// (2 * rows * n_in * n_out flops), plus the cost of an empty parallel_for.
// Defaults: SmolLM2's FFN up-projection (576 -> 1536), Q4_1, rows 1 and 512.
// --attn-kv N adds attention with SmolLM2's geometry (9 heads, 3 KV heads,
// head size 64): a prefill batch of 512 queries at positions N-512..N-1 and
// a single decode query at N-1 (GFLOP/s count 4 * head_dim flops per
// visible (query, head, key)).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "platform/half.h"
#include "platform/thread_pool.h"

namespace {

using Clock = std::chrono::steady_clock;

// Random quant bytes with small f16 scales at every block's scale fields.
std::vector<uint8_t> random_weight(cb::DType t, int64_t n_out, int64_t n_in) {
  std::mt19937 rng(1);
  std::vector<uint8_t> data(cb::dtype_row_bytes(t, n_in) * n_out);
  for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
  const size_t bb = cb::dtype_block_bytes(t);
  const uint16_t h = cb::f32_to_f16(0.01f);
  for (size_t off = 0; off < data.size(); off += bb) {
    switch (t) {
      case cb::DType::F32:
      case cb::DType::F16:
      case cb::DType::BF16:
        std::memset(data.data() + off, 0x11, bb);  // small finite values
        break;
      case cb::DType::Q6_K:
        std::memcpy(data.data() + off + 208, &h, 2);
        break;
      case cb::DType::Q4_1:
      case cb::DType::Q4_K:
        std::memcpy(data.data() + off + 2, &h, 2);
        [[fallthrough]];
      default:
        std::memcpy(data.data() + off, &h, 2);
    }
  }
  return data;
}

bool parse_type(const std::string& s, cb::DType* t) {
  for (uint32_t id : {0u, 1u, 2u, 3u, 8u, 12u, 14u, 30u}) {
    if (s == cb::dtype_name(static_cast<cb::DType>(id))) {
      *t = static_cast<cb::DType>(id);
      return true;
    }
  }
  return false;
}

struct Timing {
  double wall = 0.0;  // seconds per call
  double cpu = 0.0;   // process CPU seconds per call (all threads, spinning included)
};

// On a loaded machine wall time says little; CPU time per call still shows
// how efficient the kernel is per core.
Timing time_per_call(const std::function<void()>& fn, double min_seconds) {
  fn();  // warm up caches and the pool
  int64_t calls = 0;
  const auto start = Clock::now();
  const std::clock_t cpu_start = std::clock();
  double elapsed = 0.0;
  do {
    fn();
    ++calls;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < min_seconds);
  const double cpu = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
  return {elapsed / static_cast<double>(calls), cpu / static_cast<double>(calls)};
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  cb::CpuKernelLevel level = cb::CpuKernelLevel::kAuto;
  int64_t n_in = 576, n_out = 1536;
  std::vector<int64_t> rows;
  std::vector<cb::DType> types;
  std::vector<int64_t> attn_kv;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (v == nullptr) {
      std::fprintf(stderr, "missing value for %s\n", a.c_str());
      return 2;
    }
    ++i;
    if (a == "--threads") {
      threads = std::atoi(v);
    } else if (a == "--n-in") {
      n_in = std::atoll(v);
    } else if (a == "--n-out") {
      n_out = std::atoll(v);
    } else if (a == "--rows") {
      rows.push_back(std::atoll(v));
    } else if (a == "--attn-kv") {
      attn_kv.push_back(std::atoll(v));
    } else if (a == "--level") {
      const std::string l = v;
      level = l == "scalar" ? cb::CpuKernelLevel::kScalar
              : l == "avx2" ? cb::CpuKernelLevel::kAvx2
                            : cb::CpuKernelLevel::kAuto;
    } else if (a == "--type") {
      cb::DType t;
      if (!parse_type(v, &t)) {
        std::fprintf(stderr, "unknown type %s\n", v);
        return 2;
      }
      types.push_back(t);
    } else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (rows.empty()) rows = {1, 512};
  if (types.empty()) types = {cb::DType::Q4_1};

  auto backend = cb::make_cpu_backend(threads, level);
  std::printf("backend %s, %d threads, W %lld x %lld\n", backend->name(), threads,
              static_cast<long long>(n_out), static_cast<long long>(n_in));
  for (cb::DType t : types) {
    const std::vector<uint8_t> wd = random_weight(t, n_out, n_in);
    const cb::WeightView w{wd.data(), t, n_in, n_out};
    for (int64_t r : rows) {
      std::vector<float> x(r * n_in, 0.5f), y(r * n_out);
      const Timing tm = time_per_call([&] { backend->matmul(w, x.data(), r, y.data()); }, 0.5);
      const double gflop = 2.0 * static_cast<double>(r * n_in * n_out) * 1e-9;
      std::printf("matmul %-5s rows %4lld: %9.3f ms  %7.2f GFLOP/s  (%7.2f GFLOP per CPU-second)\n",
                  cb::dtype_name(t), static_cast<long long>(r), tm.wall * 1e3, gflop / tm.wall,
                  gflop / tm.cpu);
    }
  }
  for (int64_t n_kv : attn_kv) {
    const int64_t n_head = 9, n_head_kv = 3, hd = 64;
    std::mt19937 rng(2);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> k(n_kv * n_head_kv * hd), v(k.size());
    for (float& e : k) e = dist(rng);
    for (float& e : v) e = dist(rng);
    for (int64_t n_q : {std::min<int64_t>(512, n_kv), int64_t{1}}) {
      std::vector<float> q(n_q * n_head * hd), out(q.size());
      for (float& e : q) e = dist(rng);
      std::vector<int32_t> pos(n_q);
      double visible = 0.0;
      for (int64_t i = 0; i < n_q; ++i) {
        pos[i] = static_cast<int32_t>(n_kv - n_q + i);
        visible += static_cast<double>(pos[i] + 1);
      }
      cb::AttentionArgs a;
      a.q = q.data();
      a.q_pos = pos.data();
      a.n_q = n_q;
      a.k = k.data();
      a.v = v.data();
      a.n_kv = n_kv;
      a.n_head = n_head;
      a.n_head_kv = n_head_kv;
      a.head_dim = hd;
      a.scale = 0.125f;
      a.out = out.data();
      const Timing tm = time_per_call([&] { backend->attention(a); }, 0.5);
      const double gflop = 4.0 * static_cast<double>(hd * n_head) * visible * 1e-9;
      std::printf(
          "attention n_kv %5lld n_q %4lld: %9.3f ms  %7.2f GFLOP/s  (%7.2f GFLOP per "
          "CPU-second)\n",
          static_cast<long long>(n_kv), static_cast<long long>(n_q), tm.wall * 1e3, gflop / tm.wall,
          gflop / tm.cpu);
    }
  }
  cb::ThreadPool pool(threads);
  const Timing tm = time_per_call([&] { pool.parallel_for(threads, [](int64_t, int) {}); }, 0.3);
  std::printf("parallel_for(%d empty tasks): %.2f us\n", threads, tm.wall * 1e6);
  return 0;
}
