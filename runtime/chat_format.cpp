#include "runtime/chat_format.h"

#include <algorithm>
#include <array>

#include "platform/error.h"
#include "runtime/tokenizer/tokenizer.h"

namespace cb {
namespace {

// Each family's opening of a turn, the marker that identifies its template
// text and its vocabulary.
struct Family {
  ChatFormat format;
  const char* name;
  std::string_view marker;
};
constexpr std::array<Family, 3> kFamilies = {{
    {ChatFormat::kChatML, "chatml", "<|im_start|>"},
    {ChatFormat::kLlama3, "llama3", "<|start_header_id|>"},
    {ChatFormat::kGemma, "gemma", "<start_of_turn>"},
}};

std::string open_turn(ChatFormat f, std::string_view role) {
  switch (f) {
    case ChatFormat::kChatML:
      return "<|im_start|>" + std::string(role) + "\n";
    case ChatFormat::kLlama3:
      return "<|start_header_id|>" + std::string(role) + "<|end_header_id|>\n\n";
    case ChatFormat::kGemma:
      return "<start_of_turn>" + std::string(role == "assistant" ? "model" : role) + "\n";
  }
  return {};
}

const char* close_turn(ChatFormat f) {
  switch (f) {
    case ChatFormat::kChatML:
      return "<|im_end|>\n";
    case ChatFormat::kLlama3:
      return "<|eot_id|>";
    case ChatFormat::kGemma:
      return "<end_of_turn>\n";
  }
  return "";
}

// The first line of a template, shortened, for an error message.
std::string template_start(const std::string& t) {
  std::string line = t.substr(0, t.find('\n'));
  if (line.size() > 60) line = line.substr(0, 57) + "...";
  return line;
}

}  // namespace

const char* chat_format_name(ChatFormat f) {
  for (const Family& fam : kFamilies)
    if (fam.format == f) return fam.name;
  return "unknown";
}

std::optional<ChatFormat> parse_chat_format(std::string_view name) {
  for (const Family& fam : kFamilies)
    if (name == fam.name) return fam.format;
  return std::nullopt;
}

ChatFormat detect_chat_format(const std::optional<std::string>& tmpl, const Tokenizer& tok) {
  if (tmpl) {
    for (const Family& fam : kFamilies)
      if (tmpl->find(fam.marker) != std::string::npos) return fam.format;
    fail(ErrorCode::kUnsupported,
         "the model's chat template is not one this runtime knows (chatml, llama3, gemma): '" +
             template_start(*tmpl) +
             "'; name the family explicitly (the C API's chat_template option)");
  }
  for (const Family& fam : kFamilies)
    if (tok.find_token(fam.marker)) return fam.format;
  fail(ErrorCode::kUnsupported,
       "the model has no chat template (tokenizer.chat_template) and none of the known "
       "families' control tokens; name the family explicitly (the C API's chat_template option)");
}

std::string chat_default_system(ChatFormat f, const std::optional<std::string>& chat_template) {
  if (f != ChatFormat::kChatML || !chat_template) return {};
  // In the template's source the newline is the two characters \n of a
  // string literal (or, rarely, a newline itself).
  const std::string& t = *chat_template;
  for (std::string_view open : {"<|im_start|>system\\n", "<|im_start|>system\n"}) {
    for (size_t at = t.find(open); at != std::string::npos; at = t.find(open, at + 1)) {
      const size_t begin = at + open.size();
      const size_t end = t.find("<|im_end|>", begin);
      if (end == std::string::npos) break;
      const std::string_view text(t.data() + begin, end - begin);
      // A fixed text: not the end of the literal ('...' + messages[0]...),
      // no Jinja, no quote.
      if (text.empty() || text.find_first_of("'\"{}") != std::string_view::npos) continue;
      std::string out;  // the literal's escapes \n and \t as the characters
      for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '\\' && i + 1 < text.size() && (text[i + 1] == 'n' || text[i + 1] == 't')) {
          out += text[++i] == 'n' ? '\n' : '\t';
        } else {
          out += text[i];
        }
      }
      return out;
    }
  }
  return {};
}

std::string format_chat(ChatFormat f, std::span<const ChatMessage> messages,
                        bool add_assistant_header, std::string_view default_system) {
  std::string out, pending_system;
  const bool has_system = std::any_of(messages.begin(), messages.end(),
                                      [](const ChatMessage& m) { return m.role == "system"; });
  if (!default_system.empty() && !has_system)
    out += open_turn(f, "system") + std::string(default_system) + close_turn(f);
  for (const ChatMessage& msg : messages) {
    if (f == ChatFormat::kGemma && msg.role == "system") {
      pending_system += msg.content + "\n\n";
      continue;
    }
    out += open_turn(f, msg.role);
    if (msg.role == "user") out += pending_system;
    if (msg.role == "user") pending_system.clear();
    out += msg.content;
    out += close_turn(f);
  }
  if (!pending_system.empty()) out += open_turn(f, "user") + pending_system + close_turn(f);
  if (add_assistant_header) out += open_turn(f, "assistant");
  return out;
}

RagTurns rag_turns(ChatFormat f, std::string_view system_prompt) {
  RagTurns t;
  if (f == ChatFormat::kGemma) {
    t.head = open_turn(f, "user") + std::string(system_prompt) + "\n\n";
  } else {
    t.head =
        open_turn(f, "system") + std::string(system_prompt) + close_turn(f) + open_turn(f, "user");
  }
  t.after_question = close_turn(f) + open_turn(f, "assistant");
  return t;
}

}  // namespace cb
