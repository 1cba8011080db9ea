// The CPU backend: validates arguments, splits each op over the thread pool
// and runs the AVX2 kernels (x86-64), the NEON kernels (AArch64) or the
// scalar reference kernels on each slice.  The kernel level is fixed when
// the backend is created.
//
// Numerics (every level): matmul keeps activations f32 and all accumulation
// is f32, so prefill logits track a float64 reference to a relative L2 of
// 1e-3 (see ops_avx2.h, ops_neon.h); only matmul_q8, which decode asks for,
// quantizes activations to int8 (see Backend::matmul_q8).

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/ops_avx2.h"
#include "kernels/cpu/ops_avx512.h"
#include "kernels/cpu/ops_neon.h"
#include "kernels/cpu/reference_ops.h"
#include "kernels/cpu/rope_table.h"
#include "platform/aligned_memory.h"
#include "platform/cpu_features.h"
#include "platform/error.h"
#include "platform/half.h"
#include "platform/thread_pool.h"

#if defined(__x86_64__) || defined(_M_X64)
#define CB_HAVE_AVX2_KERNELS 1
#define CB_AVX2_KERNEL(f) f
#else
#define CB_HAVE_AVX2_KERNELS 0
#define CB_AVX2_KERNEL(f) nullptr
#endif
#if defined(__aarch64__)
#define CB_HAVE_NEON_KERNELS 1
#define CB_NEON_KERNEL(f) f
#else
#define CB_HAVE_NEON_KERNELS 0
#define CB_NEON_KERNEL(f) nullptr
#endif

namespace cb {
namespace {

enum class Level { kScalar, kAvx2, kAvx2Vnni, kAvx512, kNeon, kNeonDotprod };

bool avx2_usable() {
  const CpuFeatures& f = cpu_features();
  return CB_HAVE_AVX2_KERNELS && f.avx2 && f.fma && f.f16c;
}

bool avx2_vnni_usable() {
  return avx2_usable() && cpu_features().avx_vnni;
}

bool avx512_usable() {
  const CpuFeatures& f = cpu_features();
  return avx2_usable() && f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni;
}

bool neon_usable() {
  return CB_HAVE_NEON_KERNELS && cpu_features().neon;
}

bool neon_dotprod_usable() {
  return neon_usable() && cpu_features().dotprod;
}

// A level asked for by name.
Level resolve_named(CpuKernelLevel level) {
  switch (level) {
    case CpuKernelLevel::kScalar:
      return Level::kScalar;
    case CpuKernelLevel::kAvx2:
      if (!avx2_usable()) {
        fail(ErrorCode::kUnsupported,
             "AVX2 kernels requested, but this CPU or build lacks "
             "AVX2+FMA+F16C");
      }
      return Level::kAvx2;
    case CpuKernelLevel::kAvx2Vnni:
      if (!avx2_vnni_usable()) {
        fail(ErrorCode::kUnsupported,
             "AVX-VNNI kernels requested, but this CPU or build lacks AVX-VNNI (or "
             "AVX2+FMA+F16C)");
      }
      return Level::kAvx2Vnni;
    case CpuKernelLevel::kAvx512:
      if (!avx512_usable()) {
        fail(ErrorCode::kUnsupported,
             "AVX-512 kernels requested, but this CPU or build lacks AVX-512 F, BW, VL and "
             "VNNI (or AVX2+FMA+F16C)");
      }
      return Level::kAvx512;
    case CpuKernelLevel::kNeon:
      if (!neon_usable()) {
        fail(ErrorCode::kUnsupported,
             "NEON kernels requested, but this is not an AArch64 CPU or build");
      }
      return Level::kNeon;
    case CpuKernelLevel::kNeonDotprod:
      if (!neon_dotprod_usable()) {
        fail(ErrorCode::kUnsupported,
             "NEON dot-product kernels requested, but this is not an AArch64 CPU or build, or "
             "the CPU lacks the dot-product extension (SDOT)");
      }
      return Level::kNeonDotprod;
    case CpuKernelLevel::kAuto:
      break;
  }
  fail(ErrorCode::kInternal, "resolve_named(kAuto)");
}

// kAuto: the level CB_CPU_KERNELS names where it is set (to see how the
// runtime does on a CPU with fewer features, or to rule a level's kernels
// out), with the errors of asking for that level; else the best this CPU
// and build support.
Level resolve_auto() {
  const char* env = std::getenv("CB_CPU_KERNELS");
  CpuKernelLevel level = CpuKernelLevel::kAuto;
  if (env != nullptr && *env != '\0') {
    if (!parse_cpu_kernel_level(env, &level))
      fail(ErrorCode::kInvalidArgument, std::string("CB_CPU_KERNELS=") + env +
                                            " is not a kernel level (auto, scalar, avx2, "
                                            "avx2-vnni, avx512, neon or neon-dotprod)");
    if (level != CpuKernelLevel::kAuto) {
      try {
        return resolve_named(level);
      } catch (const Error& e) {
        fail(e.code(), std::string("CB_CPU_KERNELS=") + env + ": " + e.what());
      }
    }
  }
  if (avx512_usable()) return Level::kAvx512;
  if (avx2_vnni_usable()) return Level::kAvx2Vnni;
  if (avx2_usable()) return Level::kAvx2;
  if (neon_dotprod_usable()) return Level::kNeonDotprod;
  if (neon_usable()) return Level::kNeon;
  return Level::kScalar;
}

Level resolve(CpuKernelLevel level) {
  return level == CpuKernelLevel::kAuto ? resolve_auto() : resolve_named(level);
}

// Below this many multiply-adds (or element operations) a task is not worth
// waking another thread for: a dispatch costs around a microsecond.
constexpr int64_t kMinWorkPerTask = 32 * 1024;

// A matmul is cut into up to this many slices per thread.  The pool hands
// slices out dynamically, so when a thread is descheduled (a busy device,
// more runnable threads than cores) the others take over its share instead
// of waiting for one big slice; slices are whole 16-column panels, so the
// extra cost is a few atomic increments.
constexpr int64_t kMatmulTasksPerThread = 4;

// Rows (query x head) of one attention task: with SmolLM2's 3 heads per KV
// head, 10 queries x 3 heads.
constexpr int64_t kAttentionTileRows = 32;
// The keys of as many KV heads as fit in this are transposed at a time for
// the attention tiles that read them.
constexpr size_t kTransposedKeyBytes = size_t{4} << 20;
// Beyond this for one KV head the tiles transpose the keys they read
// themselves (a very long context: the copy would rival a layer's keys).
constexpr size_t kMaxTransposedKeyBytes = size_t{64} << 20;

// matmul_q8 takes the int8 GEMV for at most this many activation rows (the
// weights are re-read per row; a speculative or multi-sequence decode step
// is a few rows) and hands larger batches to the exact GEMM.
constexpr int64_t kMaxQ8Rows = 4;

void check(bool ok, const char* what) {
  if (!ok) fail(ErrorCode::kInvalidArgument, std::string("cpu backend: ") + what);
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(int n_threads, Level level) : pool_(n_threads), level_(level) {}

  const char* name() const override {
    switch (level_) {
      case Level::kAvx2:
        return "cpu-avx2";
      case Level::kAvx2Vnni:
        return "cpu-avx2-vnni";
      case Level::kAvx512:
        return "cpu-avx512";
      case Level::kNeon:
        return "cpu-neon";
      case Level::kNeonDotprod:
        return "cpu-neon-dotprod";
      case Level::kScalar:
        break;
    }
    return "cpu-scalar";
  }

  void* alloc_buffer(size_t bytes) override {
    void* p = allocate_aligned(bytes, 64);
    if (p == nullptr) {
      fail(ErrorCode::kOutOfMemory, "cannot allocate " + std::to_string(bytes) + " bytes");
    }
    return p;
  }
  void free_buffer(void* p) override { free_aligned(p); }
  WeightView prepare_weight(const WeightView& host) override { return host; }

  void matmul(const WeightView& w, const float* x, int64_t n_rows, float* y) override {
    check(n_rows >= 0 && w.n_in >= 0 && w.n_out >= 0, "matmul: negative size");
    check(w.n_in % dtype_block_elems(w.type) == 0, "matmul: n_in is not a whole number of blocks");
    if (n_rows == 0 || w.n_out == 0) return;
    // Split by output columns (weight rows): each thread streams its own
    // share of the weight, the dominant memory traffic.  Slices of 16
    // columns match the GEMM's panels and keep the threads' outputs in
    // separate cache lines.
    const int64_t work = n_rows * w.n_out * w.n_in;
    split(w.n_out, tasks_for(work, kMatmulTasksPerThread), 16, [&](int64_t o0, int64_t o1) {
#if CB_HAVE_AVX2_KERNELS
      if (x86()) return avx2::matmul(w, x, n_rows, y, o0, o1);
#endif
#if CB_HAVE_NEON_KERNELS
      if (arm()) return neon::matmul(w, x, n_rows, y, o0, o1);
#endif
      ref::matmul(w, x, n_rows, y, o0, o1);
    });
  }

  void matmul_q8(const WeightView& w, const float* x, int64_t n_rows, float* y) override {
    // Beyond a few rows the GEMV re-reads the weights per row: the int8
    // GEMM where there is one for the type (avx512, avx2-vnni, avx2,
    // neon-dotprod), else the exact GEMM, which is compute-bound rather
    // than bound by decoding weights.
    const bool gemm = n_rows > kMaxQ8Rows;
    if (gemm && !has_int8_gemm(w.type)) return matmul(w, x, n_rows, y);
    if (!gemm && !ref::gemv_q8_supported(w.type)) return matmul(w, x, n_rows, y);
    check(n_rows >= 0 && w.n_in >= 0 && w.n_out >= 0, "matmul: negative size");
    check(w.n_in % dtype_block_elems(w.type) == 0, "matmul: n_in is not a whole number of blocks");
    if (n_rows == 0 || w.n_out == 0) return;
    // Quantize the rows once (split over the threads when there are many),
    // then split the weight by output columns as matmul() does.  The
    // buffers are per calling thread so that sessions on different threads
    // never share them; the tasks get plain pointers (their own
    // thread_local vectors are other vectors).
    const int64_t nb = w.n_in / 32;
    thread_local std::vector<int8_t> xqs;
    thread_local std::vector<float> xd, xs, xs16;
    if (static_cast<int64_t>(xd.size()) < n_rows * nb) {
      xqs.resize(static_cast<size_t>(n_rows * w.n_in));
      xd.resize(static_cast<size_t>(n_rows * nb));
      xs.resize(static_cast<size_t>(n_rows * nb));
    }
    int8_t* qs = xqs.data();
    float* d = xd.data();
    float* s = xs.data();
    float* s16 = nullptr;
    const bool half_sums = gemm && int8_gemm_uses_half_sums(w.type);
    if (half_sums) {
      xs16.resize(std::max(xs16.size(), static_cast<size_t>(2 * n_rows * nb)));
      s16 = xs16.data();
    }
    split(n_rows, tasks_for(n_rows * w.n_in), 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        quantize_q8a(x + r * w.n_in, w.n_in, qs + r * w.n_in, d + r * nb, s + r * nb);
        if (s16 != nullptr) half_block_sums(qs + r * w.n_in, d + r * nb, nb, s16 + 2 * r * nb);
      }
    });
    // Counted like matmul's multiply-adds: an int8 one costs ~0.6 of an f32
    // one, still far more than a dispatch at these sizes, so every layer
    // matrix of a small model is split over the threads.
    const int64_t work = n_rows * w.n_out * w.n_in;
    split(w.n_out, tasks_for(work, kMatmulTasksPerThread), 16, [&](int64_t o0, int64_t o1) {
#if CB_HAVE_AVX2_KERNELS
      if (gemm && level_ == Level::kAvx512) {
        return avx512::gemm_q8(w, Q8Row{qs, d, s}, s16, n_rows, y, o0, o1);
      }
      if (gemm && level_ == Level::kAvx2Vnni) {
        return avxvnni::gemm_q8(w, Q8Row{qs, d, s}, s16, n_rows, y, o0, o1);
      }
      if (gemm) return avx2::gemm_q8(w, Q8Row{qs, d, s}, s16, n_rows, y, o0, o1);
#endif
#if CB_HAVE_NEON_KERNELS
      if (gemm) return neon::gemm_q8(w, Q8Row{qs, d, s}, s16, n_rows, y, o0, o1);
#endif
      for (int64_t r = 0; r < n_rows; ++r) {
        const Q8Row xr{qs + r * w.n_in, d + r * nb, s + r * nb};
        float* yr = y + r * w.n_out;
#if CB_HAVE_AVX2_KERNELS
        if (level_ == Level::kAvx512) {
          avx512::gemv_q8(w, xr, yr, o0, o1);
          continue;
        }
        if (x86()) {
          avx2::gemv_q8(w, xr, yr, o0, o1);
          continue;
        }
#endif
#if CB_HAVE_NEON_KERNELS
        if (level_ == Level::kNeonDotprod) {
          neon::gemv_q8_dotprod(w, xr, yr, o0, o1);
          continue;
        }
        if (level_ == Level::kNeon) {
          neon::gemv_q8(w, xr, yr, o0, o1);
          continue;
        }
#endif
        ref::gemv_q8(w, xr, yr, o0, o1);
      }
    });
  }

  void get_rows(const WeightView& w, const int32_t* ids, int64_t n, float* out) override {
    check(n >= 0, "get_rows: negative count");
    split(n, tasks_for(n * w.n_in), 1,
          [&](int64_t r0, int64_t r1) { ref::get_rows(w, ids + r0, r1 - r0, out + r0 * w.n_in); });
  }

  void rmsnorm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps,
               float* out) override {
    check(n_rows >= 0 && dim > 0, "rmsnorm: bad shape");
    split(n_rows, tasks_for(n_rows * dim), 1, [&](int64_t r0, int64_t r1) {
#if CB_HAVE_AVX2_KERNELS
      if (x86()) return avx2::rmsnorm(x + r0 * dim, weight, r1 - r0, dim, eps, out + r0 * dim);
#endif
#if CB_HAVE_NEON_KERNELS
      if (arm()) return neon::rmsnorm(x + r0 * dim, weight, r1 - r0, dim, eps, out + r0 * dim);
#endif
      ref::rmsnorm(x + r0 * dim, weight, r1 - r0, dim, eps, out + r0 * dim);
    });
  }

  void rope(float* x, const int32_t* pos, int64_t n_rows, int64_t n_heads, int64_t head_dim,
            int64_t rot_dim, float freq_base, const float* freq_factors) override {
    check(n_rows >= 0 && n_heads > 0 && head_dim > 0, "rope: bad shape");
    check(rot_dim >= 0 && rot_dim <= head_dim && rot_dim % 2 == 0,
          "rope: rot_dim must be even and at most head_dim");
    if (n_rows == 0) return;
    const int64_t row = n_heads * head_dim;
    // The table covers |pos|: a negative position undoes a rotation.
    const auto [lo, hi] = std::minmax_element(pos, pos + n_rows);
    const int32_t max_pos = std::max(*hi, *lo == INT32_MIN ? INT32_MAX : -*lo);
    const auto angles = rope_table_.covering(max_pos, rot_dim, freq_base, freq_factors);
    split(n_rows, tasks_for(n_rows * row), 1, [&](int64_t r0, int64_t r1) {
      RopeTable::rope(x + r0 * row, pos + r0, r1 - r0, n_heads, head_dim, rot_dim, *angles,
                      freq_base, freq_factors);
    });
  }

  void attention(const AttentionArgs& a) override {
    check(a.n_q >= 0 && a.n_kv >= 0 && a.head_dim > 0, "attention: bad shape");
    check(a.kv_type == DType::F32 || a.kv_type == DType::F16, "attention: K/V must be F32 or F16");
    check(a.n_head > 0 && a.n_head_kv > 0 && a.n_head % a.n_head_kv == 0,
          "attention: n_head must be a multiple of n_head_kv");
    if (level_ != Level::kScalar) {
      // Tiles of (a block of query rows) x (the query heads of one KV
      // head), so each K/V block is loaded once for the whole tile.  The
      // tiling depends on the shape only, never on the thread count.  Tasks
      // go from the last query block to the first: with ascending positions
      // the longest come first, and the pool's dynamic hand-out balances
      // the rest.
      const int64_t group = a.n_head / a.n_head_kv;
      const int64_t q_block = std::max<int64_t>(1, kAttentionTileRows / group);
      const int64_t n_qb = (a.n_q + q_block - 1) / q_block;
#if CB_HAVE_AVX2_KERNELS
      if (x86() && attention_transposed(a, n_qb, q_block, group)) return;
#endif
      pool_.parallel_for(n_qb * a.n_head_kv, [&](int64_t task, int) {
        const int64_t qb = n_qb - 1 - task / a.n_head_kv, g = task % a.n_head_kv;
        const int64_t q0 = qb * q_block, q1 = std::min(a.n_q, (qb + 1) * q_block);
#if CB_HAVE_AVX2_KERNELS
        if (x86()) avx2::attention_tile(a, q0, q1, g * group, (g + 1) * group);
#endif
#if CB_HAVE_NEON_KERNELS
        if (arm()) neon::attention_tile(a, q0, q1, g * group, (g + 1) * group);
#endif
      });
      return;
    }
    // One task per (query row, head); rows at later positions see more keys,
    // and the pool's dynamic hand-out balances that.
    pool_.parallel_for(a.n_q * a.n_head, [&](int64_t task, int) {
      ref::attention_one(a, task / a.n_head, task % a.n_head);
    });
  }

  void attention_contributions(const AttentionArgs& a, float* out) override {
    check(a.n_q >= 0 && a.n_kv >= 0 && a.head_dim > 0, "attention_contributions: bad shape");
    check(a.kv_type == DType::F32 || a.kv_type == DType::F16,
          "attention_contributions: K/V must be F32 or F16");
    check(a.n_head > 0 && a.n_head_kv > 0 && a.n_head % a.n_head_kv == 0,
          "attention_contributions: n_head must be a multiple of n_head_kv");
    if (a.n_q == 0 || a.n_kv == 0) return;
    // One task per head, each summing its rows' weights into its own slice
    // of `partial`; the slices are weighted and added in head order, so the
    // result does not depend on the thread count.
    const size_t n_kv = static_cast<size_t>(a.n_kv);
    std::vector<float> partial(static_cast<size_t>(a.n_head) * n_kv, 0.0f);
    pool_.parallel_for(a.n_head, [&](int64_t h, int) {
      float* sum = partial.data() + static_cast<size_t>(h) * n_kv;
#if CB_HAVE_AVX2_KERNELS
      if (x86()) return avx2::attention_weight_sums_head(a, h, sum);
#endif
      std::vector<float> w(n_kv);
      for (int64_t qi = 0; qi < a.n_q; ++qi) {
        const int64_t n = ref::attention_weights_one(a, qi, h, w.data());
        for (int64_t j = 0; j < n; ++j) sum[j] += w[j];
      }
    });
    const int64_t group = a.n_head / a.n_head_kv, kv_stride = a.n_head_kv * a.head_dim;
    const bool f16 = a.kv_type == DType::F16;
    for (int64_t g = 0; g < a.n_head_kv; ++g) {
      for (size_t j = 0; j < n_kv; ++j) {
        const int64_t v = static_cast<int64_t>(j) * kv_stride + g * a.head_dim;
        float norm = 0.0f;
        for (int64_t d = 0; d < a.head_dim; ++d) {
          const float x = f16 ? f16_to_f32(static_cast<const uint16_t*>(a.v)[v + d])
                              : static_cast<const float*>(a.v)[v + d];
          norm += x * x;
        }
        norm = std::sqrt(norm);
        for (int64_t h = g * group; h < (g + 1) * group; ++h)
          out[j] += partial[static_cast<size_t>(h) * n_kv + j] * norm;
      }
    }
  }

  void silu_mul(const float* gate, const float* up, int64_t n, float* out) override {
    gated(gate, up, n, out, CB_AVX2_KERNEL(avx2::silu_mul), CB_NEON_KERNEL(neon::silu_mul),
          ref::silu_mul);
  }

  void gelu_mul(const float* gate, const float* up, int64_t n, float* out) override {
    gated(gate, up, n, out, CB_AVX2_KERNEL(avx2::gelu_mul), CB_NEON_KERNEL(neon::gelu_mul),
          ref::gelu_mul);
  }

  void scale(float* x, int64_t n, float s) override {
    split(n, tasks_for(n), 8, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) x[i] *= s;
    });
  }

  void add(const float* a, const float* b, int64_t n, float* out) override {
    split(n, tasks_for(n), 8, [&](int64_t i0, int64_t i1) {
#if CB_HAVE_AVX2_KERNELS
      if (x86()) return avx2::add(a + i0, b + i0, i1 - i0, out + i0);
#endif
#if CB_HAVE_NEON_KERNELS
      if (arm()) return neon::add(a + i0, b + i0, i1 - i0, out + i0);
#endif
      ref::add(a + i0, b + i0, i1 - i0, out + i0);
    });
  }

  void add_bias(float* x, const float* bias, int64_t n_rows, int64_t dim) override {
    check(n_rows >= 0 && dim > 0, "add_bias: bad shape");
    split(n_rows, tasks_for(n_rows * dim), 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        float* row = x + r * dim;
#if CB_HAVE_AVX2_KERNELS
        if (x86()) {
          avx2::add(row, bias, dim, row);
          continue;
        }
#endif
#if CB_HAVE_NEON_KERNELS
        if (arm()) {
          neon::add(row, bias, dim, row);
          continue;
        }
#endif
        ref::add(row, bias, dim, row);
      }
    });
  }

  void gather_rows(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                   float* dst) override {
    ref::gather_rows(src, row_len, idx, n, dst);
  }

  void segment_means(float* x, int64_t row_len, const int32_t* seg, int64_t n_seg,
                     float* out) override {
    check(row_len >= 0, "segment_means: negative size");
    check_segments(seg, n_seg);
    if (n_seg == 0) return;
    split(n_seg, tasks_for((seg[n_seg] - seg[0]) * row_len), 1, [&](int64_t s0, int64_t s1) {
      ref::segment_means(x, row_len, seg + s0, s1 - s0, out + s0 * row_len);
    });
  }

  void scatter_rows(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                    float* dst) override {
    ref::scatter_rows(src, row_len, idx, n, dst);
  }

  void scatter_rows_f16(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                        uint16_t* dst) override {
    check(n >= 0 && row_len >= 0, "scatter_rows_f16: negative size");
    split(n, tasks_for(8 * n * row_len), 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        convert_row(src + r * row_len, row_len, dst + static_cast<int64_t>(idx[r]) * row_len);
    });
  }

  void gather_rows_f16(const uint16_t* src, int64_t row_len, const int32_t* idx, int64_t n,
                       float* dst) override {
    check(n >= 0 && row_len >= 0, "gather_rows_f16: negative size");
    split(n, tasks_for(8 * n * row_len), 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        convert_row(src + static_cast<int64_t>(idx[r]) * row_len, row_len, dst + r * row_len);
    });
  }

  void row_sq_diff(const float* a, const float* b, int64_t n_rows, int64_t row_len,
                   float* out) override {
    check(n_rows >= 0 && row_len >= 0, "row_sq_diff: negative size");
    split(n_rows, tasks_for(n_rows * row_len), 1, [&](int64_t r0, int64_t r1) {
      ref::row_sq_diff(a + r0 * row_len, b + r0 * row_len, r1 - r0, row_len, out + r0);
    });
  }

 private:
#if CB_HAVE_AVX2_KERNELS
  // attention() with each KV head's keys transposed once for all its query
  // blocks (avx2::transpose_key_blocks), a few heads at a time so that the
  // copy stays within kTransposedKeyBytes: transposing the whole context at
  // once would hold 2 KiB per token for a Llama 3.2 1B.  False (nothing
  // done) for one query block, which transposes as it reads, or when one
  // head's copy would pass kMaxTransposedKeyBytes.
  bool attention_transposed(const AttentionArgs& a, int64_t n_qb, int64_t q_block, int64_t group) {
    if (n_qb < 2 || a.head_dim > 256 || a.n_kv == 0) return false;
    const int64_t n_blocks = avx2::attention_key_blocks(a.n_kv);
    const size_t head_floats =
        static_cast<size_t>(n_blocks * a.head_dim) * static_cast<size_t>(avx2::kAttentionKeyBlock);
    if (head_floats * sizeof(float) > kMaxTransposedKeyBytes) return false;
    const int64_t heads = std::clamp<int64_t>(
        static_cast<int64_t>(kTransposedKeyBytes / (head_floats * sizeof(float))), 1, a.n_head_kv);
    // One buffer per calling thread (sessions on different threads never
    // share it), sized for the budget at once so that a growing context
    // does not reallocate it on every batch.
    struct Buffer {
      float* data = nullptr;
      size_t floats = 0;
      ~Buffer() { free_aligned(data); }
    };
    thread_local Buffer buffer;
    const size_t floats =
        std::max(static_cast<size_t>(heads) * head_floats, kTransposedKeyBytes / sizeof(float));
    if (buffer.floats < floats) {
      free_aligned(buffer.data);
      buffer.floats = 0;
      buffer.data = static_cast<float*>(allocate_aligned(floats * sizeof(float), 64));
      if (buffer.data == nullptr) return false;  // the tiles transpose instead
      buffer.floats = floats;
    }
    float* const keys = buffer.data;  // the pool's threads see their own `buffer`
    constexpr int64_t kBlocksPerTask = 16;
    const int64_t tasks_per_head = (n_blocks + kBlocksPerTask - 1) / kBlocksPerTask;
    for (int64_t g0 = 0; g0 < a.n_head_kv; g0 += heads) {
      const int64_t n_g = std::min(heads, a.n_head_kv - g0);
      auto head_keys = [&](int64_t g) { return keys + (g - g0) * head_floats; };
      pool_.parallel_for(n_g * tasks_per_head, [&](int64_t task, int) {
        const int64_t g = g0 + task / tasks_per_head, b0 = task % tasks_per_head * kBlocksPerTask;
        avx2::transpose_key_blocks(a, g, b0, std::min(n_blocks, b0 + kBlocksPerTask), head_keys(g));
      });
      pool_.parallel_for(n_qb * n_g, [&](int64_t task, int) {
        const int64_t qb = n_qb - 1 - task / n_g, g = g0 + task % n_g;
        const int64_t q0 = qb * q_block, q1 = std::min(a.n_q, (qb + 1) * q_block);
        avx2::attention_tile(a, head_keys(g), q0, q1, g * group, (g + 1) * group);
      });
    }
    return true;
  }
#endif

  // One row of an F16 KV cache rounded from f32, or widened to f32, by
  // this level's kernel (every level gives the same bits).
  void convert_row(const float* src, int64_t n, uint16_t* dst) const {
#if CB_HAVE_AVX2_KERNELS
    if (x86()) return avx2::f32_to_f16_row(src, n, dst);
#endif
#if CB_HAVE_NEON_KERNELS
    if (arm()) return neon::f32_to_f16_row(src, n, dst);
#endif
    const int32_t zero = 0;
    ref::scatter_rows_f16(src, n, &zero, 1, dst);
  }
  void convert_row(const uint16_t* src, int64_t n, float* dst) const {
#if CB_HAVE_AVX2_KERNELS
    if (x86()) return avx2::f16_to_f32_row(src, n, dst);
#endif
#if CB_HAVE_NEON_KERNELS
    if (arm()) return neon::f16_to_f32_row(src, n, dst);
#endif
    const int32_t zero = 0;
    ref::gather_rows_f16(src, n, &zero, 1, dst);
  }

  int64_t tasks_for(int64_t work, int64_t per_thread = 1) const {
    return std::clamp<int64_t>(work / kMinWorkPerTask, 1, per_thread * pool_.size());
  }

  // A gated activation (silu_mul, gelu_mul) in slices, by this level's kernel
  // (null where the build has none).
  using GateKernel = void (*)(const float*, const float*, int64_t, float*);
  void gated(const float* gate, const float* up, int64_t n, float* out, GateKernel avx2_kernel,
             GateKernel neon_kernel, GateKernel ref_kernel) {
    GateKernel kernel = ref_kernel;
    if (x86() && avx2_kernel) kernel = avx2_kernel;
    if (arm() && neon_kernel) kernel = neon_kernel;
    split(n, tasks_for(8 * n), 8,
          [&](int64_t i0, int64_t i1) { kernel(gate + i0, up + i0, i1 - i0, out + i0); });
  }

  // Calls fn(begin, end) on up to n_tasks contiguous slices of [0, n), each
  // a multiple of `align` long except the last.
  template <class F>
  void split(int64_t n, int64_t n_tasks, int64_t align, F&& fn) {
    if (n <= 0) return;
    const int64_t per_task = (n + n_tasks - 1) / n_tasks;
    const int64_t chunk = (per_task + align - 1) / align * align;
    const int64_t tasks = (n + chunk - 1) / chunk;
    pool_.parallel_for(tasks, [&](int64_t t, int) { fn(t * chunk, std::min(n, (t + 1) * chunk)); });
  }

  // One activation row as Q8Row (the same bytes at every level).
  void quantize_q8a(const float* x, int64_t n, int8_t* qs, float* d, float* s) const {
#if CB_HAVE_AVX2_KERNELS
    if (x86()) return avx2::quantize_q8a(x, n, qs, d, s);
#endif
#if CB_HAVE_NEON_KERNELS
    if (arm()) return neon::quantize_q8a(x, n, qs, d, s);
#endif
    ref::quantize_q8a(x, n, qs, d, s);
  }
  // The sums of a quantized row's halves of 16 (d * the half's quants), for
  // the GEMM's types with a scale per 16.
  static void half_block_sums(const int8_t* qs, const float* d, int64_t nb, float* s16) {
    for (int64_t h = 0; h < 2 * nb; ++h) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += qs[16 * h + i];
      s16[h] = d[h / 2] * static_cast<float>(sum);
    }
  }

  // Whether matmul_q8 has an int8 GEMM for many rows of type t.
  bool has_int8_gemm(DType t) const {
#if CB_HAVE_AVX2_KERNELS
    if (level_ == Level::kAvx512) return avx512::gemm_q8_supported(t);
    if (level_ == Level::kAvx2) return avx2::gemm_q8_supported(t);
    if (level_ == Level::kAvx2Vnni) return avxvnni::gemm_q8_supported(t);
#endif
#if CB_HAVE_NEON_KERNELS
    if (level_ == Level::kNeonDotprod) return neon::gemm_q8_supported(t);
#endif
    (void)t;
    return false;
  }
  // Whether that GEMM reads the activations' sums per half block.
  bool int8_gemm_uses_half_sums(DType t) const {
#if CB_HAVE_AVX2_KERNELS
    if (x86()) return avx2::gemm_q8_uses_half_sums(t);
#endif
#if CB_HAVE_NEON_KERNELS
    if (level_ == Level::kNeonDotprod) return neon::gemm_q8_uses_half_sums(t);
#endif
    (void)t;
    return false;
  }

  // The AVX2 kernels serve every x86 level; avx512 differs only in
  // matmul_q8 (its GEMV and GEMM), avx2-vnni only in matmul_q8's GEMM.
  bool x86() const {
    return level_ == Level::kAvx2 || level_ == Level::kAvx2Vnni || level_ == Level::kAvx512;
  }
  // Likewise the NEON kernels both Arm levels; neon-dotprod differs only in
  // matmul_q8 (its GEMV and GEMM).
  bool arm() const {
    return level_ == Level::kNeon || level_ == Level::kNeonDotprod;
  }

  ThreadPool pool_;
  Level level_;
  RopeTable rope_table_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads, CpuKernelLevel level) {
  return std::make_unique<CpuBackend>(n_threads, resolve(level));
}

bool parse_cpu_kernel_level(std::string_view name, CpuKernelLevel* level) {
  static constexpr std::pair<std::string_view, CpuKernelLevel> kNames[] = {
      {"auto", CpuKernelLevel::kAuto},
      {"scalar", CpuKernelLevel::kScalar},
      {"avx2", CpuKernelLevel::kAvx2},
      {"avx2-vnni", CpuKernelLevel::kAvx2Vnni},
      {"avx512", CpuKernelLevel::kAvx512},
      {"neon", CpuKernelLevel::kNeon},
      {"neon-dotprod", CpuKernelLevel::kNeonDotprod}};
  for (const auto& [n, l] : kNames) {
    if (n == name) {
      *level = l;
      return true;
    }
  }
  return false;
}

const char* cpu_kernel_level_name() {
  switch (resolve(CpuKernelLevel::kAuto)) {
    case Level::kAvx2:
      return "avx2";
    case Level::kAvx2Vnni:
      return "avx2-vnni";
    case Level::kAvx512:
      return "avx512";
    case Level::kNeon:
      return "neon";
    case Level::kNeonDotprod:
      return "neon-dotprod";
    case Level::kScalar:
      break;
  }
  return "scalar";
}

}  // namespace cb
