#include "conversation.h"

namespace rag {
namespace {

std::string format_chat(const Model& model, const std::vector<cb_chat_message>& messages) {
  size_t n = 0;
  check(cb_chat_format(model.h, messages.data(), messages.size(), 1, nullptr, 0, &n),
        "cannot lay out a chat turn");
  std::string out(n + 1, '\0');
  check(cb_chat_format(model.h, messages.data(), messages.size(), 1, out.data(), out.size(), &n),
        "cannot lay out a chat turn");
  out.resize(n);
  return out;
}

}  // namespace

FollowUpFrame follow_up_frame(const Model& model) {
  // The template's text between an answer and the next question, and after
  // that question, read off a laid-out conversation with marker contents:
  // whatever the family (ChatML, Llama 3, Gemma), these are its turn
  // boundaries.
  static constexpr std::string_view kAnswer =
      "\x1f"
      "answer"
      "\x1f";
  static constexpr std::string_view kQuestion =
      "\x1f"
      "question"
      "\x1f";
  const std::string a(kAnswer), q(kQuestion);
  const std::string text =
      format_chat(model, {{"user", "first"}, {"assistant", a.c_str()}, {"user", q.c_str()}});
  const size_t at_a = text.find(kAnswer), at_q = text.find(kQuestion);
  if (at_a == std::string::npos || at_q == std::string::npos || at_q < at_a)
    throw Error("the model's chat template does not lay out a follow-up turn");
  FollowUpFrame f;
  f.close_and_open = text.substr(at_a + kAnswer.size(), at_q - at_a - kAnswer.size());
  f.to_answer = text.substr(at_q + kQuestion.size());
  return f;
}

std::string follow_up_text(const std::vector<const ChunkRecord*>& new_chunks,
                           std::string_view question) {
  std::string out;
  for (const ChunkRecord* c : new_chunks) out += c->text + "\n\n";
  out += "Question: ";
  out += question;
  return out;
}

std::string question_with_last_exchange(std::string_view earlier_question,
                                        std::string_view earlier_answer,
                                        std::string_view question) {
  std::string out = "(Earlier in this conversation the question was: ";
  out += earlier_question;
  out += "\nand the answer was: ";
  out += earlier_answer;
  out += ")\n";
  out += question;
  return out;
}

std::string retrieval_query(std::string_view question, std::string_view previous_question) {
  if (previous_question.empty()) return std::string(question);
  return std::string(question) + " " + std::string(previous_question);
}

std::vector<const ChunkRecord*> Conversation::new_chunks(
    const std::vector<ChunkRecord>& retrieved) const {
  std::vector<const ChunkRecord*> out;
  for (const ChunkRecord& c : retrieved)
    if (!chunks_in_session_.count(c.id)) out.push_back(&c);
  return out;
}

void Conversation::record(const std::string& question, const std::string& answer,
                          const std::vector<ChunkRecord>& retrieved, bool fresh, bool live) {
  if (fresh) chunks_in_session_.clear();
  for (const ChunkRecord& c : retrieved) chunks_in_session_.insert(c.id);
  turns_.emplace_back(question, answer);
  last_sources_ = retrieved;
  live_ = live;
}

void Conversation::clear() {
  turns_.clear();
  chunks_in_session_.clear();
  last_sources_.clear();
  live_ = false;
}

}  // namespace rag
