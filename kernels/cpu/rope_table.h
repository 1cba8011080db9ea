// The cos and sin of RoPE's angles, kept across calls.  They depend on the
// position and the pair only, not on the layer or the head, yet computing
// them costs a sin and a cos per pair and row, which is most of rotating a
// row: a request's rotations (Q and K at every layer, the loaded chunk KV
// of every layer) would compute the same angles tens of times.
//
// The table holds them as ref::rope computes them (f64 angle, rounded
// once), so a rotation through the table is bitwise the one computed in
// place.  It grows on demand up to kMaxBytes per (rot_dim, freq_base,
// frequency factors); positions past that are computed in place.  A
// negative position (a rotation undone) takes its opposite's cos and the
// negated sin, as ref::rope would compute them: the angle's negation is
// exact, and cos is even and sin odd.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace cb {

class RopeTable {
 public:
  static constexpr size_t kMaxBytes = size_t{4} << 20;

  struct Angles {
    int64_t n_pairs = 0;
    int32_t n_pos = 0;         // positions [0, n_pos) are held
    std::vector<float> cos_t;  // [pos * n_pairs + pair]
    std::vector<float> sin_t;
  };

  // Angles for (rot_dim, freq_base, freq_factors: rot_dim / 2 floats or
  // null, compared by value) that hold every position in [0, max_pos] the
  // cap allows.  The result is immutable and stays valid while held, also
  // when another thread grows the table.  Thread-safe.
  std::shared_ptr<const Angles> covering(int32_t max_pos, int64_t rot_dim, float freq_base,
                                         const float* freq_factors);

  // x (n_rows rows of n_heads x head_dim) rotated as ref::rope rotates it.
  static void rope(float* x, const int32_t* pos, int64_t n_rows, int64_t n_heads, int64_t head_dim,
                   int64_t rot_dim, const Angles& angles, float freq_base,
                   const float* freq_factors);

 private:
  struct Entry {
    int64_t rot_dim;
    float freq_base;
    std::vector<float> freq_factors;  // empty: none
    std::shared_ptr<const Angles> angles;
  };
  std::mutex mu_;
  std::vector<Entry> entries_;
};

}  // namespace cb
