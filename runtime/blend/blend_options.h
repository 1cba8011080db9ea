// How a request's KV is built: the four modes of CacheBlend's comparison and
// the check-layer schedule of selective recompute.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace cb {

enum class BlendMode {
  kFull,    // plain prefill of every token: exact, slowest
  kPrefix,  // reuse only the leading chunk whose KV was computed after the same head: exact
  kReuse,   // reuse every cached chunk's KV, compute only uncached tokens
  kBlend,   // reuse every chunk, recompute the HKVD tokens per the schedule
};
const char* blend_mode_name(BlendMode m);
std::optional<BlendMode> parse_blend_mode(std::string_view name);

// At `layer`, measure the KV deviation of the reused tokens still carried and
// keep the top `ratio` (a fraction of all reused tokens of the request).
struct CheckLayer {
  int64_t layer = 1;
  float ratio = 0.15f;
};

// [(1, 0.15)]: one check at layer 1, keeping 15 % of the reused tokens.
std::vector<CheckLayer> default_blend_schedule();

struct BlendOptions {
  BlendMode mode = BlendMode::kBlend;
  // Layers before the first check run a full prefill.  Layers must increase
  // and ratios must not: gradual filtering only narrows the set.
  std::vector<CheckLayer> schedule = default_blend_schedule();
};

// Throws cb::Error(kInvalidArgument) with the reason when the options cannot
// run on a model of n_layer layers.
void validate_blend_options(const BlendOptions& opts, int64_t n_layer);

}  // namespace cb
