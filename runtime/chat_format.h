// Chat formats: how a conversation becomes prompt text for the model
// families the runtime knows.  A model's format comes from its GGUF
// tokenizer.chat_template (Jinja text, recognised by its markers as
// llama.cpp does, not executed) or from the control tokens of its
// vocabulary; a caller may name one instead.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace cb {

class Tokenizer;

enum class ChatFormat {
  kChatML,  // <|im_start|>{role}\n{content}<|im_end|>\n  (SmolLM2, Qwen)
  kLlama3,  // <|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>
  kGemma,   // <start_of_turn>{role}\n{content}<end_of_turn>\n  (assistant is "model")
};
const char* chat_format_name(ChatFormat f);  // "chatml", "llama3", "gemma"
std::optional<ChatFormat> parse_chat_format(std::string_view name);

// A model's format from its tokenizer.chat_template (none: the file has
// no template) and vocabulary.  Throws cb::Error(kUnsupported) when the
// template is none of the known families (the message quotes its start) or
// when there is no template and no family's control tokens.
ChatFormat detect_chat_format(const std::optional<std::string>& chat_template,
                              const Tokenizer& tok);

// The system message a ChatML template writes when the conversation has
// none (Qwen2.5's "You are Qwen, created by Alibaba Cloud. You are a
// helpful assistant.", SmolLM2's "You are a helpful AI assistant named
// SmolLM, ..."): the text of a string literal in the template that opens a
// system turn and closes it with fixed text.  Empty when the template has
// none (or for the other formats).
std::string chat_default_system(ChatFormat f, const std::optional<std::string>& chat_template);

struct ChatMessage {
  std::string role;
  std::string content;
};
// The conversation as prompt text; with add_assistant_header the opening of
// the assistant's turn follows.  A format without a system role (Gemma)
// puts system text at the start of the next user turn, as its template does.
// A non-empty default_system opens the conversation as a system message
// when it has none (chat_default_system: as the model's template does).
std::string format_chat(ChatFormat f, std::span<const ChatMessage> messages,
                        bool add_assistant_header, std::string_view default_system = {});

// A RAG request's text around its chunks and question: `head` is the system
// turn and the opening of the user turn (the prompt head P); `after_question`
// closes the user turn and opens the assistant's.
struct RagTurns {
  std::string head;
  std::string after_question;
};
RagTurns rag_turns(ChatFormat f, std::string_view system_prompt);

}  // namespace cb
