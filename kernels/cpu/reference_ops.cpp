#include "kernels/cpu/reference_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/dequantize.h"

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

void rope(float* x, const int32_t* pos, int64_t n_rows, int64_t n_heads, int64_t head_dim,
          int64_t rot_dim, float freq_base) {
  const int64_t n_pairs = rot_dim / 2;
  std::vector<double> inv_freq(static_cast<size_t>(n_pairs));
  for (int64_t i = 0; i < n_pairs; ++i) {
    inv_freq[i] = std::pow(static_cast<double>(freq_base),
                           -2.0 * static_cast<double>(i) / static_cast<double>(rot_dim));
  }
  std::vector<float> cos_t(static_cast<size_t>(n_pairs)), sin_t(static_cast<size_t>(n_pairs));
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t i = 0; i < n_pairs; ++i) {
      const double angle = static_cast<double>(pos[r]) * inv_freq[i];
      cos_t[i] = static_cast<float>(std::cos(angle));
      sin_t[i] = static_cast<float>(std::sin(angle));
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (r * n_heads + h) * head_dim;
      for (int64_t i = 0; i < n_pairs; ++i) {
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * cos_t[i] - b * sin_t[i];
        v[2 * i + 1] = a * sin_t[i] + b * cos_t[i];
      }
    }
  }
}

void attention_one(const AttentionArgs& a, int64_t qi, int64_t head) {
  const int64_t q_stride = a.n_head * a.head_dim;
  const int64_t kv_stride = a.n_head_kv * a.head_dim;
  const int64_t kv_head = head / (a.n_head / a.n_head_kv);
  const float* q = a.q + qi * q_stride + head * a.head_dim;
  float* out = a.out + qi * q_stride + head * a.head_dim;
  const int64_t n_keys = std::min<int64_t>(static_cast<int64_t>(a.q_pos[qi]) + 1, a.n_kv);
  std::fill(out, out + a.head_dim, 0.0f);
  if (n_keys <= 0) return;

  std::vector<float> p(static_cast<size_t>(n_keys));
  float max_score = -INFINITY;
  for (int64_t j = 0; j < n_keys; ++j) {
    const float* k = a.k + j * kv_stride + kv_head * a.head_dim;
    float s = 0.0f;
    for (int64_t d = 0; d < a.head_dim; ++d) s += q[d] * k[d];
    p[j] = s * a.scale;
    max_score = std::max(max_score, p[j]);
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < n_keys; ++j) {
    p[j] = std::exp(p[j] - max_score);
    sum += p[j];
  }
  for (int64_t j = 0; j < n_keys; ++j) {
    const float* v = a.v + j * kv_stride + kv_head * a.head_dim;
    const float wj = p[j] / sum;
    for (int64_t d = 0; d < a.head_dim; ++d) out[d] += wj * v[d];
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

}  // namespace cb::ref
