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
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/quant_blocks.h"

namespace cb::ref {

// Output columns [o_begin, o_end) of y = x * W^T: y[r][o] for r < n_rows.
// y has w.n_out columns.  Each weight row is dequantized once and reused for
// every activation row; dot products accumulate in f32, in index order.
void matmul(const WeightView& w, const float* x, int64_t n_rows, float* y, int64_t o_begin,
            int64_t o_end);
// All output columns.
void matmul(const WeightView& w, const float* x, int64_t n_rows, float* y);

// ---- The int8 GEMV of decode (Backend::matmul_q8) ----
//
// Weight types with an integer dot-product kernel: every quantized type
// (F32, F16 and BF16 keep the f32 path).
bool gemv_q8_supported(DType t);
// x[0, n) quantized (see Q8Row) into qs[0, n), d[0, n / 32) and
// s[0, n / 32); n is a multiple of 32.  Rounds x / d to nearest, ties to
// even, with 1/d computed as 127 / max, so the SIMD versions produce the
// same bytes.
void quantize_q8a(const float* x, int64_t n, int8_t* qs, float* d, float* s);
// Output columns [o_begin, o_end) of y = W x for one quantized activation
// row x (w.n_in / 32 blocks).  Per activation block the weight-by-activation
// products are summed exactly in integers; the block sums are scaled and
// accumulated in f32, in block order.  Per block and weight scale:
//   Q8_0, Q4_0:  dw * dx * sum(q * xq)          (Q4_0's q - 8 is signed)
//   Q4_1:        dw * dx * sum(q * xq) + m * s
//   Q5_0:        dw * dx * sum(q * xq)          (q - 16 signed)
//   Q5_1:        dw * dx * sum(q * xq) + m * s
//   Q4_K, Q5_K:  (d * sc) * dx * sum(q * xq) - (dmin * m) * s
//   Q6_K:        (d * dx) * (sc_a * sum_a(q * xq) + sc_b * sum_b(q * xq))
//                over the block's two runs of 16 (q - 32 signed)
//   Q3_K:        the same with Q3_K's scales (minus 32) and q - 4 * !bit
//   Q2_K:        (d * dx) * (sc_a * sum_a(q * xq) + sc_b * sum_b(q * xq))
//                - (dmin * dx) * (m_a * sum_a(xq) + m_b * sum_b(xq))
void gemv_q8(const WeightView& w, const Q8Row& x, float* y, int64_t o_begin, int64_t o_end);

void get_rows(const WeightView& w, const int32_t* ids, int64_t n, float* out);

// The sum of squares accumulates in f64.
void rmsnorm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps,
             float* out);

// Angles are computed in f64 and rounded once, so positions in the
// thousands rotate as accurately as small ones.
void rope(float* x, const int32_t* pos, int64_t n_rows, int64_t n_heads, int64_t head_dim,
          int64_t rot_dim, float freq_base, const float* freq_factors = nullptr);
// rope()'s two halves, for callers that keep the angles (rope_table.h):
// the inverse frequency of each of the rot_dim / 2 pairs; the cos and sin of
// one position's angles; one row of n_heads heads rotated by them.
std::vector<double> rope_inv_freq(int64_t rot_dim, float freq_base,
                                  const float* freq_factors = nullptr);
void rope_angles(int32_t pos, const std::vector<double>& inv_freq, float* cos_t, float* sin_t);
void rope_rotate(float* row, int64_t n_heads, int64_t head_dim, int64_t n_pairs, const float* cos_t,
                 const float* sin_t);

// One query row (index qi into a.q) and one query head: a two-pass softmax
// over keys 0..min(q_pos, n_kv - 1).  A query that sees no key (negative
// position) gets a zero output.
void attention_one(const AttentionArgs& a, int64_t qi, int64_t head);
// Every query row and head.
void attention(const AttentionArgs& a);
// The softmax weights of query row qi, head `head` over the keys it sees:
// w[j] for j <= min(q_pos[qi], n_kv - 1); returns how many were written.
int64_t attention_weights_one(const AttentionArgs& a, int64_t qi, int64_t head, float* w);
// a.key_bias on the raw scores (q . k, before a.scale) s[0..n) of a query at
// position q_pos on keys j0.. : adds bias / scale where it applies.  For the
// SIMD kernels, which scale the scores later; compiled for the baseline ISA.
void add_key_bias(const AttentionArgs& a, int64_t q_pos, int64_t j0, int64_t n, float* s);

void silu_mul(const float* gate, const float* up, int64_t n, float* out);
void gelu_mul(const float* gate, const float* up, int64_t n, float* out);
void add(const float* a, const float* b, int64_t n, float* out);
void gather_rows(const float* src, int64_t row_len, const int32_t* idx, int64_t n, float* dst);
void scatter_rows(const float* src, int64_t row_len, const int32_t* idx, int64_t n, float* dst);
// Backend::scatter_rows_f16 / gather_rows_f16, one element at a time
// (platform/half.h's scalar conversions).
void scatter_rows_f16(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                      uint16_t* dst);
void gather_rows_f16(const uint16_t* src, int64_t row_len, const int32_t* idx, int64_t n,
                     float* dst);
// out[r] = sum_j (a[r][j] - b[r][j])^2, accumulated in double.
void row_sq_diff(const float* a, const float* b, int64_t n_rows, int64_t row_len, float* out);
// Backend::segment_means in its order, one segment at a time (x is scratch).
void segment_means(float* x, int64_t row_len, const int32_t* seg, int64_t n_seg, float* out);

}  // namespace cb::ref
