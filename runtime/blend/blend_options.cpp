#include "runtime/blend/blend_options.h"

#include <cmath>
#include <string>

#include "platform/error.h"

namespace cb {

const char* blend_mode_name(BlendMode m) {
  switch (m) {
    case BlendMode::kFull:
      return "full";
    case BlendMode::kPrefix:
      return "prefix";
    case BlendMode::kReuse:
      return "reuse";
    case BlendMode::kBlend:
      return "blend";
  }
  return "?";
}

std::optional<BlendMode> parse_blend_mode(std::string_view name) {
  for (BlendMode m : {BlendMode::kFull, BlendMode::kPrefix, BlendMode::kReuse, BlendMode::kBlend})
    if (name == blend_mode_name(m)) return m;
  return std::nullopt;
}

const char* selection_name(Selection s) {
  switch (s) {
    case Selection::kHkvd:
      return "hkvd";
    case Selection::kHkvdKv:
      return "hkvd_kv";
    case Selection::kAttention:
      return "attention";
    case Selection::kLookahead:
      return "lookahead";
    case Selection::kRandom:
      return "random";
    case Selection::kOracle:
      return "oracle";
    case Selection::kOracleKl:
      return "oracle_kl";
  }
  return "?";
}

std::optional<Selection> parse_selection(std::string_view name) {
  for (Selection s :
       {Selection::kHkvd, Selection::kHkvdKv, Selection::kAttention, Selection::kLookahead,
        Selection::kRandom, Selection::kOracle, Selection::kOracleKl})
    if (name == selection_name(s)) return s;
  return std::nullopt;
}

Selection default_selection() {
  return Selection::kLookahead;
}

int64_t first_check_layer(Selection s) {
  switch (s) {
    case Selection::kLookahead:
    case Selection::kRandom:
    case Selection::kOracle:
    case Selection::kOracleKl:
      return 0;
    case Selection::kHkvd:
    case Selection::kHkvdKv:
    case Selection::kAttention:
      break;
  }
  return 1;
}

std::vector<CheckLayer> single_check_schedule(Selection s, float ratio) {
  // Filled element by element: a braced list of aggregates here trips a
  // GCC 12 -Wmaybe-uninitialized false positive in every includer.
  std::vector<CheckLayer> out(1);
  out[0].layer = first_check_layer(s);
  out[0].ratio = ratio;
  return out;
}

void validate_blend_options(const BlendOptions& opts, int64_t n_layer) {
  if (opts.mode != BlendMode::kBlend) return;
  if (opts.schedule.empty())
    fail(ErrorCode::kInvalidArgument, "blend needs at least one check layer");
  int64_t prev_layer = -1;
  float prev_ratio = 1.0f;
  for (const CheckLayer& c : opts.schedule) {
    if (c.layer < 0 || c.layer >= n_layer)
      fail(ErrorCode::kInvalidArgument, "check layer " + std::to_string(c.layer) +
                                            " does not exist (the model has layers 0.." +
                                            std::to_string(n_layer - 1) + ")");
    if (c.layer <= prev_layer)
      fail(ErrorCode::kInvalidArgument, "check layers must be in increasing order");
    if (!(c.ratio >= 0.0f && c.ratio <= 1.0f) || std::isnan(c.ratio))
      fail(ErrorCode::kInvalidArgument,
           "recompute ratio " + std::to_string(c.ratio) + " is outside [0, 1]");
    if (c.ratio > prev_ratio)
      fail(ErrorCode::kInvalidArgument, "ratios must not grow along the schedule");
    prev_layer = c.layer;
    prev_ratio = c.ratio;
  }
  if (opts.sink_tokens < 0 || opts.sink_tokens > (int64_t{1} << 20))
    fail(ErrorCode::kInvalidArgument,
         "sink_tokens " + std::to_string(opts.sink_tokens) + " is outside 0..1048576");
  if (!(opts.guard_share >= 0.0f && opts.guard_share <= 1.0f))
    fail(ErrorCode::kInvalidArgument, "guard share is outside [0, 1]");
  if (!(opts.guard_max_ratio >= 0.0f && opts.guard_max_ratio <= 1.0f))
    fail(ErrorCode::kInvalidArgument, "guard's maximum ratio is outside [0, 1]");
  if (!(opts.shift_probes >= 0.0f && opts.shift_probes <= 1.0f))
    fail(ErrorCode::kInvalidArgument, "shift probes' share is outside [0, 1]");
  if (opts.shift_span < 0 || opts.shift_span > (int64_t{1} << 20))
    fail(ErrorCode::kInvalidArgument,
         "shift span " + std::to_string(opts.shift_span) + " is outside 0..1048576");
  if (!(opts.context_scale >= kMinContextScale && opts.context_scale <= kMaxContextScale))
    fail(ErrorCode::kInvalidArgument,
         "context scale " + std::to_string(opts.context_scale) + " is outside [0.01, 100]");
}

}  // namespace cb
