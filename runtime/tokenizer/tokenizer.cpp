#include "runtime/tokenizer/tokenizer.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <memory>
#include <utility>

#include "platform/error.h"
#include "platform/utf8.h"
#include "runtime/tokenizer/byte_bpe.h"
#include "runtime/tokenizer/pretokenizer.h"
#include "runtime/tokenizer/special_tokens.h"
#include "runtime/tokenizer/spm_bpe.h"
#include "runtime/tokenizer/token_index.h"
#include "runtime/tokenizer/unicode.h"

namespace cb {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's space
// The bytes of text the byte-level pre-tokenizer takes at once, at least.
constexpr size_t kPreTokenizerWindow = size_t{1} << 20;

void check_id(int32_t id, size_t n, const char* what) {
  if (id < -1 || (id >= 0 && static_cast<size_t>(id) >= n)) {
    fail(ErrorCode::kFormat, std::string("tokenizer: ") + what + " id " + std::to_string(id) +
                                 " is outside the vocabulary of " + std::to_string(n) + " tokens");
  }
}

// The byte a SentencePiece byte token "<0xXX>" stands for.
uint8_t parse_byte_token(const std::string& text, size_t id) {
  unsigned value = 0;
  const bool ok =
      text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>' &&
      std::from_chars(text.data() + 3, text.data() + 5, value, 16).ptr == text.data() + 5;
  if (!ok) {
    fail(ErrorCode::kFormat,
         "tokenizer: byte token " + std::to_string(id) + " '" + text + "' is not <0xXX>");
  }
  return static_cast<uint8_t>(value);
}

// Text of a byte-level BPE token back to its bytes.
std::string decode_byte_level(std::string_view text) {
  std::string bytes;
  bytes.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const Utf8Char c = utf8_char(text, i);
    const size_t len = c.valid ? c.len : 1;
    const int byte = c.valid ? tok::unicode_to_byte(c.cp) : -1;
    if (byte >= 0) {
      bytes.push_back(static_cast<char>(byte));
    } else {
      // Not produced by the byte mapping: keep the text as it is.
      bytes.append(text.substr(i, len));
    }
    i += len;
  }
  return bytes;
}

std::string replace_space_marks(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, kSpaceMark.size(), kSpaceMark) == 0) {
      out.push_back(' ');
      i += kSpaceMark.size();
    } else {
      out.push_back(text[i++]);
    }
  }
  return out;
}

}  // namespace

struct Tokenizer::Impl {
  TokenizerVocab vocab;
  bool byte_level = false;  // gpt2; otherwise SentencePiece ("llama")
  bool add_space_prefix = false;
  std::vector<int32_t> types;  // effective TokenType per token
  tok::TokenIndex index;
  std::unique_ptr<tok::PreTokenizer> pre;
  std::unique_ptr<tok::ByteLevelBpe> bpe;
  std::unique_ptr<tok::SentencePieceBpe> spm;
  std::unique_ptr<tok::SpecialTokenSplitter> specials;
  // Rendered piece of every token without special rendering, concatenated.
  std::string pieces;
  std::vector<uint32_t> piece_offsets;
  std::vector<int32_t> eog_ids;

  explicit Impl(TokenizerVocab v);
  TokenType type(int32_t id) const { return static_cast<TokenType>(types[id]); }
  std::string_view piece(int32_t id, bool render_special) const;
  void check_decodable(int32_t id) const;
};

Tokenizer::Impl::Impl(TokenizerVocab v) : vocab(std::move(v)) {
  const size_t n = vocab.tokens.size();
  if (vocab.model == "gpt2") {
    byte_level = true;
  } else if (vocab.model != "llama") {
    fail(ErrorCode::kUnsupported, "unsupported tokenizer model '" + vocab.model + "'");
  }
  if (n == 0) fail(ErrorCode::kFormat, "tokenizer: empty vocabulary");
  if (n > static_cast<size_t>(INT32_MAX)) fail(ErrorCode::kFormat, "tokenizer: vocabulary too big");
  if (!vocab.scores.empty() && vocab.scores.size() != n) {
    fail(ErrorCode::kFormat, "tokenizer: " + std::to_string(vocab.scores.size()) + " scores for " +
                                 std::to_string(n) + " tokens");
  }
  if (!vocab.token_types.empty() && vocab.token_types.size() != n) {
    fail(ErrorCode::kFormat, "tokenizer: " + std::to_string(vocab.token_types.size()) +
                                 " token types for " + std::to_string(n) + " tokens");
  }
  if (!byte_level && vocab.scores.empty()) {
    fail(ErrorCode::kFormat, "tokenizer: a SentencePiece vocabulary needs token scores");
  }
  check_id(vocab.bos_id, n, "BOS");
  check_id(vocab.eos_id, n, "EOS");
  check_id(vocab.eot_id, n, "EOT");
  check_id(vocab.unk_id, n, "unknown");
  check_id(vocab.pad_id, n, "padding");
  if (vocab.add_bos && vocab.bos_id < 0) fail(ErrorCode::kFormat, "tokenizer: add_bos without BOS");
  if (vocab.add_eos && vocab.eos_id < 0) fail(ErrorCode::kFormat, "tokenizer: add_eos without EOS");

  types = std::move(vocab.token_types);
  if (types.empty()) types.assign(n, static_cast<int32_t>(TokenType::kNormal));
  for (size_t i = 0; i < n; ++i) {
    if (types[i] < 0 || types[i] > static_cast<int32_t>(TokenType::kByte)) {
      fail(ErrorCode::kFormat,
           "tokenizer: token " + std::to_string(i) + " has type " + std::to_string(types[i]));
    }
  }
  // End-of-generation tokens: EOS, EOT and the usual end-of-turn texts.
  // They are control tokens whatever the file says (as llama.cpp forces), so
  // that plain text never turns into them and decode hides them.
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i);
    const bool eog_text = tok::is_end_of_generation_text(vocab.tokens[i]);
    if (eog_text) types[i] = static_cast<int32_t>(TokenType::kControl);
    if (eog_text || id == vocab.eos_id || id == vocab.eot_id || id == vocab.eom_id)
      eog_ids.push_back(id);
  }

  index = tok::TokenIndex(vocab.tokens);
  specials = std::make_unique<tok::SpecialTokenSplitter>(vocab.tokens, types);
  if (byte_level) {
    const tok::PreTokenizerSpec spec = tok::pre_tokenizer_spec(vocab.pre);
    pre = std::make_unique<tok::PreTokenizer>(spec.steps);
    // Some vocabularies lack tokens for a few bytes (SmolLM2 has none for
    // 21, e.g. 0x04 and 0xFF).  A genuine unknown token may stand in; a
    // control token such as SmolLM2's <|endoftext|> must not, so the byte is
    // dropped then, as llama.cpp does.
    const bool real_unk = vocab.unk_id >= 0 && type(vocab.unk_id) == TokenType::kUnknown;
    bpe = std::make_unique<tok::ByteLevelBpe>(index, vocab.merges, spec.ignore_merges,
                                              real_unk ? vocab.unk_id : -1);
    // The ranks are in bpe now; Llama 3's 280,000 merge texts would hold
    // about 9 MiB for the model's lifetime.
    vocab.merges = {};
  } else {
    add_space_prefix = vocab.add_space_prefix.value_or(true);
    spm = std::make_unique<tok::SentencePieceBpe>(index, vocab.unk_id);
  }

  piece_offsets.reserve(n + 1);
  for (size_t i = 0; i < n; ++i) {
    piece_offsets.push_back(static_cast<uint32_t>(pieces.size()));
    const std::string& text = vocab.tokens[i];
    switch (type(static_cast<int32_t>(i))) {
      case TokenType::kNormal:
        pieces += byte_level ? decode_byte_level(text) : replace_space_marks(text);
        break;
      case TokenType::kByte:
        if (byte_level) {
          pieces += decode_byte_level(text);
        } else {
          pieces.push_back(static_cast<char>(parse_byte_token(text, i)));
        }
        break;
      case TokenType::kUserDefined:
        pieces += text;
        break;
      default:  // control and unknown render only on request; unused never
        break;
    }
  }
  piece_offsets.push_back(static_cast<uint32_t>(pieces.size()));
}

void Tokenizer::Impl::check_decodable(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= vocab.tokens.size()) {
    fail(ErrorCode::kInvalidArgument, "token id " + std::to_string(id) +
                                          " is outside the vocabulary of " +
                                          std::to_string(vocab.tokens.size()) + " tokens");
  }
}

std::string_view Tokenizer::Impl::piece(int32_t id, bool render_special) const {
  check_decodable(id);
  if (render_special) {
    const TokenType t = type(id);
    if (t == TokenType::kControl || t == TokenType::kUnknown) return vocab.tokens[id];
  }
  return std::string_view(pieces).substr(piece_offsets[id],
                                         piece_offsets[id + 1] - piece_offsets[id]);
}

Tokenizer::Tokenizer(TokenizerVocab vocab) : impl_(new Impl(std::move(vocab))) {}
Tokenizer::~Tokenizer() {
  delete impl_;
}
Tokenizer::Tokenizer(Tokenizer&& other) noexcept : impl_(std::exchange(other.impl_, nullptr)) {}
Tokenizer& Tokenizer::operator=(Tokenizer&& other) noexcept {
  if (this != &other) {
    delete impl_;
    impl_ = std::exchange(other.impl_, nullptr);
  }
  return *this;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  const Impl& m = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special && m.vocab.add_bos) out.push_back(m.vocab.bos_id);

  std::vector<tok::Fragment> fragments;
  m.specials->split(text, parse_special, fragments);
  std::vector<std::pair<uint32_t, uint32_t>> words;
  bool after_special = true;  // SentencePiece prefixes a space at the start and after specials
  for (const tok::Fragment& f : fragments) {
    if (f.token >= 0) {
      out.push_back(f.token);
      after_special = true;
      continue;
    }
    const std::string_view raw = text.substr(f.begin, f.end - f.begin);
    if (m.byte_level) {
      // In windows of about kPreTokenizerWindow bytes, cut where no word
      // spans (PreTokenizer::next_cut): the same words, bounded memory.
      for (size_t begin = 0; begin < raw.size();) {
        const size_t end = raw.size() - begin <= kPreTokenizerWindow
                               ? raw.size()
                               : tok::PreTokenizer::next_cut(raw, begin + kPreTokenizerWindow);
        const std::string_view window = raw.substr(begin, end - begin);
        words.clear();
        m.pre->split(window, words);
        for (const auto& [b, e] : words) m.bpe->encode_word(window.substr(b, e - b), m.index, out);
        begin = end;
      }
    } else {
      const std::string escaped =
          tok::SentencePieceBpe::escape_spaces(raw, m.add_space_prefix && after_special);
      m.spm->encode(escaped, m.index, m.vocab.scores, out);
    }
    after_special = false;
  }
  if (add_special && m.vocab.add_eos) out.push_back(m.vocab.eos_id);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool render_special) const {
  const Impl& m = *impl_;
  std::string out;
  // SentencePiece encoding added a space in front of the text; the first
  // piece that renders anything gives it back.
  bool strip_space = !m.byte_level && m.add_space_prefix;
  for (const int32_t id : ids) {
    std::string_view p = m.piece(id, render_special);
    if (strip_space && !p.empty()) {
      if (p.front() == ' ') p.remove_prefix(1);
      strip_space = false;
    }
    out.append(p);
  }
  return out;
}

std::string Tokenizer::token_to_piece(int32_t id, bool render_special) const {
  return std::string(impl_->piece(id, render_special));
}

int32_t Tokenizer::n_vocab() const {
  return static_cast<int32_t>(impl_->vocab.tokens.size());
}
int32_t Tokenizer::bos_id() const {
  return impl_->vocab.bos_id;
}
int32_t Tokenizer::eos_id() const {
  return impl_->vocab.eos_id;
}

bool Tokenizer::is_end_of_generation(int32_t id) const {
  const auto& eog = impl_->eog_ids;
  return std::find(eog.begin(), eog.end(), id) != eog.end();
}

std::optional<int32_t> Tokenizer::find_token(std::string_view text) const {
  const int32_t id = impl_->index.find(text);
  if (id < 0) return std::nullopt;
  return id;
}

}  // namespace cb
