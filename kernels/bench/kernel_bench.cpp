// kernel_bench: throughput sanity check of the CPU kernels (not a test).
//
//   kernel_bench [--threads N] [--level auto|scalar|avx2|avx2-vnni|avx512|neon|neon-dotprod]
//   [--n-in K] [--n-out N]
//                [--rows R]... [--type Q4_1]... [--attn-kv N]...
//
// Prints one line per (type, rows): milliseconds per matmul and GFLOP/s
// (2 * rows * n_in * n_out flops), plus the cost of an empty parallel_for.
// Defaults: SmolLM2's FFN up-projection (576 -> 1536), Q4_1, rows 1 and 512.
// --attn-kv N adds attention with SmolLM2's geometry (9 heads, 3 KV heads,
// head size 64): a prefill batch of 512 queries at positions N-512..N-1 and
// a single decode query at N-1 (GFLOP/s count 4 * head_dim flops per
// visible (query, head, key)).
// --bandwidth MB adds the memory read bandwidth over a buffer of MB
// megabytes (make it far larger than the last-level cache): what decode's
// GEMVs, which read every weight byte once per token, can reach at most.
// --peak 1 adds the machine's arithmetic peak on the same threads (x86-64
// with AVX2+FMA only): f32 FMA (GFLOP/s) and int8 multiply-add through
// VPMADDUBSW/VPMADDWD (GOP/s, 2 ops per int8 product), from register-only
// loops with enough independent chains to fill the pipelines.  The GEMM and
// model-level figures can then be quoted as a fraction of what the cores can
// do at all.
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

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/backend.h"
#include "platform/cpu_features.h"
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
  for (uint32_t id = 0; id < 64; ++id) {
    if (cb::dtype_supported(id) && s == cb::dtype_name(static_cast<cb::DType>(id))) {
      *t = static_cast<cb::DType>(id);
      return true;
    }
  }
  return false;
}

#if defined(__x86_64__)
// Register-only loops.  Named variables, not arrays, so every accumulator
// lives in a register; the empty asm statements make the loop-invariant
// operands opaque so the compiler cannot hoist the multiplies out of the
// loop.  Returns the flops (or int8 ops) done.
__attribute__((target("avx2,fma"))) double fma_loop(int64_t iters) {
  // 10 independent chains hide the FMA latency (4-5 cycles) at 2 per cycle.
  __m256 c0 = _mm256_set1_ps(0.0f), c1 = _mm256_set1_ps(1.0f), c2 = _mm256_set1_ps(2.0f),
         c3 = _mm256_set1_ps(3.0f), c4 = _mm256_set1_ps(4.0f), c5 = _mm256_set1_ps(5.0f),
         c6 = _mm256_set1_ps(6.0f), c7 = _mm256_set1_ps(7.0f), c8 = _mm256_set1_ps(8.0f),
         c9 = _mm256_set1_ps(9.0f);
  __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
  for (int64_t i = 0; i < iters; ++i) {
    __asm__("" : "+x"(a), "+x"(b));
    c0 = _mm256_fmadd_ps(c0, a, b);
    c1 = _mm256_fmadd_ps(c1, a, b);
    c2 = _mm256_fmadd_ps(c2, a, b);
    c3 = _mm256_fmadd_ps(c3, a, b);
    c4 = _mm256_fmadd_ps(c4, a, b);
    c5 = _mm256_fmadd_ps(c5, a, b);
    c6 = _mm256_fmadd_ps(c6, a, b);
    c7 = _mm256_fmadd_ps(c7, a, b);
    c8 = _mm256_fmadd_ps(c8, a, b);
    c9 = _mm256_fmadd_ps(c9, a, b);
  }
  const __m256 s =
      _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                                  _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7))),
                    _mm256_add_ps(c8, c9));
  volatile float sink = _mm256_cvtss_f32(s);
  (void)sink;
  return static_cast<double>(iters) * 10 * 8 * 2;
}

// The int8 step of the decode GEMV: VPMADDUBSW (32 products, pairs summed),
// VPMADDWD (pairs again, int32), VPADDD; 6 independent chains.
__attribute__((target("avx2"))) double int8_loop(int64_t iters) {
  __m256i c0 = _mm256_set1_epi32(0), c1 = _mm256_set1_epi32(1), c2 = _mm256_set1_epi32(2),
          c3 = _mm256_set1_epi32(3), c4 = _mm256_set1_epi32(4), c5 = _mm256_set1_epi32(5);
  __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2);
  const __m256i one = _mm256_set1_epi16(1);
  // A macro, not a lambda: a lambda would not inherit the target attribute.
#define CB_INT8_STEP(c)           \
  __asm__("" : "+x"(a), "+x"(b)); \
  c = _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), one))
  for (int64_t i = 0; i < iters; ++i) {
    CB_INT8_STEP(c0);
    CB_INT8_STEP(c1);
    CB_INT8_STEP(c2);
    CB_INT8_STEP(c3);
    CB_INT8_STEP(c4);
    CB_INT8_STEP(c5);
  }
#undef CB_INT8_STEP
  const __m256i s =
      _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3)),
                       _mm256_add_epi32(c4, c5));
  volatile int sink = _mm256_cvtsi256_si32(s);
  (void)sink;
  return static_cast<double>(iters) * 6 * 32 * 2;
}

// Sums the bytes of [p, p + n) 32 at a time (n a multiple of 32): a read
// stream as a decode GEMV does, with little arithmetic per byte.
__attribute__((target("avx2"))) uint64_t read_stream(const uint8_t* p, size_t n) {
  __m256i acc = _mm256_setzero_si256();
  for (size_t i = 0; i < n; i += 32)
    acc = _mm256_add_epi64(
        acc, _mm256_sad_epu8(_mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)),
                             _mm256_setzero_si256()));
  return static_cast<uint64_t>(_mm256_extract_epi64(acc, 0));
}
#endif

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
  bool peak = false;
  int64_t bandwidth_mb = 0;
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
    } else if (a == "--peak") {
      peak = std::atoi(v) != 0;
    } else if (a == "--bandwidth") {
      bandwidth_mb = std::atoll(v);
    } else if (a == "--attn-kv") {
      attn_kv.push_back(std::atoll(v));
    } else if (a == "--level") {
      if (!cb::parse_cpu_kernel_level(v, &level)) {
        std::fprintf(stderr, "unknown kernel level %s\n", v);
        return 2;
      }
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
      // matmul_q8: decode's int8 GEMV (a few rows), or prefill's int8 GEMM
      // where the level has one (else the f32 GEMM again).  A GEMV reads
      // each weight byte once, so its weight bytes per second say how close
      // it is to memory bandwidth.
      const Timing tq = time_per_call([&] { backend->matmul_q8(w, x.data(), r, y.data()); }, 0.5);
      std::printf(
          "matmul_q8 %-5s rows %4lld: %6.3f ms  %7.2f GFLOP/s  (%7.2f GFLOP per CPU-second)  "
          "%6.2f GB/s of weights\n",
          cb::dtype_name(t), static_cast<long long>(r), tq.wall * 1e3, gflop / tq.wall,
          gflop / tq.cpu, static_cast<double>(wd.size()) * 1e-9 / tq.wall);
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
#if defined(__x86_64__)
  if (peak && cb::cpu_features().avx2 && cb::cpu_features().fma) {
    constexpr int64_t kIters = 20 * 1000 * 1000;
    for (int kind = 0; kind < 2; ++kind) {
      // Median of 5 so that a descheduled thread does not set the figure.
      // Also per thread-CPU-second, summed over the threads: what the cores
      // deliver while they run this process, i.e. the peak of an
      // unshared machine (wall rates drop when other jobs take the cores).
      std::vector<double> rates, cpu_rates;
      for (int rep = 0; rep < 5; ++rep) {
        std::vector<double> done(static_cast<size_t>(threads), 0.0);
        std::vector<double> cpu_rate(static_cast<size_t>(threads), 0.0);
        const auto t0 = Clock::now();
        pool.parallel_for(threads, [&](int64_t t, int) {
          timespec c0{}, c1{};
          clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
          const double d = kind == 0 ? fma_loop(kIters) : int8_loop(kIters);
          clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
          const double cpu = static_cast<double>(c1.tv_sec - c0.tv_sec) +
                             1e-9 * static_cast<double>(c1.tv_nsec - c0.tv_nsec);
          done[static_cast<size_t>(t)] = d;
          cpu_rate[static_cast<size_t>(t)] = d / cpu;
        });
        const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
        double total = 0.0, total_cpu_rate = 0.0;
        for (int t = 0; t < threads; ++t) {
          total += done[static_cast<size_t>(t)];
          total_cpu_rate += cpu_rate[static_cast<size_t>(t)];
        }
        rates.push_back(total / sec * 1e-9);
        cpu_rates.push_back(total_cpu_rate * 1e-9);
      }
      std::sort(rates.begin(), rates.end());
      std::sort(cpu_rates.begin(), cpu_rates.end());
      const char* unit = kind == 0 ? "GFLOP/s" : "GOP/s";
      std::printf(
          "peak %s, %d threads: %.1f %s wall, %.1f %s per thread-CPU-second x %d "
          "(median of 5)\n",
          kind == 0 ? "f32 FMA" : "int8 VPMADDUBSW", threads, rates[2], unit, cpu_rates[2], unit,
          threads);
    }
  }
#endif
#if defined(__x86_64__)
  if (bandwidth_mb > 0 && cb::cpu_features().avx2) {
    // Memory read bandwidth on the same threads: a buffer far beyond the
    // caches, each thread reading its share; the median of 5 passes.
    const size_t bytes = static_cast<size_t>(bandwidth_mb) << 20;
    uint8_t* buf = static_cast<uint8_t*>(std::aligned_alloc(64, bytes));
    if (buf == nullptr) {
      std::fprintf(stderr, "cannot allocate %lld MB\n", static_cast<long long>(bandwidth_mb));
      return 1;
    }
    std::memset(buf, 1, bytes);
    const size_t share = bytes / static_cast<size_t>(threads) / 32 * 32;
    std::vector<double> rates;
    uint64_t total = 0;
    for (int rep = 0; rep < 5; ++rep) {
      std::vector<uint64_t> sums(static_cast<size_t>(threads));
      const auto t0 = Clock::now();
      pool.parallel_for(threads, [&](int64_t t, int) {
        sums[static_cast<size_t>(t)] = read_stream(buf + static_cast<size_t>(t) * share, share);
      });
      const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
      for (uint64_t v : sums) total += v;
      rates.push_back(static_cast<double>(share * static_cast<size_t>(threads)) / sec * 1e-9);
    }
    std::free(buf);
    std::sort(rates.begin(), rates.end());
    std::printf(
        "memory read bandwidth, %d threads, %lld MB: %.1f GB/s (median of 5; checksum %llu)\n",
        threads, static_cast<long long>(bandwidth_mb), rates[2],
        static_cast<unsigned long long>(total % 1000));
  }
#endif
  const Timing tm = time_per_call([&] { pool.parallel_for(threads, [](int64_t, int) {}); }, 0.3);
  std::printf("parallel_for(%d empty tasks): %.2f us\n", threads, tm.wall * 1e6);
  return 0;
}
