// Generation on a session, with the state a conversation carries from one
// call to the next: the last generated token (sampled but not yet in the
// KV cache: it goes in with the next prompt) and the logits of the last
// token in the cache (so that a call with an empty prompt continues from
// them).  One thread at a time, like the session.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "runtime/session.h"
#include "runtime/stop_strings.h"

namespace cb {

enum class StopReason {
  kNone,
  kEndOfGeneration,  // the model chose an end-of-generation token
  kMaxTokens,
  kContextFull,
  kStopString,
  kCancelled,  // the sink said stop, or the session's stop check did
};

struct GenerationOptions {
  int32_t max_tokens = 128;
  bool stop_at_end_of_generation = true;
};

struct GenerationStats {
  int32_t n_prompt = 0;
  int32_t n_generated = 0;  // tokens given to the sink
  // From the caller's start to the first token chosen (to the end of the
  // prefill when none is); includes the prefill call these logits came
  // from when the prompt is empty.
  double ttft_ms = 0.0;
  double prefill_ms = 0.0;
  double decode_ms = 0.0;
  double tok_s = 0.0;
  StopReason stop = StopReason::kNone;
  bool aborted = false;  // kCancelled by the session's stop check, not the sink
};

// Receives each generated token and its text (cut short where a stop string
// begins); false stops generation with kCancelled.
using TokenSink = std::function<bool(int32_t token, const std::string& piece)>;

class Generator {
 public:
  explicit Generator(Session& s) : s_(s) {}
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  Session& session() { return s_; }
  // Tokens in the context: the KV cache plus the pending token.
  int64_t n_past() const { return s_.n_past() + (pending_ >= 0 ? 1 : 0); }

  // Feeds the pending token and `tokens` in one forward call and keeps the
  // last token's logits.  Throws kContextOverflow, before anything changes,
  // when they do not fit; a failed or cancelled call changes nothing.
  std::span<const float> prefill(std::span<const int32_t> tokens);
  // The logits of the last token in the KV cache; empty when there are none
  // to give (nothing prefilled yet, or a generated token is pending).
  std::span<const float> logits() const;
  // The KV cache was filled another way (a fused RAG prefill) in
  // `prefill_ms`: its last logits, counted in the next generate()'s TTFT.
  void set_logits(std::span<const float> logits, double prefill_ms);
  // The session is used for other work (a chunk's precompute) or emptied.
  void forget_logits() { has_logits_ = false; }
  // Empties the session and forgets the pending token and the logits.
  void reset();

  // Generates up to opts.max_tokens tokens after `prompt` (empty: continue
  // from the kept logits, else kInvalidArgument), sampling with `sampler`,
  // holding back text that may begin a stop string, calling `sink` per
  // token; `start` is when the caller's request began (for TTFT).
  GenerationStats generate(std::span<const int32_t> prompt, const GenerationOptions& opts,
                           Sampler& sampler, const StopStrings& stops, const TokenSink& sink,
                           std::chrono::steady_clock::time_point start);

 private:
  std::span<const float> feed(std::span<const int32_t> tokens);

  Session& s_;
  std::vector<float> logits_;
  bool has_logits_ = false;
  // The time of the call that produced logits_ (a generate() continuing
  // from them counts it in its TTFT).
  double logits_prefill_ms_ = 0.0;
  int32_t pending_ = -1;
};

}  // namespace cb
