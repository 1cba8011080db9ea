#include "runtime/generator.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "platform/error.h"

namespace cb {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Chosen tokens held back while their text could be the start of a stop
// string (never without stop strings), and given to the sink once it is
// known to be visible.
class HeldTokens {
 public:
  void push(int32_t t, std::string piece) {
    text_ += piece;
    held_.emplace_back(t, std::move(piece));
  }
  const std::string& text() const { return text_; }
  bool empty() const { return held_.empty(); }
  void clear() {
    held_.clear();
    text_.clear();
  }

  // Gives the sink the held tokens whose text ends within the first
  // `visible` bytes of text() (all of them: SIZE_MAX); with `cut`, also the
  // one in which `visible` falls, its piece ending there.  Counts each one
  // given in n_given.  false: the sink said stop.
  bool release(size_t visible, bool cut, const TokenSink& sink, int32_t& n_given) {
    size_t begin = 0, n_done = 0;
    bool go_on = true;
    for (const auto& [t, piece] : held_) {
      const size_t end = begin + piece.size();
      const bool whole = end <= visible;
      if (!whole && !(cut && visible > begin)) break;
      const std::string part = whole ? std::string() : piece.substr(0, visible - begin);
      ++n_given;
      ++n_done;
      if (!sink(t, whole ? piece : part)) {
        go_on = false;
        break;
      }
      if (!whole) break;
      begin = end;
    }
    held_.erase(held_.begin(), held_.begin() + static_cast<std::ptrdiff_t>(n_done));
    text_.erase(0, std::min(begin, text_.size()));
    return go_on;
  }

 private:
  std::vector<std::pair<int32_t, std::string>> held_;
  std::string text_;
};

}  // namespace

std::span<const float> Generator::feed(std::span<const int32_t> tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size()) + (pending_ >= 0 ? 1 : 0);
  const int64_t n_ctx = s_.n_ctx();
  if (n > n_ctx - s_.n_past())
    fail(ErrorCode::kContextOverflow,
         std::to_string(tokens.size()) + " tokens do not fit in the context: " +
             std::to_string(n_past()) + " of " + std::to_string(n_ctx) + " positions are used");
  // A failed or cancelled prefill leaves everything as it was (the session
  // restores n_past; the logits are not touched until success).
  if (pending_ < 0) {
    auto logits = s_.prefill(tokens);
    has_logits_ = false;
    return logits;
  }
  std::vector<int32_t> all;
  all.reserve(tokens.size() + 1);
  all.push_back(pending_);
  all.insert(all.end(), tokens.begin(), tokens.end());
  auto logits = s_.prefill(all);
  pending_ = -1;
  has_logits_ = false;
  return logits;
}

std::span<const float> Generator::prefill(std::span<const int32_t> tokens) {
  const auto t0 = std::chrono::steady_clock::now();
  auto logits = feed(tokens);
  set_logits(logits, ms_since(t0));
  return logits_;
}

std::span<const float> Generator::logits() const {
  return has_logits_ ? std::span<const float>(logits_) : std::span<const float>();
}

void Generator::set_logits(std::span<const float> logits, double prefill_ms) {
  if (logits.data() != logits_.data()) logits_.assign(logits.begin(), logits.end());
  has_logits_ = true;
  pending_ = -1;
  logits_prefill_ms_ = prefill_ms;
}

void Generator::reset() {
  s_.truncate(0);
  pending_ = -1;
  has_logits_ = false;
}

GenerationStats Generator::generate(std::span<const int32_t> prompt, const GenerationOptions& opts,
                                    Sampler& sampler, const StopStrings& stops,
                                    const TokenSink& sink,
                                    std::chrono::steady_clock::time_point start) {
  if (opts.max_tokens < 0) fail(ErrorCode::kInvalidArgument, "max_tokens must be >= 0");
  const Tokenizer& tok = s_.model().tokenizer();
  GenerationStats st;

  // Prompt.
  std::span<const float> logits;
  double earlier_ms = 0.0;  // a prefill call that this one continues
  if (!prompt.empty() || pending_ >= 0) {
    const auto tp = std::chrono::steady_clock::now();
    logits = feed(prompt);
    st.prefill_ms = ms_since(tp);
  } else {
    if (!has_logits_)
      fail(ErrorCode::kInvalidArgument,
           "the prompt is empty and the session holds no tokens to continue from");
    logits = logits_;
    // The request began with the prefill call that left these logits.
    earlier_ms = st.prefill_ms = logits_prefill_ms_;
    logits_prefill_ms_ = 0.0;
  }
  st.n_prompt = static_cast<int32_t>(prompt.size());
  st.ttft_ms = earlier_ms + ms_since(start);

  // Generation.
  double decode_ms = 0.0;
  int32_t n_decode = 0, n_chosen = 0;
  HeldTokens held;
  for (;;) {
    if (n_chosen >= opts.max_tokens) {
      st.stop = StopReason::kMaxTokens;
      break;
    }
    const auto ts = std::chrono::steady_clock::now();
    const int32_t t = sampler.sample(logits);
    if (n_decode > 0 || n_chosen > 0) decode_ms += ms_since(ts);
    if (opts.stop_at_end_of_generation && tok.is_end_of_generation(t)) {
      st.stop = StopReason::kEndOfGeneration;
      break;
    }
    if (s_.n_past() >= s_.n_ctx()) {
      st.stop = StopReason::kContextFull;
      break;
    }
    if (n_chosen == 0) st.ttft_ms = earlier_ms + ms_since(start);
    ++n_chosen;
    sampler.accept(t);
    pending_ = t;
    held.push(t, tok.token_to_piece(t));
    const StopStrings::Cut c = stops.cut(held.text());
    if (!held.release(c.visible, c.stopped, sink, st.n_generated)) {
      st.stop = StopReason::kCancelled;
      break;
    }
    if (c.stopped) {
      held.clear();
      st.stop = StopReason::kStopString;
      break;
    }
    if (n_chosen >= opts.max_tokens) {
      st.stop = StopReason::kMaxTokens;
      break;
    }
    if (s_.stop_requested()) {
      st.stop = StopReason::kCancelled;
      st.aborted = true;
      break;
    }
    const auto td = std::chrono::steady_clock::now();
    logits = s_.decode(t);
    pending_ = -1;
    decode_ms += ms_since(td);
    ++n_decode;
  }
  // Ended for another reason than a stop string or the sink: what was held
  // back is text like any other.
  if (st.stop != StopReason::kCancelled && !held.empty() &&
      !held.release(SIZE_MAX, false, sink, st.n_generated))
    st.stop = StopReason::kCancelled;
  st.decode_ms = decode_ms;
  st.tok_s = decode_ms > 0.0 ? n_decode * 1000.0 / decode_ms : 0.0;
  // Keep the logits of the last token in the KV cache so that a call with
  // an empty prompt can continue; with a pending token they are not needed.
  if (pending_ < 0) {
    if (logits.data() != logits_.data()) logits_.assign(logits.begin(), logits.end());
    has_logits_ = true;
    logits_prefill_ms_ = 0.0;  // this call reported its own time
  } else {
    has_logits_ = false;
  }
  return st;
}

}  // namespace cb
