#include "kernels/cpu/reference_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/dequantize.h"
#include "platform/half.h"

namespace cb::ref {
namespace {

const uint8_t* weight_row(const WeightView& w, int64_t o) {
  return static_cast<const uint8_t*>(w.data) +
         static_cast<size_t>(o) * dtype_row_bytes(w.type, w.n_in);
}

}  // namespace

void matmul(const WeightView& w, const float* x, int64_t n_rows, float* y, int64_t o_begin,
            int64_t o_end) {
  std::vector<float> row(static_cast<size_t>(w.n_in));
  for (int64_t o = o_begin; o < o_end; ++o) {
    dequantize_row(w.type, weight_row(w, o), row.data(), w.n_in);
    for (int64_t r = 0; r < n_rows; ++r) {
      const float* xr = x + r * w.n_in;
      float acc = 0.0f;
      for (int64_t i = 0; i < w.n_in; ++i) acc += row[i] * xr[i];
      y[r * w.n_out + o] = acc;
    }
  }
}

void matmul(const WeightView& w, const float* x, int64_t n_rows, float* y) {
  matmul(w, x, n_rows, y, 0, w.n_out);
}

bool gemv_q8_supported(DType t) {
  switch (t) {
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_NL:
    case DType::IQ4_XS:
      return true;
    case DType::F32:
    case DType::F16:
    case DType::BF16:
      return false;
  }
  return false;
}

void quantize_q8a(const float* x, int64_t n, int8_t* qs, float* d, float* s) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* xb = x + b * kQK;
    float amax = 0.0f;
    for (int i = 0; i < kQK; ++i) amax = std::max(amax, std::fabs(xb[i]));
    d[b] = amax / 127.0f;
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int i = 0; i < kQK; ++i) {
      // |x * id| <= 127 (up to rounding of id), so the cast cannot overflow.
      const int q = static_cast<int>(std::nearbyint(xb[i] * id));
      qs[b * kQK + i] = static_cast<int8_t>(q);
      sum += q;
    }
    s[b] = d[b] * static_cast<float>(sum);
  }
}

namespace {

// sum(w[i] * x[i]) for i in [0, n), exactly.
int dot_i8(const int8_t* w, const int8_t* x, int n) {
  int s = 0;
  for (int i = 0; i < n; ++i) s += static_cast<int>(w[i]) * static_cast<int>(x[i]);
  return s;
}

// The 32 quants of a Q4_0 / Q4_1 block in element order (see BlockQ4_0),
// minus `bias`.
void nibbles(const uint8_t* qs, int bias, int8_t* q) {
  for (int j = 0; j < kQK / 2; ++j) {
    q[j] = static_cast<int8_t>((qs[j] & 0x0F) - bias);
    q[j + kQK / 2] = static_cast<int8_t>((qs[j] >> 4) - bias);
  }
}

// The 32 levels of an IQ4 run of 16 nibble bytes, in element order.
void iq4_levels(const uint8_t* qs, int8_t* q) {
  for (int j = 0; j < kQK / 2; ++j) {
    q[j] = kIq4Levels[qs[j] & 0x0F];
    q[j + kQK / 2] = kIq4Levels[qs[j] >> 4];
  }
}

// The sum of the 16 activation quants of a run.
int sum_i8(const int8_t* x, int n) {
  int s = 0;
  for (int i = 0; i < n; ++i) s += x[i];
  return s;
}

// The 32 five-bit quants of a Q5_0 / Q5_1 block in element order, minus
// `bias`.
template <class Block>
void q5_quants(const Block& b, int bias, int8_t* q) {
  for (int i = 0; i < kQK; ++i) q[i] = static_cast<int8_t>(q5_quant(b.qs, b.qh, i) - bias);
}

// The 2-bit quant of element e (0..255) of a Q2_K / Q3_K super-block (see
// BlockQ2_K).
int q2_quant(const uint8_t* qs, int e) {
  const int s = e / 32;
  return (qs[32 * (s / 4) + e % 32] >> (2 * (s % 4))) & 3;
}

// Q4_K and Q5_K share scales and nibbles; Q5_K's fifth bit of element l of
// sub-block j is bit j of qh[l].
template <class Block>
float q45_k_row(const Block* w, const Q8Row& x, int64_t n_super) {
  float acc = 0.0f;
  int8_t q[kQK];
  for (int64_t sb = 0; sb < n_super; ++sb) {
    const float d = f16_to_f32(w[sb].d), dmin = f16_to_f32(w[sb].dmin);
    for (int j = 0; j < 8; ++j) {  // sub-block j: chunk j / 2, low or high nibbles
      const uint8_t* qs = w[sb].qs + 32 * (j / 2);
      for (int l = 0; l < 32; ++l) {
        int v = j % 2 == 0 ? qs[l] & 0x0F : qs[l] >> 4;
        if constexpr (std::is_same_v<Block, BlockQ5_K>) v |= ((w[sb].qh[l] >> j) & 1) << 4;
        q[l] = static_cast<int8_t>(v);
      }
      uint8_t sc, m;
      q4k_scale_min(w[sb].scales, j, &sc, &m);
      const int64_t xb = sb * 8 + j;
      acc += (d * static_cast<float>(sc)) * x.d[xb] *
             static_cast<float>(dot_i8(q, x.qs + kQK * xb, kQK));
      acc -= (dmin * static_cast<float>(m)) * x.s[xb];
    }
  }
  return acc;
}

float gemv_q8_row(DType t, const uint8_t* row, const Q8Row& x, int64_t n_in) {
  float acc = 0.0f;
  int8_t q[kQKK];
  switch (t) {
    case DType::Q4_0:
    case DType::Q4_1: {
      const bool q41 = t == DType::Q4_1;
      const size_t bytes = q41 ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0);
      for (int64_t b = 0; b < n_in / kQK; ++b) {
        const uint8_t* blk = row + static_cast<size_t>(b) * bytes;
        if (q41) {
          BlockQ4_1 w;
          std::memcpy(&w, blk, sizeof w);
          nibbles(w.qs, 0, q);
          acc += f16_to_f32(w.d) * x.d[b] * static_cast<float>(dot_i8(q, x.qs + kQK * b, kQK));
          acc += f16_to_f32(w.m) * x.s[b];
        } else {
          BlockQ4_0 w;
          std::memcpy(&w, blk, sizeof w);
          nibbles(w.qs, 8, q);
          acc += f16_to_f32(w.d) * x.d[b] * static_cast<float>(dot_i8(q, x.qs + kQK * b, kQK));
        }
      }
      return acc;
    }
    case DType::Q5_0: {
      const BlockQ5_0* w = reinterpret_cast<const BlockQ5_0*>(row);
      for (int64_t b = 0; b < n_in / kQK; ++b) {
        q5_quants(w[b], 16, q);
        acc += f16_to_f32(w[b].d) * x.d[b] * static_cast<float>(dot_i8(q, x.qs + kQK * b, kQK));
      }
      return acc;
    }
    case DType::Q5_1: {
      const BlockQ5_1* w = reinterpret_cast<const BlockQ5_1*>(row);
      for (int64_t b = 0; b < n_in / kQK; ++b) {
        q5_quants(w[b], 0, q);
        acc += f16_to_f32(w[b].d) * x.d[b] * static_cast<float>(dot_i8(q, x.qs + kQK * b, kQK));
        acc += f16_to_f32(w[b].m) * x.s[b];
      }
      return acc;
    }
    case DType::Q8_0: {
      const BlockQ8_0* w = reinterpret_cast<const BlockQ8_0*>(row);
      for (int64_t b = 0; b < n_in / kQK; ++b)
        acc +=
            f16_to_f32(w[b].d) * x.d[b] * static_cast<float>(dot_i8(w[b].qs, x.qs + kQK * b, kQK));
      return acc;
    }
    case DType::Q2_K: {
      // Per run r of 16: (d * sc_r) * q - dmin * m_r, so per activation
      // block (runs 2j, 2j + 1) d * dx * sum_r sc_r * sum(q * xq) minus
      // dmin * dx * sum_r m_r * sum(xq).
      const BlockQ2_K* w = reinterpret_cast<const BlockQ2_K*>(row);
      for (int64_t sb = 0; sb < n_in / kQKK; ++sb) {
        const float d = f16_to_f32(w[sb].d), dmin = f16_to_f32(w[sb].dmin);
        for (int e = 0; e < kQKK; ++e) q[e] = static_cast<int8_t>(q2_quant(w[sb].qs, e));
        for (int j = 0; j < 8; ++j) {
          const int64_t xb = sb * 8 + j;
          int isum = 0, msum = 0;
          for (int h = 0; h < 2; ++h) {
            const uint8_t sc = w[sb].scales[2 * j + h];
            isum += (sc & 0x0F) * dot_i8(q + 32 * j + 16 * h, x.qs + kQK * xb + 16 * h, 16);
            msum += (sc >> 4) * sum_i8(x.qs + kQK * xb + 16 * h, 16);
          }
          acc += (d * x.d[xb]) * static_cast<float>(isum) -
                 (dmin * x.d[xb]) * static_cast<float>(msum);
        }
      }
      return acc;
    }
    case DType::Q3_K: {
      const BlockQ3_K* w = reinterpret_cast<const BlockQ3_K*>(row);
      for (int64_t sb = 0; sb < n_in / kQKK; ++sb) {
        const float d = f16_to_f32(w[sb].d);
        for (int e = 0; e < kQKK; ++e) {
          const int high = (w[sb].hmask[e % 32] >> (e / 32)) & 1;
          q[e] = static_cast<int8_t>(q2_quant(w[sb].qs, e) - (high ? 0 : 4));
        }
        for (int j = 0; j < 8; ++j) {
          const int64_t xb = sb * 8 + j;
          int isum = 0;
          for (int h = 0; h < 2; ++h)
            isum += (q3k_scale(w[sb].scales, 2 * j + h) - 32) *
                    dot_i8(q + 32 * j + 16 * h, x.qs + kQK * xb + 16 * h, 16);
          acc += (d * x.d[xb]) * static_cast<float>(isum);
        }
      }
      return acc;
    }
    case DType::Q4_K:
      return q45_k_row(reinterpret_cast<const BlockQ4_K*>(row), x, n_in / kQKK);
    case DType::Q5_K:
      return q45_k_row(reinterpret_cast<const BlockQ5_K*>(row), x, n_in / kQKK);
    case DType::Q6_K: {
      const BlockQ6_K* w = reinterpret_cast<const BlockQ6_K*>(row);
      for (int64_t sb = 0; sb < n_in / kQKK; ++sb) {
        // The signed quants in element order (layout: see BlockQ6_K).
        for (int h = 0; h < 2; ++h) {
          const uint8_t* ql = w[sb].ql + 64 * h;
          const uint8_t* qh = w[sb].qh + 32 * h;
          int8_t* o = q + 128 * h;
          for (int l = 0; l < 32; ++l) {
            o[l] = static_cast<int8_t>(((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) - 32);
            o[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32);
            o[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            o[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
          }
        }
        const float d = f16_to_f32(w[sb].d);
        for (int j = 0; j < 8; ++j) {
          const int64_t xb = sb * 8 + j;
          const int isum =
              w[sb].scales[2 * j] * dot_i8(q + 32 * j, x.qs + kQK * xb, 16) +
              w[sb].scales[2 * j + 1] * dot_i8(q + 32 * j + 16, x.qs + kQK * xb + 16, 16);
          acc += (d * x.d[xb]) * static_cast<float>(isum);
        }
      }
      return acc;
    }
    case DType::IQ4_NL: {
      const BlockIQ4_NL* w = reinterpret_cast<const BlockIQ4_NL*>(row);
      for (int64_t b = 0; b < n_in / kQK; ++b) {
        iq4_levels(w[b].qs, q);
        acc += f16_to_f32(w[b].d) * x.d[b] * static_cast<float>(dot_i8(q, x.qs + kQK * b, kQK));
      }
      return acc;
    }
    case DType::IQ4_XS: {
      const BlockIQ4_XS* w = reinterpret_cast<const BlockIQ4_XS*>(row);
      for (int64_t sb = 0; sb < n_in / kQKK; ++sb) {
        const float d = f16_to_f32(w[sb].d);
        for (int j = 0; j < kQKK / kQK; ++j) {
          iq4_levels(w[sb].qs + 16 * j, q);
          const int64_t xb = sb * 8 + j;
          acc += (d * static_cast<float>(iq4xs_scale(w[sb], j) - 32)) * x.d[xb] *
                 static_cast<float>(dot_i8(q, x.qs + kQK * xb, kQK));
        }
      }
      return acc;
    }
    default:
      return 0.0f;  // gemv_q8_supported() is false; the backend never calls this
  }
}

}  // namespace

void gemv_q8(const WeightView& w, const Q8Row& x, float* y, int64_t o_begin, int64_t o_end) {
  for (int64_t o = o_begin; o < o_end; ++o) y[o] = gemv_q8_row(w.type, weight_row(w, o), x, w.n_in);
}

void get_rows(const WeightView& w, const int32_t* ids, int64_t n, float* out) {
  for (int64_t r = 0; r < n; ++r)
    dequantize_row(w.type, weight_row(w, ids[r]), out + r * w.n_in, w.n_in);
}

void rmsnorm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps,
             float* out) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;
    double sum = 0.0;
    for (int64_t i = 0; i < dim; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    const float scale = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(dim) + eps));
    float* yr = out + r * dim;
    for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * scale * weight[i];
  }
}

std::vector<double> rope_inv_freq(int64_t rot_dim, float freq_base, const float* freq_factors) {
  std::vector<double> inv_freq(static_cast<size_t>(rot_dim / 2));
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    inv_freq[i] = std::pow(static_cast<double>(freq_base),
                           -2.0 * static_cast<double>(i) / static_cast<double>(rot_dim));
    if (freq_factors != nullptr) inv_freq[i] /= static_cast<double>(freq_factors[i]);
  }
  return inv_freq;
}

void rope_angles(int32_t pos, const std::vector<double>& inv_freq, float* cos_t, float* sin_t) {
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const double angle = static_cast<double>(pos) * inv_freq[i];
    cos_t[i] = static_cast<float>(std::cos(angle));
    sin_t[i] = static_cast<float>(std::sin(angle));
  }
}

void rope_rotate(float* row, int64_t n_heads, int64_t head_dim, int64_t n_pairs, const float* cos_t,
                 const float* sin_t) {
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = row + h * head_dim;
    for (int64_t i = 0; i < n_pairs; ++i) {
      const float a = v[2 * i], b = v[2 * i + 1];
      v[2 * i] = a * cos_t[i] - b * sin_t[i];
      v[2 * i + 1] = a * sin_t[i] + b * cos_t[i];
    }
  }
}

void rope(float* x, const int32_t* pos, int64_t n_rows, int64_t n_heads, int64_t head_dim,
          int64_t rot_dim, float freq_base, const float* freq_factors) {
  const std::vector<double> inv_freq = rope_inv_freq(rot_dim, freq_base, freq_factors);
  const int64_t n_pairs = rot_dim / 2;
  std::vector<float> cos_t(static_cast<size_t>(n_pairs)), sin_t(static_cast<size_t>(n_pairs));
  for (int64_t r = 0; r < n_rows; ++r) {
    rope_angles(pos[r], inv_freq, cos_t.data(), sin_t.data());
    rope_rotate(x + r * n_heads * head_dim, n_heads, head_dim, n_pairs, cos_t.data(), sin_t.data());
  }
}

namespace {

// Element i of a K/V row of a's kv_type, as f32 (an f16 widens exactly).
float kv_at(const AttentionArgs& a, const void* base, int64_t i) {
  if (a.kv_type == DType::F16) return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
  return static_cast<const float*>(base)[i];
}

}  // namespace

int64_t attention_weights_one(const AttentionArgs& a, int64_t qi, int64_t head, float* w) {
  const int64_t q_stride = a.n_head * a.head_dim;
  const int64_t kv_stride = a.n_head_kv * a.head_dim;
  const int64_t kv_head = head / (a.n_head / a.n_head_kv);
  const float* q = a.q + qi * q_stride + head * a.head_dim;
  const int64_t n_keys = attention_key_end(a, qi);
  const int64_t first = attention_first_key(a, qi);
  if (n_keys <= first) return 0;
  std::fill(w, w + first, 0.0f);
  float max_score = -INFINITY;
  for (int64_t j = first; j < n_keys; ++j) {
    const int64_t k = j * kv_stride + kv_head * a.head_dim;
    float s = 0.0f;
    for (int64_t d = 0; d < a.head_dim; ++d) s += q[d] * kv_at(a, a.k, k + d);
    w[j] = s * a.scale + a.key_bias.at(a.q_pos[qi], j);
    max_score = std::max(max_score, w[j]);
  }
  float sum = 0.0f;
  for (int64_t j = first; j < n_keys; ++j) {
    w[j] = std::exp(w[j] - max_score);
    sum += w[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = first; j < n_keys; ++j) w[j] *= inv;
  return n_keys;
}

void add_key_bias(const AttentionArgs& a, int64_t q_pos, int64_t j0, int64_t n, float* s) {
  const KeyBlockBias& b = a.key_bias;
  if (q_pos < b.query_from) return;
  const float add = b.bias / a.scale;
  for (int64_t j = std::max(b.key_begin - j0, int64_t{0}); j < std::min(b.key_end - j0, n); ++j)
    s[j] += add;
}

void attention_one(const AttentionArgs& a, int64_t qi, int64_t head) {
  const int64_t q_stride = a.n_head * a.head_dim;
  const int64_t kv_stride = a.n_head_kv * a.head_dim;
  const int64_t kv_head = head / (a.n_head / a.n_head_kv);
  float* out = a.out + qi * q_stride + head * a.head_dim;
  std::fill(out, out + a.head_dim, 0.0f);
  std::vector<float> w(static_cast<size_t>(std::max<int64_t>(a.n_kv, 0)));
  const int64_t n_keys = attention_weights_one(a, qi, head, w.data());
  for (int64_t j = 0; j < n_keys; ++j) {
    const int64_t v = j * kv_stride + kv_head * a.head_dim;
    for (int64_t d = 0; d < a.head_dim; ++d) out[d] += w[j] * kv_at(a, a.v, v + d);
  }
}

void attention(const AttentionArgs& a) {
  for (int64_t qi = 0; qi < a.n_q; ++qi) {
    for (int64_t h = 0; h < a.n_head; ++h) attention_one(a, qi, h);
  }
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

// gelu(x) = x / 2 * (1 + tanh(u)) = x / (1 + e^(-2u)): the second form has
// no cancellation for negative x.
void gelu_mul(const float* gate, const float* up, int64_t n, float* out) {
  const float k = 1.5957691216057308f;  // 2 sqrt(2 / pi)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-k * (g + 0.044715f * g * g * g))) * up[i];
  }
}

void add(const float* a, const float* b, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void gather_rows(const float* src, int64_t row_len, const int32_t* idx, int64_t n, float* dst) {
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(dst + r * row_len, src + static_cast<int64_t>(idx[r]) * row_len,
                static_cast<size_t>(row_len) * sizeof(float));
  }
}

void scatter_rows(const float* src, int64_t row_len, const int32_t* idx, int64_t n, float* dst) {
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(dst + static_cast<int64_t>(idx[r]) * row_len, src + r * row_len,
                static_cast<size_t>(row_len) * sizeof(float));
  }
}

void scatter_rows_f16(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                      uint16_t* dst) {
  for (int64_t r = 0; r < n; ++r) {
    uint16_t* out = dst + static_cast<int64_t>(idx[r]) * row_len;
    for (int64_t j = 0; j < row_len; ++j) out[j] = f32_to_f16(src[r * row_len + j]);
  }
}

void gather_rows_f16(const uint16_t* src, int64_t row_len, const int32_t* idx, int64_t n,
                     float* dst) {
  for (int64_t r = 0; r < n; ++r) {
    const uint16_t* in = src + static_cast<int64_t>(idx[r]) * row_len;
    for (int64_t j = 0; j < row_len; ++j) dst[r * row_len + j] = f16_to_f32(in[j]);
  }
}

void row_sq_diff(const float* a, const float* b, int64_t n_rows, int64_t row_len, float* out) {
  for (int64_t r = 0; r < n_rows; ++r) {
    double sum = 0.0;
    for (int64_t j = 0; j < row_len; ++j) {
      const double d = static_cast<double>(a[r * row_len + j]) - b[r * row_len + j];
      sum += d * d;
    }
    out[r] = static_cast<float>(sum);
  }
}

void segment_means(float* x, int64_t row_len, const int32_t* seg, int64_t n_seg, float* out) {
  for (int64_t s = 0; s < n_seg; ++s) {
    float* rows = x + static_cast<int64_t>(seg[s]) * row_len;
    const int64_t n0 = seg[s + 1] - seg[s];
    for (int64_t n = n0; n > 1;) {
      const int64_t h = n / 2;
      const float* src = rows + (n - h) * row_len;
      for (int64_t j = 0; j < h * row_len; ++j) rows[j] = rows[j] + src[j];
      n -= h;
    }
    const float inv = 1.0f / static_cast<float>(n0);
    for (int64_t j = 0; j < row_len; ++j) out[s * row_len + j] = rows[j] * inv;
  }
}

}  // namespace cb::ref
