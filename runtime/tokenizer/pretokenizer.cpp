#include "runtime/tokenizer/pretokenizer.h"

#include <algorithm>
#include <cstdio>
#include <mutex>

#include "platform/error.h"
#include "runtime/tokenizer/unicode.h"

namespace cb::tok {
namespace {

using Ends = std::vector<uint32_t>;  // end unit index of each piece, in order

bool is_letter(const DecodedText& t, uint32_t i) {
  return t.classes[i] & kClassLetter;
}
bool is_number(const DecodedText& t, uint32_t i) {
  return t.classes[i] & kClassNumber;
}
bool is_space(const DecodedText& t, uint32_t i) {
  return t.classes[i] & kClassWhitespace;
}
bool is_other(const DecodedText& t, uint32_t i) {
  return !(t.classes[i] & (kClassLetter | kClassNumber | kClassWhitespace));
}
bool is_cr_lf(const DecodedText& t, uint32_t i) {
  return t.units[i] == '\r' || t.units[i] == '\n';
}

uint32_t ascii_lower(uint32_t c) {
  return (c >= 'A' && c <= 'Z') ? c + ('a' - 'A') : c;
}

// Length of the contraction 's|'t|'re|'ve|'m|'ll|'d at `pos`, or 0.
uint32_t contraction(const DecodedText& t, uint32_t pos, uint32_t end, bool ignore_case) {
  if (t.units[pos] != '\'' || pos + 1 >= end) return 0;
  const auto fold = [&](uint32_t c) { return ignore_case ? ascii_lower(c) : c; };
  const uint32_t c1 = fold(t.units[pos + 1]);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (pos + 2 >= end) return 0;
  const uint32_t c2 = fold(t.units[pos + 2]);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

// \s+(?!\S)|\s+ at `pos` (a whitespace unit): a run of whitespace followed
// by a non-space gives that last whitespace to the next word (" word").
uint32_t whitespace_match(const DecodedText& t, uint32_t pos, uint32_t end) {
  uint32_t n = 0;
  while (pos + n < end && is_space(t, pos + n)) ++n;
  if (n > 1 && pos + n < end) return n - 1;
  return n;
}

template <typename Pred>
uint32_t run(uint32_t pos, uint32_t end, Pred pred) {
  while (pos < end && pred(pos)) ++pos;
  return pos;
}

void split_gpt2(const DecodedText& t, uint32_t begin, uint32_t end, Ends& out) {
  uint32_t pos = begin;
  while (pos < end) {
    if (const uint32_t n = contraction(t, pos, end, /*ignore_case=*/false)) {
      pos += n;
      out.push_back(pos);
      continue;
    }
    // " ?X+" for X in \p{L}, \p{N}, [^\s\p{L}\p{N}]: an optional leading space.
    const uint32_t first = (t.units[pos] == ' ' && pos + 1 < end) ? pos + 1 : pos;
    if (is_letter(t, first)) {
      pos = run(first, end, [&](uint32_t i) { return is_letter(t, i); });
    } else if (is_number(t, first)) {
      pos = run(first, end, [&](uint32_t i) { return is_number(t, i); });
    } else if (is_other(t, first)) {
      pos = run(first, end, [&](uint32_t i) { return is_other(t, i); });
    } else {
      pos += whitespace_match(t, pos, end);
    }
    out.push_back(pos);
  }
}

// Llama 3's regex; qwen2's is the same with \p{N} for \p{N}{1,3}
// (max_digits 1).
void split_llama3(const DecodedText& t, uint32_t begin, uint32_t end, uint32_t max_digits,
                  Ends& out) {
  uint32_t pos = begin;
  while (pos < end) {
    if (const uint32_t n = contraction(t, pos, end, /*ignore_case=*/true)) {
      pos += n;
      out.push_back(pos);
      continue;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (!is_cr_lf(t, pos) && !is_number(t, pos) &&
        (is_letter(t, pos) || (pos + 1 < end && is_letter(t, pos + 1)))) {
      pos = run(pos + 1, end, [&](uint32_t i) { return is_letter(t, i); });
      out.push_back(pos);
      continue;
    }
    // \p{N}{1,max_digits}
    if (is_number(t, pos)) {
      const uint32_t limit = std::min(end, pos + max_digits);
      pos = run(pos, limit, [&](uint32_t i) { return is_number(t, i); });
      out.push_back(pos);
      continue;
    }
    // " ?[^\s\p{L}\p{N}]+[\r\n]*"
    const uint32_t first = (t.units[pos] == ' ' && pos + 1 < end) ? pos + 1 : pos;
    if (is_other(t, first)) {
      pos = run(first, end, [&](uint32_t i) { return is_other(t, i); });
      pos = run(pos, end, [&](uint32_t i) { return is_cr_lf(t, i); });
      out.push_back(pos);
      continue;
    }
    // \s*[\r\n]+ ends after the last line break of the whitespace run.
    uint32_t n = 0;
    uint32_t after_break = 0;
    while (pos + n < end && is_space(t, pos + n)) {
      if (is_cr_lf(t, pos + n)) after_break = pos + n + 1;
      ++n;
    }
    pos = after_break ? after_break : pos + whitespace_match(t, pos, end);
    out.push_back(pos);
  }
}

// A regex that only isolates its matches: unmatched stretches between them
// stay pieces of their own (llama.cpp's unicode_regex_split_stl).
template <typename MatchLen>
void isolate_matches(uint32_t begin, uint32_t end, Ends& out, MatchLen match_len) {
  uint32_t pos = begin;
  uint32_t pending = begin;
  while (pos < end) {
    const uint32_t n = match_len(pos);
    if (n == 0) {
      ++pos;
      continue;
    }
    if (pos > pending) out.push_back(pos);
    pos += n;
    out.push_back(pos);
    pending = pos;
  }
  if (end > pending) out.push_back(end);
}

bool is_default_punctuation(const DecodedText& t, uint32_t i) {
  if (t.classes[i] & kClassPunctuation) return true;
  switch (t.units[i]) {
    case '$':
    case '+':
    case '<':
    case '=':
    case '>':
    case '^':
    case '~':
    case '|':
      return true;
    default:
      return false;
  }
}

bool is_ascii_digit(const DecodedText& t, uint32_t i) {
  return t.units[i] >= '0' && t.units[i] <= '9';
}

void apply_step(SplitStep step, const DecodedText& t, uint32_t begin, uint32_t end, Ends& out) {
  switch (step) {
    case SplitStep::kGpt2:
      split_gpt2(t, begin, end, out);
      return;
    case SplitStep::kLlama3:
      split_llama3(t, begin, end, 3, out);
      return;
    case SplitStep::kQwen2:
      split_llama3(t, begin, end, 1, out);
      return;
    case SplitStep::kEachNumber:
      isolate_matches(begin, end, out, [&](uint32_t i) { return is_number(t, i) ? 1u : 0u; });
      return;
    case SplitStep::kNumberRuns:
      isolate_matches(begin, end, out, [&](uint32_t i) {
        return run(i, end, [&](uint32_t k) { return is_number(t, k); }) - i;
      });
      return;
    case SplitStep::kPunctuationRuns:
      isolate_matches(begin, end, out, [&](uint32_t i) {
        return run(i, end, [&](uint32_t k) { return is_default_punctuation(t, k); }) - i;
      });
      return;
    case SplitStep::kDigitTriples:
      isolate_matches(begin, end, out, [&](uint32_t i) {
        const bool triple = i + 3 <= end && is_ascii_digit(t, i) && is_ascii_digit(t, i + 1) &&
                            is_ascii_digit(t, i + 2);
        return triple ? 3u : 0u;
      });
      return;
  }
}

}  // namespace

PreTokenizerSpec pre_tokenizer_spec(const std::string& pre) {
  using S = SplitStep;
  // llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEFAULT.
  const PreTokenizerSpec kDefault{
      {S::kPunctuationRuns, S::kGpt2, S::kNumberRuns, S::kDigitTriples}, false, false};
  if (pre.empty()) {
    static std::once_flag warned;
    std::call_once(warned, [] {
      std::fprintf(stderr,
                   "cacheblend: GGUF has no tokenizer.ggml.pre; using llama.cpp's 'default' "
                   "pre-tokenizer (token ids may differ from the model's training)\n");
    });
    return kDefault;
  }
  if (pre == "default") return kDefault;
  if (pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "falcon3") {
    return {{S::kLlama3}, true, true};
  }
  if (pre == "qwen2") return {{S::kQwen2}, false, false};
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "command-r" ||
      pre == "codeshell" || pre == "exaone") {
    return {{S::kEachNumber, S::kGpt2}, false, false};
  }
  if (pre == "gpt2" || pre == "gpt-2" || pre == "phi-2" || pre == "mpt" || pre == "olmo" ||
      pre == "jais") {
    return {{S::kGpt2}, false, false};
  }
  fail(ErrorCode::kUnsupported, "unsupported tokenizer.ggml.pre '" + pre + "'");
}

size_t PreTokenizer::next_cut(std::string_view text, size_t from) {
  const auto ascii_letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  for (size_t i = std::max<size_t>(from, 2); i < text.size(); ++i) {
    if (text[i - 1] == '\n' && text[i - 2] > ' ' && text[i - 2] < 0x7F && ascii_letter(text[i]))
      return i;
  }
  return text.size();
}

void PreTokenizer::split(std::string_view text,
                         std::vector<std::pair<uint32_t, uint32_t>>& words) const {
  if (text.empty()) return;
  DecodedText decoded;
  decode_utf8(text, decoded);
  Ends ends{static_cast<uint32_t>(decoded.units.size())};
  Ends next;
  for (const SplitStep step : steps_) {
    next.clear();
    next.reserve(ends.size() * 2);
    uint32_t begin = 0;
    for (const uint32_t end : ends) {
      apply_step(step, decoded, begin, end, next);
      begin = end;
    }
    ends.swap(next);
  }
  uint32_t begin = 0;
  for (const uint32_t end : ends) {
    words.emplace_back(decoded.offsets[begin], decoded.offsets[end]);
    begin = end;
  }
}

}  // namespace cb::tok
