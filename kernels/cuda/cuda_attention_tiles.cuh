// Part of the CUDA backend (cuda_backend.cu) and of test_cuda_host, which
// runs it on the host: attention of many query rows by tiles, without a
// matrix of scores in memory (CB_CUDA_ATTN=tiles).
//
// Why: the cuBLAS path (CudaBackend::attention_gemm) writes every score of a
// block of rows, up to the last key any of its rows sees.  A blend's
// recomputed rows are spread over the whole request, so its blocks score
// almost every key for every row (on an H200 its attention took 0.53 of a
// full prefill's for 0.22 of the rows: docs/bench/cuda_runs.md).  Here a
// thread block takes the query heads of one KV head for a few consecutive
// query rows (64 (query, head) rows: 10 queries of a 6-head group) and one
// split of the keys (1,024), walks only the 64-key tiles its rows see
// there, and keeps scores, softmax and output in registers and shared
// memory (an online softmax, as the few-row kernel and the CPU's); a second
// kernel merges each row's splits.  The splits give a long row several
// blocks, so that the last rows of a long request do not set the pace.
//
// A block's work is written once, as phases separated by barriers
// (attention_tile_block); an executor runs each phase for the 256 threads:
// on the GPU every thread runs it and then waits at __syncthreads(), on the
// host (the test) a loop runs it thread after thread.  So the host test
// runs the kernel's own indexing, masking and arithmetic.
//
// Thread t owns rows 4 (t / 16) .. + 3 of the tile.  In a key tile it scores
// keys t % 16 + 16 i (i < 4) for its rows, and accumulates output dims
// 4 (16 c + t % 16) .. + 3 (c < HD / 64) of them.  A row's maximum over a
// key tile comes from the 16 threads' partial maxima in shared memory, read
// in a fixed order; its softmax sum is kept per thread and added up once,
// also in a fixed order.  So a row's result depends on its own query, the
// keys it sees and the tile boundaries (multiples of 64 from key 0), not on
// the other rows of its block; the splits cut at multiples of 1,024 keys
// and are merged in order.  So a row recomputed by a blend gets the bits it
// gets in a full prefill.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/backend.h"

// Loop unrolling for the device pass only: the host compiler (the test's)
// knows no such pragma.
#if defined(__CUDA_ARCH__)
#define CB_TILE_UNROLL _Pragma("unroll")
#define CB_TILE_UNROLL_4 _Pragma("unroll 4")
#else
#define CB_TILE_UNROLL
#define CB_TILE_UNROLL_4
#endif

namespace cb {
namespace {

constexpr int kTileRows = 64;       // (query, head) rows of a thread block
constexpr int kTileKeys = 64;       // keys a step
constexpr int kTileThreads = 256;   // threads of a block
constexpr int kRowsPerThread = 4;   // consecutive rows a thread owns
constexpr int kThreadsPerRow = 16;  // threads that share a row's keys and dims
static_assert(kTileThreads == kTileRows / kRowsPerThread * kThreadsPerRow, "thread layout");
static_assert(kTileKeys == 4 * kThreadsPerRow, "each thread scores 4 keys of a step");

// A K/V element as f32: the cache holds f32, or f16 bits (widened exactly).
__host__ __device__ __forceinline__ float tile_kv_f32(float x) {
  return x;
}
__host__ __device__ __forceinline__ float tile_kv_f32(uint16_t x) {
  return __half2float(__ushort_as_half(x));
}

// Shared memory of a block, in floats (the row data as int32 at the end).
// Rows of q and of the K or V tile are HD + 4 floats apart, so the float4
// reads of 8 threads (16 consecutive keys or dims) hit distinct banks.
template <int HD>
struct TileLayout {
  static constexpr int kStride = HD + 4;
  static constexpr int kPStride = kTileKeys + 1;
  static constexpr int kQ = 0;
  static constexpr int kKV = kQ + kTileRows * kStride;
  static constexpr int kP = kKV + kTileKeys * kStride;
  static constexpr int kPart = kP + kTileRows * kPStride;
  static constexpr int kRowData = kPart + kTileRows * kThreadsPerRow;
  static constexpr int kFloats = kRowData + 3 * kTileRows;
  static constexpr size_t kBytes = static_cast<size_t>(kFloats) * sizeof(float);
};

// A thread's state between phases: its rows' scores in the current key
// tile, running maxima, partial sums and output dims.
template <int HD>
struct TileThread {
  static constexpr int kChunks = HD / 64;  // float4s of output per row
  float s[kRowsPerThread][4];
  float m[kRowsPerThread];
  float l[kRowsPerThread];
  float acc[kRowsPerThread][4 * kChunks];
};

__host__ __device__ __forceinline__ float4 tile_ld4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}

// The query tile (row r: query q0 + r / group, head kvh * group + r % group).
struct TileRows {
  int64_t q0, group, kvh, per_tile;  // per_tile: queries a block
  __host__ __device__ bool exists(const AttentionArgs& a, int r) const {
    return r < per_tile * group && q0 + r / group < a.n_q;
  }
  __host__ __device__ int64_t query(int r) const { return q0 + r / group; }
  __host__ __device__ int64_t head(int r) const { return kvh * group + r % group; }
};

// The keys [first, end) query row qi sees (attention_key_end and
// attention_first_key of backend.h, on the device).
struct VisibleKeys {
  int64_t first = 0, end = 0;
  __host__ __device__ VisibleKeys(const AttentionArgs& a, int64_t qi) {
    const int64_t pos = a.q_pos[qi];
    end = pos + 1 < 0 ? 0 : (pos + 1 < a.n_kv ? pos + 1 : a.n_kv);
    first = a.window > 0 && pos + 1 - a.window > 0 ? pos + 1 - a.window : 0;
  }
};

// Where a block's results go: the keys are cut into splits of `keys` keys
// (a multiple of kTileKeys) from key 0, a block takes one split, and its
// rows' partial results (HD sums of weighted V rows, relative to the row's
// maximum score m, then m and the sum of the weights l) go to
// partial[tile_partial_offset(...)].  Splits give long rows several blocks
// (a blend's rows near the end of a 4k request see 65 key tiles); where
// they cut depends on the keys only, so a row's result still does not
// depend on its block.
struct TileSplit {
  int64_t keys, index;
};
// The backend's split: 16 key tiles.  The same for every call, so that a
// row's result does not depend on how many keys the call holds either.
constexpr int64_t kTileSplitKeys = 16 * kTileKeys;
__host__ __device__ inline int64_t tile_partial_offset(const AttentionArgs& a, int64_t split,
                                                       int64_t qi, int64_t head) {
  return ((split * a.n_q + qi) * a.n_head + head) * (a.head_dim + 2);
}

// Output dim d of query row qi, head h: its splits' partial results merged
// in split order (zero for a row that sees no key).
template <int HD>
__host__ __device__ float merge_tile_partials(const AttentionArgs& a, const float* partial,
                                              int64_t split_keys, int64_t qi, int64_t h, int d) {
  const VisibleKeys seen(a, qi);
  if (seen.end <= seen.first) return 0.0f;
  const int64_t s0 = seen.first / split_keys, s1 = (seen.end - 1) / split_keys;
  float big_m = -INFINITY;
  for (int64_t s = s0; s <= s1; ++s) {
    big_m = fmaxf(big_m, partial[tile_partial_offset(a, s, qi, h) + HD]);
  }
  float total = 0.0f, o = 0.0f;
  for (int64_t s = s0; s <= s1; ++s) {
    const float* p = partial + tile_partial_offset(a, s, qi, h);
    const float w = p[HD] == -INFINITY ? 0.0f : expf(p[HD] - big_m);
    total += p[HD + 1] * w;
    o += p[d] * w;
  }
  return total > 0.0f ? o * (1.0f / total) : 0.0f;
}

// Four consecutive K/V elements as floats, from one 16-byte (f32) or
// 8-byte (f16) load: the launch checks that K and V are so aligned.
__host__ __device__ __forceinline__ float4 tile_kv_f32x4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__host__ __device__ __forceinline__ float4 tile_kv_f32x4(const uint16_t* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  return make_float4(tile_kv_f32(static_cast<uint16_t>(u.x & 0xffffu)),
                     tile_kv_f32(static_cast<uint16_t>(u.x >> 16)),
                     tile_kv_f32(static_cast<uint16_t>(u.y & 0xffffu)),
                     tile_kv_f32(static_cast<uint16_t>(u.y >> 16)));
}

// dst[j][d] = the K or V element of key j0 + j, dim d of the tile's KV head
// (0 past n_kv: a weight of 0 must not meet an uninitialised NaN); four
// elements a thread, consecutive threads on consecutive elements.
template <class T, int HD>
__host__ __device__ void load_key_tile(const T* base, int64_t stride, int64_t j0, int64_t n_kv,
                                       int t, float* dst) {
  for (int e = t; e < kTileKeys * HD / 4; e += kTileThreads) {
    const int j = e / (HD / 4), d = 4 * (e % (HD / 4));
    *reinterpret_cast<float4*>(dst + j * TileLayout<HD>::kStride + d) =
        j0 + j < n_kv ? tile_kv_f32x4(base + (j0 + j) * stride + d) : make_float4(0, 0, 0, 0);
  }
}

// One thread block's rows over one split of the keys: phases run by `ex`
// (see the top of the file).  smem holds TileLayout<HD>::kBytes, 16-byte
// aligned.
#pragma nv_exec_check_disable
template <class T, int HD, class Exec>
__host__ __device__ void attention_tile_block(const AttentionArgs& a, const TileRows& rows,
                                              const TileSplit& split, float* partial, float* smem,
                                              Exec& ex) {
  using L = TileLayout<HD>;
  using State = TileThread<HD>;
  float* const q_s = smem + L::kQ;
  float* const kv_s = smem + L::kKV;
  float* const p_s = smem + L::kP;
  float* const part_s = smem + L::kPart;
  int32_t* const first_s = reinterpret_cast<int32_t*>(smem + L::kRowData);
  int32_t* const end_s = first_s + kTileRows;
  int32_t* const pos_s = end_s + kTileRows;
  const int64_t q_stride = a.n_head * HD, kv_stride = a.n_head_kv * HD;
  const T* const kbase = static_cast<const T*>(a.k) + rows.kvh * HD;
  const T* const vbase = static_cast<const T*>(a.v) + rows.kvh * HD;

  // The rows' positions and visible keys [first, end).
  ex.phase([&](int t, State&) {
    if (t < kTileRows) {
      int64_t first = 0, end = 0, pos = 0;
      if (rows.exists(a, t)) {
        const VisibleKeys seen(a, rows.query(t));
        pos = a.q_pos[rows.query(t)];
        first = seen.first;
        end = seen.end;
      }
      first_s[t] = static_cast<int32_t>(first);
      end_s[t] = static_cast<int32_t>(end);
      pos_s[t] = static_cast<int32_t>(pos);
    }
  });

  // The split's keys that any row sees (every thread reads the same values;
  // a block with none ends here, all its threads together).
  const int64_t split_begin = split.index * split.keys, split_end = split_begin + split.keys;
  int64_t lo = split_end, hi = split_begin;
  for (int r = 0; r < kTileRows; ++r) {
    if (end_s[r] > first_s[r]) {
      lo = first_s[r] < lo ? first_s[r] : lo;
      hi = end_s[r] > hi ? end_s[r] : hi;
    }
  }
  lo = lo > split_begin ? lo : split_begin;
  hi = hi < split_end ? hi : split_end;
  if (lo >= hi) return;

  // The rows' queries.
  ex.phase([&](int t, State& st) {
    for (int i = 0; i < kRowsPerThread; ++i) {
      st.m[i] = -INFINITY;
      st.l[i] = 0.0f;
      for (int x = 0; x < 4 * State::kChunks; ++x) st.acc[i][x] = 0.0f;
    }
    for (int e = t; e < kTileRows * HD / 4; e += kTileThreads) {
      const int r = e / (HD / 4), d = 4 * (e % (HD / 4));
      *reinterpret_cast<float4*>(q_s + r * L::kStride + d) =
          rows.exists(a, r) ? tile_ld4(a.q + rows.query(r) * q_stride + rows.head(r) * HD + d)
                            : make_float4(0, 0, 0, 0);
    }
  });

  for (int64_t j0 = lo / kTileKeys * kTileKeys; j0 < hi; j0 += kTileKeys) {
    ex.phase([&](int t, State&) { load_key_tile<T, HD>(kbase, kv_stride, j0, a.n_kv, t, kv_s); });

    // Scores of the thread's 4 rows x 4 keys, scaled, biased and masked;
    // each row's maximum over those keys to part_s.
    ex.phase([&](int t, State& st) {
      const int rg = t / kThreadsPerRow, kg = t % kThreadsPerRow;
      float dot[kRowsPerThread][4] = {};
      for (int d = 0; d < HD; d += 4) {
        float4 qv[kRowsPerThread], kv[4];
        CB_TILE_UNROLL
        for (int i = 0; i < kRowsPerThread; ++i)
          qv[i] = tile_ld4(q_s + (kRowsPerThread * rg + i) * L::kStride + d);
        CB_TILE_UNROLL
        for (int c = 0; c < 4; ++c)
          kv[c] = tile_ld4(kv_s + (kg + kThreadsPerRow * c) * L::kStride + d);
        CB_TILE_UNROLL
        for (int i = 0; i < kRowsPerThread; ++i) {
          CB_TILE_UNROLL
          for (int c = 0; c < 4; ++c) {
            float s = dot[i][c];
            s = fmaf(qv[i].x, kv[c].x, s);
            s = fmaf(qv[i].y, kv[c].y, s);
            s = fmaf(qv[i].z, kv[c].z, s);
            s = fmaf(qv[i].w, kv[c].w, s);
            dot[i][c] = s;
          }
        }
      }
      CB_TILE_UNROLL
      for (int i = 0; i < kRowsPerThread; ++i) {
        const int r = kRowsPerThread * rg + i;
        float mx = -INFINITY;
        CB_TILE_UNROLL
        for (int c = 0; c < 4; ++c) {
          const int64_t j = j0 + kg + kThreadsPerRow * c;
          const bool seen = j >= first_s[r] && j < end_s[r];
          const KeyBlockBias& b = a.key_bias;
          const float bias =
              pos_s[r] >= b.query_from && j >= b.key_begin && j < b.key_end ? b.bias : 0.0f;
          st.s[i][c] = seen ? dot[i][c] * a.scale + bias : -INFINITY;
          mx = fmaxf(mx, st.s[i][c]);
        }
        part_s[r * kThreadsPerRow + kg] = mx;
      }
    });

    // Each row's new maximum; its weights in this tile to p_s, what it
    // accumulated rescaled.  Then the tile's V rows over its K rows (every
    // thread is past the scores).
    ex.phase([&](int t, State& st) {
      const int rg = t / kThreadsPerRow, kg = t % kThreadsPerRow;
      CB_TILE_UNROLL
      for (int i = 0; i < kRowsPerThread; ++i) {
        const int r = kRowsPerThread * rg + i;
        float tile_max = -INFINITY;
        for (int k = 0; k < kThreadsPerRow; ++k)
          tile_max = fmaxf(tile_max, part_s[r * kThreadsPerRow + k]);
        const float m_new = fmaxf(st.m[i], tile_max);
        float alpha = 1.0f;  // nothing seen yet and nothing now: stays as is
        float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (m_new != -INFINITY) {
          alpha = expf(st.m[i] - m_new);  // 0 on the row's first keys
          CB_TILE_UNROLL
          for (int c = 0; c < 4; ++c) p[c] = expf(st.s[i][c] - m_new);  // 0 where masked
        }
        st.m[i] = m_new;
        st.l[i] = st.l[i] * alpha + ((p[0] + p[1]) + (p[2] + p[3]));
        CB_TILE_UNROLL
        for (int x = 0; x < 4 * State::kChunks; ++x) st.acc[i][x] *= alpha;
        CB_TILE_UNROLL
        for (int c = 0; c < 4; ++c) p_s[r * L::kPStride + kg + kThreadsPerRow * c] = p[c];
      }
      load_key_tile<T, HD>(vbase, kv_stride, j0, a.n_kv, t, kv_s);
    });

    // acc += P V over the tile's keys, for the thread's rows and dims.
    ex.phase([&](int t, State& st) {
      const int rg = t / kThreadsPerRow, kg = t % kThreadsPerRow;
      CB_TILE_UNROLL_4
      for (int j = 0; j < kTileKeys; ++j) {
        float pj[kRowsPerThread];
        CB_TILE_UNROLL
        for (int i = 0; i < kRowsPerThread; ++i)
          pj[i] = p_s[(kRowsPerThread * rg + i) * L::kPStride + j];
        CB_TILE_UNROLL
        for (int c = 0; c < State::kChunks; ++c) {
          const float4 v = tile_ld4(kv_s + j * L::kStride + 4 * (kThreadsPerRow * c + kg));
          CB_TILE_UNROLL
          for (int i = 0; i < kRowsPerThread; ++i) {
            st.acc[i][4 * c] = fmaf(pj[i], v.x, st.acc[i][4 * c]);
            st.acc[i][4 * c + 1] = fmaf(pj[i], v.y, st.acc[i][4 * c + 1]);
            st.acc[i][4 * c + 2] = fmaf(pj[i], v.z, st.acc[i][4 * c + 2]);
            st.acc[i][4 * c + 3] = fmaf(pj[i], v.w, st.acc[i][4 * c + 3]);
          }
        }
      }
    });
  }

  // Each row's softmax sum from its 16 threads' parts, in a fixed order;
  // the partial result of every row that sees keys of this split.
  ex.phase([&](int t, State& st) {
    const int rg = t / kThreadsPerRow, kg = t % kThreadsPerRow;
    CB_TILE_UNROLL
    for (int i = 0; i < kRowsPerThread; ++i)
      part_s[(kRowsPerThread * rg + i) * kThreadsPerRow + kg] = st.l[i];
  });
  ex.phase([&](int t, State& st) {
    const int rg = t / kThreadsPerRow, kg = t % kThreadsPerRow;
    CB_TILE_UNROLL
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int r = kRowsPerThread * rg + i;
      if (!rows.exists(a, r) || end_s[r] <= first_s[r] || first_s[r] >= split_end ||
          end_s[r] <= split_begin) {
        continue;
      }
      float l = 0.0f;
      for (int k = 0; k < kThreadsPerRow; ++k) l += part_s[r * kThreadsPerRow + k];
      float* out = partial + tile_partial_offset(a, split.index, rows.query(r), rows.head(r));
      CB_TILE_UNROLL
      for (int c = 0; c < State::kChunks; ++c) {
        CB_TILE_UNROLL
        for (int e = 0; e < 4; ++e) out[4 * (kThreadsPerRow * c + kg) + e] = st.acc[i][4 * c + e];
      }
      if (kg == 0) {
        out[HD] = st.m[i];
        out[HD + 1] = l;
      }
    }
  });
}

// The GPU's executor: every thread runs a phase, then the block waits.
template <int HD>
struct DeviceTileExec {
  TileThread<HD> st;
  template <class F>
  __device__ __forceinline__ void phase(F&& f) {
    f(static_cast<int>(threadIdx.x), st);
    __syncthreads();
  }
};

// Grid: (blocks of TileRows::per_tile queries, KV heads, key splits);
// a.n_q x a.n_head x splits x (HD + 2) floats of partial results.
template <class T, int HD>
__global__ void __launch_bounds__(kTileThreads)
    attention_tiles_kernel(AttentionArgs a, int64_t group, int64_t split_keys, float* partial) {
  extern __shared__ float4 attention_tile_smem[];
  const int64_t per_tile = kTileRows / group;
  const TileRows rows{static_cast<int64_t>(blockIdx.x) * per_tile, group,
                      static_cast<int64_t>(blockIdx.y), per_tile};
  DeviceTileExec<HD> ex;
  attention_tile_block<T, HD>(a, rows, TileSplit{split_keys, static_cast<int64_t>(blockIdx.z)},
                              partial, reinterpret_cast<float*>(attention_tile_smem), ex);
}

// a.out from attention_tiles_kernel's partial results: a block a query row.
template <int HD>
__global__ void attention_merge_kernel(AttentionArgs a, const float* __restrict__ partial,
                                       int64_t split_keys) {
  const int64_t qi = blockIdx.x, row = a.n_head * HD;
  for (int64_t e = threadIdx.x; e < row; e += blockDim.x) {
    a.out[qi * row + e] =
        merge_tile_partials<HD>(a, partial, split_keys, qi, e / HD, static_cast<int>(e % HD));
  }
}

}  // namespace
}  // namespace cb
