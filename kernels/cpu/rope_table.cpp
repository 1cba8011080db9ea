#include "kernels/cpu/rope_table.h"

#include <algorithm>

#include "kernels/cpu/reference_ops.h"

namespace cb {

std::shared_ptr<const RopeTable::Angles> RopeTable::covering(int32_t max_pos, int64_t rot_dim,
                                                             float freq_base,
                                                             const float* freq_factors) {
  const int64_t n_pairs = rot_dim / 2;
  const int64_t bytes_per_pos = 2 * n_pairs * static_cast<int64_t>(sizeof(float));
  const int32_t cap = static_cast<int32_t>(std::min<int64_t>(
      INT32_MAX, static_cast<int64_t>(kMaxBytes) / std::max<int64_t>(1, bytes_per_pos)));
  const int32_t want = std::min(cap, std::max(0, max_pos) + 1);
  const std::vector<float> factors = freq_factors
                                         ? std::vector<float>(freq_factors, freq_factors + n_pairs)
                                         : std::vector<float>{};
  std::lock_guard lock(mu_);
  auto it = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) {
    return e.rot_dim == rot_dim && e.freq_base == freq_base && e.freq_factors == factors;
  });
  if (it == entries_.end()) {
    entries_.push_back({rot_dim, freq_base, factors, std::make_shared<Angles>()});
    it = entries_.end() - 1;
  }
  if (it->angles->n_pos >= want) return it->angles;
  // Grown geometrically, so a context filled a token at a time rebuilds the
  // table O(log n) times; the old rows are copied, not recomputed.
  const Angles& old = *it->angles;
  auto grown = std::make_shared<Angles>();
  grown->n_pairs = n_pairs;
  grown->n_pos = std::min(cap, std::max(want, 2 * old.n_pos));
  const size_t len = static_cast<size_t>(grown->n_pos) * static_cast<size_t>(n_pairs);
  grown->cos_t = old.cos_t;
  grown->sin_t = old.sin_t;
  grown->cos_t.resize(len);
  grown->sin_t.resize(len);
  const std::vector<double> inv_freq = ref::rope_inv_freq(rot_dim, freq_base, freq_factors);
  for (int32_t p = old.n_pos; p < grown->n_pos; ++p)
    ref::rope_angles(p, inv_freq, grown->cos_t.data() + static_cast<size_t>(p) * n_pairs,
                     grown->sin_t.data() + static_cast<size_t>(p) * n_pairs);
  it->angles = grown;
  return grown;
}

void RopeTable::rope(float* x, const int32_t* pos, int64_t n_rows, int64_t n_heads,
                     int64_t head_dim, int64_t rot_dim, const Angles& angles, float freq_base,
                     const float* freq_factors) {
  const int64_t n_pairs = rot_dim / 2, row = n_heads * head_dim;
  std::vector<float> neg_sin;  // a negative position's: sin is odd, cos even
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t p = pos[r], a = p < 0 ? -p : p;
    if (a < angles.n_pos) {
      const size_t off = static_cast<size_t>(a) * static_cast<size_t>(n_pairs);
      const float* sin_t = angles.sin_t.data() + off;
      if (p < 0) {
        neg_sin.resize(static_cast<size_t>(n_pairs));
        for (int64_t i = 0; i < n_pairs; ++i) neg_sin[i] = -sin_t[i];
        sin_t = neg_sin.data();
      }
      ref::rope_rotate(x + r * row, n_heads, head_dim, n_pairs, angles.cos_t.data() + off, sin_t);
    } else {
      ref::rope(x + r * row, pos + r, 1, n_heads, head_dim, rot_dim, freq_base, freq_factors);
    }
  }
}

}  // namespace cb
