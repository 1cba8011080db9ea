// A chat's memory.  The first question is a RAG request (cb_rag_prefill:
// the retrieved chunks' cached KV fused).  Each follow-up is appended to
// the same session as the next user turn, so the earlier turns' KV is
// reused, not recomputed: only the follow-up's words and the retrieved
// chunks not already in the conversation are computed.  When the session is
// full, the conversation starts again from a new RAG request whose
// question carries the last exchange.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "app.h"
#include "corpus_db.h"

namespace rag {

// The model's chat template around a follow-up turn: `close_and_open` ends
// the assistant's answer and opens a user turn; `to_answer` ends the user
// turn and opens the assistant's.  Control-token text, to tokenize with
// parse_special (the question's own text never is).
struct FollowUpFrame {
  std::string close_and_open;
  std::string to_answer;
};
FollowUpFrame follow_up_frame(const Model& model);

// The text of a follow-up user turn: the chunks new to the conversation,
// then the question, laid out as cb_rag_prefill lays out a request (each
// chunk followed by a blank line, then "Question: ").
std::string follow_up_text(const std::vector<const ChunkRecord*>& new_chunks,
                           std::string_view question);

// The question of a conversation started again (the session was full): the
// last exchange, then the new question.
std::string question_with_last_exchange(std::string_view earlier_question,
                                        std::string_view earlier_answer, std::string_view question);

// What to rank a follow-up's chunks by: the question and the previous one,
// so that "and the cat there?" still finds what the conversation is about.
std::string retrieval_query(std::string_view question, std::string_view previous_question);

class Conversation {
 public:
  bool live() const { return live_; }  // the session holds the conversation
  bool empty() const { return turns_.empty(); }
  const std::pair<std::string, std::string>& last_turn() const { return turns_.back(); }
  const std::vector<ChunkRecord>& last_sources() const { return last_sources_; }

  // The retrieved chunks not yet in the conversation.
  std::vector<const ChunkRecord*> new_chunks(const std::vector<ChunkRecord>& retrieved) const;

  // A turn answered: `fresh` when it started a new session (a RAG request),
  // else a follow-up that appended `retrieved`'s new chunks.  `live`: the
  // session holds it whole (false after a cancelled read of the documents).
  void record(const std::string& question, const std::string& answer,
              const std::vector<ChunkRecord>& retrieved, bool fresh, bool live);
  void clear();

 private:
  std::vector<std::pair<std::string, std::string>> turns_;  // question, answer
  std::set<int64_t> chunks_in_session_;
  std::vector<ChunkRecord> last_sources_;
  bool live_ = false;
};

}  // namespace rag
