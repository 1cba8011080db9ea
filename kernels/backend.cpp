// Default implementations of the Backend operations a backend may leave
// alone: the ones whose host version is already what a CPU backend wants.
#include "kernels/backend.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <numeric>
#include <string>
#include <vector>

#include "platform/error.h"

namespace cb {

void top_k_indices(const float* values, int64_t n, int64_t k, int32_t* out) {
  if (n < 0 || k < 0 || k > n || (n > 0 && !values) || (k > 0 && !out))
    fail(ErrorCode::kInvalidArgument, "top_k: bad arguments");
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  // Larger value first, equal values by index.  nth_element is enough: the
  // selected set, not its internal order, matters, and it is re-sorted.
  auto larger = [&](int32_t a, int32_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  };
  std::nth_element(idx.begin(), idx.begin() + k, idx.end(), larger);
  std::sort(idx.begin(), idx.begin() + k);
  std::copy(idx.begin(), idx.begin() + k, out);
}

void copy_to_host(Backend& be, const float* src, int64_t n, float* dst) {
  if (n <= 0) return;
  const int32_t first_row = 0;
  be.gather_rows(src, n, &first_row, 1, dst);
}

void Backend::top_k(const float* values, int64_t n, int64_t k, int32_t* out) {
  top_k_indices(values, n, k, out);
}

void Backend::product(const ProductArgs& a) {
  if (a.w == nullptr || a.n_rows < 0 || (a.gate != ProductArgs::Gate::kNone && a.up == nullptr) ||
      (a.accumulate && a.scratch == nullptr))
    fail(ErrorCode::kInvalidArgument, "product: bad arguments");
  const WeightView& w = *a.w;
  if (a.gate == ProductArgs::Gate::kSilu) silu_mul(a.x, a.up, a.n_rows * w.n_in, a.x);
  if (a.gate == ProductArgs::Gate::kGeluTanh) gelu_mul(a.x, a.up, a.n_rows * w.n_in, a.x);
  float* out = a.accumulate ? a.scratch : a.y;
  if (a.bias != nullptr) {
    matmul_bias(w, a.x, a.n_rows, a.bias, out, a.q8);
  } else if (a.q8) {
    matmul_q8(w, a.x, a.n_rows, out);
  } else {
    matmul(w, a.x, a.n_rows, out);
  }
  if (a.accumulate) add(a.y, out, a.n_rows * w.n_out, a.y);
}

void check_segments(const int32_t* seg, int64_t n_seg) {
  if (n_seg < 0 || (n_seg > 0 && !seg) || (n_seg > 0 && seg[0] < 0))
    fail(ErrorCode::kInvalidArgument, "segment_means: bad segments");
  for (int64_t s = 0; s < n_seg; ++s) {
    if (seg[s + 1] <= seg[s])
      fail(ErrorCode::kInvalidArgument,
           "segment_means: segment " + std::to_string(s) + " is empty or its offsets descend");
  }
}

void Backend::segment_means(float* x, int64_t row_len, const int32_t* seg, int64_t n_seg,
                            float* out) {
  check_segments(seg, n_seg);
  for (int64_t s = 0; s < n_seg; ++s) {
    float* rows = x + static_cast<int64_t>(seg[s]) * row_len;
    const int64_t n0 = seg[s + 1] - seg[s];
    for (int64_t n = n0; n > 1;) {
      const int64_t h = n / 2;
      add(rows, rows + (n - h) * row_len, h * row_len, rows);
      n -= h;
    }
    gather_rows(x, row_len, &seg[s], 1, out + s * row_len);
    scale(out + s * row_len, row_len, 1.0f / static_cast<float>(n0));
  }
}

void* Backend::alloc_host_staging(size_t bytes) {
  void* p = ::operator new (bytes == 0 ? 1 : bytes, std::align_val_t{64}, std::nothrow);
  if (!p) fail(ErrorCode::kOutOfMemory, "cannot allocate " + std::to_string(bytes) + " bytes");
  return p;
}

void Backend::free_host_staging(void* p) {
  ::operator delete (p, std::align_val_t{64});
}

void Backend::upload(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

}  // namespace cb
