// The int8 GEMV's arithmetic (kernels/cuda/cuda_gemv.cuh, gemv_k_q8_kernel)
// run on the host, where no GPU is: the lane-to-element layout of its Q4_K,
// Q6_K and 32-element block slices, the integer sums a warp's shuffles add, the per-block
// terms, and the activation quantization, against the CPU's matmul_q8
// (cb::ref::quantize_q8a and gemv_q8).  Each warp step is replayed lane by
// lane as the kernel runs it (the same functions, which are __host__
// __device__), shuffles included; what only a GPU can show (the launch, the
// shared memory, the warp sum) is Cuda.Int8GemvMatchesCpuMatmulQ8 in
// test_cuda_backend.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/reference_ops.h"
#include "kernels/cuda/cuda_gemv.cuh"
#include "platform/half.h"

namespace cb {
namespace {

// A Q8Row with its storage.
struct Q8Activations {
  std::vector<int8_t> qs;
  std::vector<float> d, s;
  explicit Q8Activations(const std::vector<float>& x)
      : qs(x.size()), d(x.size() / 32), s(x.size() / 32) {
    ref::quantize_q8a(x.data(), static_cast<int64_t>(x.size()), qs.data(), d.data(), s.data());
  }
};

// Random rows of type t (the test helpers are C++20, which this CUDA build
// does not compile): random quant bytes, the f16 scale fields set to
// magnitudes in [2^-10, 2^-3) as the other kernel tests' weights.
std::vector<uint8_t> random_weight(std::mt19937& rng, DType t, int64_t n_out, int64_t n_in) {
  std::vector<uint8_t> data(dtype_row_bytes(t, n_in) * static_cast<size_t>(n_out));
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : data) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(-10.0f, -3.0f);
  const size_t block = dtype_row_bytes(t, dtype_block_elems(t));
  // The f16 fields: d (and dmin or m) first, except Q6_K's d, last.
  const std::vector<size_t> fields = t == DType::Q6_K ? std::vector<size_t>{block - 2}
                                     : t == DType::Q4_K || t == DType::Q4_1 || t == DType::Q5_1
                                         ? std::vector<size_t>{0, 2}
                                         : std::vector<size_t>{0};
  for (size_t at = 0; at < data.size(); at += block) {
    for (size_t f : fields) {
      const uint16_t h = f32_to_f16(std::exp2(scale(rng)));
      std::memcpy(data.data() + at + f, &h, 2);
    }
  }
  return data;
}

std::vector<float> random_floats(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// One weight row's product as the kernel forms it for one warp taking every
// step: per step, each lane's sums (zero where the lane's super-block is
// past the row), the xor butterfly over kQ8Group lanes, the owners' terms
// into their lane's accumulator; then the accumulators added.  |terms| is
// the scale of f32 rounding: the terms' magnitudes, their parts apart.
template <class S>
float warp_row_product(const uint8_t* row, int64_t n_in, const Q8Activations& x, double* terms) {
  const int64_t n_sb = n_in / S::kUnit, n_steps = (n_sb + S::kPerStep - 1) / S::kPerStep;
  const int per_sb = 32 / S::kPerStep;
  float acc[32] = {};
  *terms = 0.0;
  for (int64_t step = 0; step < n_steps; ++step) {
    S slice[32];
    int v[32][S::kQ8Sums] = {};
    for (int lane = 0; lane < 32; ++lane) {
      const int64_t b = S::kPerStep * step + lane / per_sb;
      if (b >= n_sb) continue;
      slice[lane].load(row, b, lane);
      slice[lane].q8_sums(x.qs.data() + S::kUnit * b, lane, v[lane]);
    }
    for (int t = 0; t < S::kQ8Sums; ++t) {
      for (int o = 1; o < S::kQ8Group; o <<= 1) {
        int next[32];
        for (int lane = 0; lane < 32; ++lane) next[lane] = v[lane][t] + v[lane ^ o][t];
        for (int lane = 0; lane < 32; ++lane) v[lane][t] = next[lane];
      }
    }
    for (int lane = 0; lane < 32; ++lane) {
      const int64_t b = S::kPerStep * step + lane / per_sb;
      const int own = S::q8_owned(lane);
      if (b >= n_sb || own < 0) continue;
      const int64_t blk = S::kUnit / 32 * b + S::q8_block(lane, own);
      // |terms| bounds the rounding of the sums: |term| and, for the
      // K-quants' mins, twice the min's part (q8_add with no integer sum).
      float term = 0.0f, min_part = 0.0f;
      slice[lane].q8_add(term, own, v[lane][own], x.d[static_cast<size_t>(blk)],
                         x.s[static_cast<size_t>(blk)], lane);
      slice[lane].q8_add(min_part, own, 0, x.d[static_cast<size_t>(blk)],
                         x.s[static_cast<size_t>(blk)], lane);
      *terms += std::fabs(term) + 2.0 * std::fabs(min_part);
      slice[lane].q8_add(acc[lane], own, v[lane][own], x.d[static_cast<size_t>(blk)],
                         x.s[static_cast<size_t>(blk)], lane);
    }
  }
  float sum = 0.0f;
  for (float a : acc) sum += a;
  return sum;
}

template <class S>
void expect_rows_match_cpu(DType t, uint32_t seed, std::vector<int64_t> n_ins) {
  std::mt19937 rng(seed);
  for (int64_t n_in : n_ins) {
    const int64_t n_out = 7;
    const std::vector<uint8_t> data = random_weight(rng, t, n_out, n_in);
    const WeightView w{data.data(), t, n_in, n_out};
    std::vector<float> x = random_floats(rng, n_in);
    if (n_in > 64) {
      for (int64_t i = 0; i < 32; ++i) x[static_cast<size_t>(i)] = 0.0f;  // a zero block
      x[40] = 50.0f;                                                      // an outlier
    }
    const Q8Activations q(x);
    std::vector<float> expect(static_cast<size_t>(n_out));
    ref::gemv_q8(w, Q8Row{q.qs.data(), q.d.data(), q.s.data()}, expect.data(), 0, n_out);
    const size_t row_bytes = dtype_row_bytes(t, n_in);
    for (int64_t o = 0; o < n_out; ++o) {
      double terms = 0.0;
      const float got =
          warp_row_product<S>(data.data() + static_cast<size_t>(o) * row_bytes, n_in, q, &terms);
      // The terms are gemv_q8's to the bit; only their order of addition
      // differs.  A wrong element, scale or lane shows as ~1e-2 and up.
      EXPECT_LE(std::fabs(got - expect[static_cast<size_t>(o)]), 1e-5 * terms + 1e-30)
          << dtype_name(t) << " n_in=" << n_in << " row " << o << ": " << got << " against "
          << expect[static_cast<size_t>(o)];
    }
  }
}

TEST(CudaInt8Lanes, Q4kSlicesGiveTheCpuProduct) {
  expect_rows_match_cpu<Q4kSlice>(DType::Q4_K, 1, {256, 768, 1536, 8960});
}

TEST(CudaInt8Lanes, Q6kSlicesGiveTheCpuProduct) {
  expect_rows_match_cpu<Q6kSlice>(DType::Q6_K, 2, {256, 768, 1536, 8960});
}

// The 32-element types: a lane a block, n_in not a multiple of 256 (the
// rows of SmolLM2 (576) and Qwen2.5-0.5B (896)) and steps with idle lanes.
template <DType T>
void expect_block32_rows_match_cpu(uint32_t seed) {
  SCOPED_TRACE(dtype_name(T));
  expect_rows_match_cpu<Block32Slice<T>>(T, seed, {32, 576, 896, 4864});
}

TEST(CudaInt8Lanes, Block32SlicesGiveTheCpuProduct) {
  expect_block32_rows_match_cpu<DType::Q4_0>(3);
  expect_block32_rows_match_cpu<DType::Q4_1>(4);
  expect_block32_rows_match_cpu<DType::Q5_0>(5);
  expect_block32_rows_match_cpu<DType::Q5_1>(6);
  expect_block32_rows_match_cpu<DType::Q8_0>(7);
}

// The slice's block size is the type's.
TEST(CudaInt8Lanes, Block32SlicesReadWholeBlocks) {
  EXPECT_EQ(Block32Slice<DType::Q4_0>::kBlockBytes, dtype_row_bytes(DType::Q4_0, 32));
  EXPECT_EQ(Block32Slice<DType::Q4_1>::kBlockBytes, dtype_row_bytes(DType::Q4_1, 32));
  EXPECT_EQ(Block32Slice<DType::Q5_0>::kBlockBytes, dtype_row_bytes(DType::Q5_0, 32));
  EXPECT_EQ(Block32Slice<DType::Q5_1>::kBlockBytes, dtype_row_bytes(DType::Q5_1, 32));
  EXPECT_EQ(Block32Slice<DType::Q8_0>::kBlockBytes, dtype_row_bytes(DType::Q8_0, 32));
}

// The kernel's quantization takes a block's largest magnitude from its 8
// lanes and rounds each element with q8_scales / q8_round: the bytes and
// scales of quantize_q8a, ties and a zero block included.
TEST(CudaInt8Lanes, QuantizationMatchesTheCpu) {
  std::mt19937 rng(3);
  std::vector<float> x = random_floats(rng, 256);
  for (int i = 0; i < 32; ++i) x[static_cast<size_t>(32 + i)] = 0.0f;
  // amax 127 makes id 1: x.5 values are ties, rounded to even.
  for (int i = 0; i < 32; ++i) x[static_cast<size_t>(64 + i)] = static_cast<float>(i) - 15.5f;
  x[64] = 127.0f;
  const Q8Activations q(x);
  for (int b = 0; b < 8; ++b) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i)
      amax = std::fmax(amax, std::fabs(x[static_cast<size_t>(32 * b + i)]));
    float d = 0.0f, id = 0.0f;
    q8_scales(amax, d, id);
    EXPECT_EQ(d, q.d[static_cast<size_t>(b)]) << "block " << b;
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      const int v = q8_round(x[static_cast<size_t>(32 * b + i)], id);
      EXPECT_EQ(v, q.qs[static_cast<size_t>(32 * b + i)]) << "block " << b << " element " << i;
      sum += v;
    }
    EXPECT_EQ(d * static_cast<float>(sum), q.s[static_cast<size_t>(b)]) << "block " << b;
  }
}

}  // namespace
}  // namespace cb
