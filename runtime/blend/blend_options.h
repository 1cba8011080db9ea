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

// How the reused tokens to recompute are ranked at the first check layer.
// Later check layers narrow by V deviation (kHkvd).  Every policy keeps the
// same count, so they compare at equal cost; tokens whose cached KV is
// exact (a leading chunk computed after the request's own head) are never
// candidates, since recomputing them changes nothing.
enum class Selection {
  kHkvd,       // CacheBlend: squared deviation of fresh from cached V
  kHkvdKv,     // deviation of K and V, each KV head's share scaled to its mean
  kAttention,  // each token's contribution to the question's attention at the check layer
  kLookahead,  // a reuse pass first: that contribution summed over all layers
  kRandom,     // seeded uniform pick (baseline)
  kOracle,     // true KV deviation from a full prefill, all layers (study only)
  kOracleKl,   // what exact KV for the token lowers the answer's KL (study only)
};
const char* selection_name(Selection s);
std::optional<Selection> parse_selection(std::string_view name);
// The policy used when the caller names none: kLookahead (the dev-set
// evidence is in docs/FIDELITY.md).
Selection default_selection();
// The ratio used when the caller gives none: 0.2, with kLookahead about a
// quarter of a full prefill's work on requests of 4 chunks.
constexpr float kDefaultRatio = 0.2f;
// Whether BLEND shifts each chunk's other tokens by its recomputed tokens'
// mean correction when the caller does not say (BlendOptions::chunk_shift;
// the dev-set evidence is in docs/FIDELITY.md).
constexpr bool kDefaultChunkShift = true;
// The share of the recomputed count that goes to the chunk shift's probes
// when the caller does not say (BlendOptions::shift_probes; the dev-set
// evidence is in docs/FIDELITY.md).
constexpr float kDefaultShiftProbes = 0.25f;
// The chunk shift's span in tokens when the caller does not say
// (BlendOptions::shift_span; about 4 spans in a retrieved passage of 500
// tokens; the dev-set evidence is in docs/FIDELITY.md).
constexpr int64_t kDefaultShiftSpan = 128;
// Where a policy's single check goes: layer 0 when the ranking is known
// before the pass (lookahead, random, oracle), so no layer computes every
// token; layer 1 for the policies that measure fresh KV (at layer 0 a
// token's KV does not depend on its context, so it deviates nowhere).
int64_t first_check_layer(Selection s);
// [(first_check_layer(s), ratio)].
std::vector<CheckLayer> single_check_schedule(Selection s, float ratio);

// BlendOptions::context_scale's range: beyond it a block of keys is all but
// masked out, or drowns the rest.
inline constexpr float kMinContextScale = 0.01f;
inline constexpr float kMaxContextScale = 100.0f;

struct BlendOptions {
  BlendMode mode = BlendMode::kBlend;
  // Layers before the first check run a full prefill.  Layers must increase
  // and ratios must not: gradual filtering only narrows the set.
  std::vector<CheckLayer> schedule = single_check_schedule(default_selection(), kDefaultRatio);
  Selection selection = default_selection();
  // The first sink_tokens tokens of every reused chunk are recomputed on top
  // of the ratio's count (attention sinks, as EPIC does).
  int64_t sink_tokens = 0;
  uint64_t seed = 0;  // kRandom
  // Quality guard: if the tokens kept at the first check layer hold less
  // than guard_share of the policy's total score, add the next best until
  // they do or the ratio reaches guard_max_ratio.  0: off.
  float guard_share = 0.0f;
  float guard_max_ratio = 0.5f;
  // Context scale (APE's scaling factor, for REUSE and BLEND): the question's
  // rows and everything decoded after them weigh their attention to the
  // reused chunks' keys by this factor against the other keys' (the prompt
  // head, the question, the answer), a correction for reused KV computed
  // without the chunks before it; 1: off.
  float context_scale = 1.0f;
  // Chunk shift (BLEND): at every layer, each reused chunk's tokens that are
  // not recomputed take the mean correction (fresh minus cached K before
  // RoPE, and V) of the chunk's tokens that are, since much of what a
  // chunk's KV lacks without its preceding context is shared by all of its
  // tokens.  Nothing is added where no token of the chunk is recomputed
  // (r = 0 stays REUSE) and nothing is left to add at r = 1 (FULL).
  bool chunk_shift = kDefaultChunkShift;
  // With the chunk shift, this share of the first check's count goes to
  // tokens spread evenly over the reused ones (the probes), the policy
  // choosing the rest; a chunk's correction is then the mean over its
  // probes (over all its recomputed tokens when it has fewer than two).  A
  // policy picks tokens for what they matter to the answer, so their
  // corrections are not those of the tokens it leaves, while evenly spread
  // ones are a fair sample of them.  0: no probes; in [0, 1].
  float shift_probes = kDefaultShiftProbes;
  // With the chunk shift, each chunk is also cut into equal spans of about
  // this many tokens, as many as leave two or more of the tokens the
  // correction is measured on in every span, and a token that is not
  // recomputed takes half its chunk's mean correction and half its span's:
  // what a chunk lacks drifts along it, and the spans' means alone are too
  // noisy (docs/FIDELITY.md).  0: the chunk's mean alone.
  int64_t shift_span = kDefaultShiftSpan;
};

// Throws cb::Error(kInvalidArgument) with the reason when the options cannot
// run on a model of n_layer layers.
void validate_blend_options(const BlendOptions& opts, int64_t n_layer);

}  // namespace cb
