// Scalar reference implementations of every Backend op.  They are written
// for clarity, kept forever, and serve three purposes: the fast kernels are
// tested against them, the CPU backend runs them (split over threads) on
// CPUs without AVX2, and they document the exact semantics of each op.
//
// All functions are single-threaded and assume valid arguments (the backend
// validates).  Ops that the backend splits across threads take the slice to
// compute.
#pragma once

#include <cstdint>

#include "kernels/backend.h"

namespace cb::ref {

// Output columns [o_begin, o_end) of y = x * W^T: y[r][o] for r < n_rows.
// y has w.n_out columns.  Each weight row is dequantized once and reused for
// every activation row; dot products accumulate in f32, in index order.
void matmul(const WeightView& w, const float* x, int64_t n_rows, float* y, int64_t o_begin,
            int64_t o_end);
// All output columns.
void matmul(const WeightView& w, const float* x, int64_t n_rows, float* y);

void get_rows(const WeightView& w, const int32_t* ids, int64_t n, float* out);

// The sum of squares accumulates in f64.
void rmsnorm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps,
             float* out);

// Angles are computed in f64 and rounded once, so positions in the
// thousands rotate as accurately as small ones.
void rope(float* x, const int32_t* pos, int64_t n_rows, int64_t n_heads, int64_t head_dim,
          int64_t rot_dim, float freq_base);

// One query row (index qi into a.q) and one query head: a two-pass softmax
// over keys 0..min(q_pos, n_kv - 1).  A query that sees no key (negative
// position) gets a zero output.
void attention_one(const AttentionArgs& a, int64_t qi, int64_t head);
// Every query row and head.
void attention(const AttentionArgs& a);

void silu_mul(const float* gate, const float* up, int64_t n, float* out);
void add(const float* a, const float* b, int64_t n, float* out);
void gather_rows(const float* src, int64_t row_len, const int32_t* idx, int64_t n, float* dst);
void scatter_rows(const float* src, int64_t row_len, const int32_t* idx, int64_t n, float* dst);
// out[r] = sum_j (a[r][j] - b[r][j])^2, accumulated in double.
void row_sq_diff(const float* a, const float* b, int64_t n_rows, int64_t row_len, float* out);

}  // namespace cb::ref
