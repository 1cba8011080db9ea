// Chat formats: each family's text written out by hand from its template,
// detection from template text and from the vocabulary, and the RAG turns
// (ChatML's must stay what chunk-cache keys were made with).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "platform/error.h"
#include "runtime/chat_format.h"
#include "runtime/tokenizer/tokenizer.h"

namespace cb {
namespace {

const std::vector<ChatMessage> kChat = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}};

TEST(ChatFormat, ChatML) {
  EXPECT_EQ(format_chat(ChatFormat::kChatML, kChat, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatFormat, Llama3) {
  EXPECT_EQ(format_chat(ChatFormat::kLlama3, kChat, true),
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatFormat, GemmaPutsTheSystemTextInTheFirstUserTurn) {
  EXPECT_EQ(format_chat(ChatFormat::kGemma, kChat, true),
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
            "<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n"
            "<start_of_turn>model\n");
  EXPECT_EQ(format_chat(ChatFormat::kGemma, {}, false), "");
}

TEST(ChatFormat, RagTurnsFrameTheChunksAndTheQuestion) {
  const RagTurns chatml = rag_turns(ChatFormat::kChatML, "Answer.");
  EXPECT_EQ(chatml.head, "<|im_start|>system\nAnswer.<|im_end|>\n<|im_start|>user\n");
  EXPECT_EQ(chatml.after_question, "<|im_end|>\n<|im_start|>assistant\n");
  const RagTurns gemma = rag_turns(ChatFormat::kGemma, "Answer.");
  EXPECT_EQ(gemma.head, "<start_of_turn>user\nAnswer.\n\n");
  EXPECT_EQ(gemma.after_question, "<end_of_turn>\n<start_of_turn>model\n");
  // A RAG request is the chat of one user turn whose text is the chunks and
  // the question, in every family.
  for (ChatFormat f : {ChatFormat::kChatML, ChatFormat::kLlama3, ChatFormat::kGemma}) {
    const RagTurns t = rag_turns(f, "Answer.");
    const std::vector<ChatMessage> chat = {{"system", "Answer."}, {"user", "C1 C2 Q?"}};
    EXPECT_EQ(t.head + "C1 C2 Q?" + t.after_question, format_chat(f, chat, true))
        << chat_format_name(f);
  }
}

// The default system message of a ChatML template: the fixed text of a
// literal that opens a system turn (escapes decoded), not one that goes on
// with the conversation's own system message; none for templates without
// one or for other formats.  format_chat writes it only when the
// conversation has no system message.
TEST(ChatFormat, DefaultSystemFromTheTemplate) {
  const std::string qwen =
      "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + "
      "messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou "
      "are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
      "{%- endif %}";
  EXPECT_EQ(chat_default_system(ChatFormat::kChatML, qwen),
            "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  EXPECT_EQ(chat_default_system(ChatFormat::kChatML,
                                std::string("{{ '<|im_start|>system\\nLine one\\nLine "
                                            "two<|im_end|>\\n' }}")),
            "Line one\nLine two");
  EXPECT_EQ(chat_default_system(ChatFormat::kChatML,
                                std::string("{% for m in messages %}{{'<|im_start|>' + m['role'] "
                                            "+ '\\n' + m['content'] + '<|im_end|>'}}")),
            "");
  EXPECT_EQ(chat_default_system(ChatFormat::kChatML, std::nullopt), "");
  EXPECT_EQ(chat_default_system(ChatFormat::kLlama3, qwen), "");

  const std::vector<ChatMessage> user = {{"user", "Hi"}};
  EXPECT_EQ(format_chat(ChatFormat::kChatML, user, true, "Be brief."),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  const std::vector<ChatMessage> with_system = {{"system", "Be long."}, {"user", "Hi"}};
  EXPECT_EQ(format_chat(ChatFormat::kChatML, with_system, false, "Be brief."),
            "<|im_start|>system\nBe long.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatFormat, NamesRoundTrip) {
  for (ChatFormat f : {ChatFormat::kChatML, ChatFormat::kLlama3, ChatFormat::kGemma})
    EXPECT_EQ(parse_chat_format(chat_format_name(f)), f);
  EXPECT_FALSE(parse_chat_format("vicuna"));
}

// A small byte-level vocabulary and the given control tokens.
Tokenizer vocab_with(const std::vector<std::string>& specials) {
  TokenizerVocab v;
  v.model = "gpt2";
  v.pre = "gpt2";
  for (char c = 'a'; c <= 'z'; ++c) v.tokens.emplace_back(1, c);
  v.token_types.assign(v.tokens.size(), static_cast<int32_t>(TokenType::kNormal));
  for (const std::string& s : specials) {
    v.tokens.push_back(s);
    v.token_types.push_back(static_cast<int32_t>(TokenType::kControl));
  }
  return Tokenizer(std::move(v));
}

TEST(ChatFormat, DetectedFromTheTemplateByItsMarkers) {
  const Tokenizer tok = vocab_with({});
  EXPECT_EQ(detect_chat_format("{% for m in messages %}<|im_start|>{{ m.role }}", tok),
            ChatFormat::kChatML);
  EXPECT_EQ(detect_chat_format("{{ '<|start_header_id|>' + m['role'] }}", tok),
            ChatFormat::kLlama3);
  EXPECT_EQ(detect_chat_format("{{ '<start_of_turn>' + role + '\\n' }}", tok), ChatFormat::kGemma);
  try {
    detect_chat_format("{% for m in messages %}[INST] {{ m.content }} [/INST]", tok);
    FAIL() << "an unknown template must be an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("[INST]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("chat_template"), std::string::npos) << e.what();
  }
}

TEST(ChatFormat, WithoutATemplateTheVocabularyDecides) {
  EXPECT_EQ(detect_chat_format(std::nullopt, vocab_with({"<|im_start|>", "<|im_end|>"})),
            ChatFormat::kChatML);
  EXPECT_EQ(detect_chat_format(std::nullopt, vocab_with({"<start_of_turn>", "<end_of_turn>"})),
            ChatFormat::kGemma);
  EXPECT_THROW(detect_chat_format(std::nullopt, vocab_with({})), Error);
}

}  // namespace
}  // namespace cb
