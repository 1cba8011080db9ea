// A retrieval-augmented request as the fusor sees it: the prompt head P, the
// retrieved chunks (each tokenized on its own, so the request's tokens are
// exactly their concatenation) and the suffix S; and the prefill that looks
// every chunk's KV up in a ChunkStore, computes and stores the missing
// ones, then fuses.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cache/chunk_store.h"
#include "runtime/blend/fusor.h"
#include "runtime/blend/loading_controller.h"
#include "runtime/chat_format.h"
#include "runtime/model.h"
#include "runtime/session.h"

namespace cb {

struct RagPrompt {
  std::vector<int32_t> head;                 // P: system turn + start of the user turn
  std::vector<std::vector<int32_t>> chunks;  // C_1..C_N
  std::vector<int32_t> suffix;               // S: question + assistant header
  std::vector<int32_t> tokens() const;       // P + C_1 + ... + C_N + S
};

// In the model's chat format (rag_turns): P = system turn + the opening of
// the user turn; each chunk is its text followed by a blank line; S =
// "Question: " + question + the end of the user turn + the opening of the
// assistant's.  (ChatML: P = "<|im_start|>system\n...<|im_end|>\n
// <|im_start|>user\n", S = "Question: ...<|im_end|>\n<|im_start|>assistant\n".)
RagPrompt build_rag_prompt(const Tokenizer& tok, ChatFormat format, std::string_view system_prompt,
                           std::span<const std::string> chunk_texts, std::string_view question);
// The two pieces of build_rag_prompt that decide a chunk's cache key, for
// callers that precompute or look up one chunk outside a request (an app's
// ingest step): they must tokenize exactly as a request does, or the chunk
// would never be found.
std::vector<int32_t> rag_prompt_head(const Tokenizer& tok, ChatFormat format,
                                     std::string_view system_prompt);
std::vector<int32_t> rag_chunk_tokens(const Tokenizer& tok, std::string_view chunk_text);

// The tokens a chunk's KV is precomputed after (the "chunk head").
enum class ChunkHead {
  kNone,    // the chunk alone, from position 0
  kPrompt,  // the request's prompt head P
};
const char* chunk_head_name(ChunkHead h);

// The tokens a chunk's KV is precomputed after: the prompt head P for
// kPrompt, nothing for kNone.
std::vector<int32_t> chunk_head_tokens(ChunkHead h, std::span<const int32_t> prompt_head);

// The key of a chunk's KV in a ChunkStore.  `head_tokens` are the
// chunk_head_tokens(); they are named by content in the key, so a changed
// system prompt never serves KV computed after another one.  rag_prefill
// uses this, and so must anything else that stores or finds chunks.
cache::ChunkKey chunk_cache_key(const Model& model, ChunkHead h,
                                std::span<const int32_t> head_tokens,
                                std::span<const int32_t> chunk, const std::string& ns);

// The key of the same chunk's KV computed after its head and then other
// text (neighbour-aware precompute, cb_chunk_cache_add_after), apart from
// the key of the KV computed after the head alone.  rag_prefill takes it
// for a chunk that follows other chunks, in preference to `alone`, and
// never for a chunk whose KV it takes as exact (the first chunk after the
// prompt head): there only what a prefix of the request gives will do.
// Only with RagPrefillOptions::neighbour_kv.
cache::ChunkKey after_context_key(cache::ChunkKey alone);

struct RagPrefillOptions {
  BlendOptions blend;
  ChunkHead chunk_head = ChunkHead::kPrompt;
  std::string ns;  // cache namespace
  // Whether the store may hold chunks' KV computed after a context
  // (after_context_key): only then does a chunk take a second lookup, which
  // on a tiered store probes every tier and counts a miss in each.
  bool neighbour_kv = false;
  PipelineOptions pipeline;
  // Auto ratio (`--ratio auto`): in blend mode the controller chooses the
  // ratio from the bytes this request loads and the calibrated costs, and
  // it replaces the schedule's last ratio (schedule_with_ratio).  The
  // request's timings then refresh the controller's calibration (the store's
  // counters too, when `store` reads from storage: ChunkStore::read_counters()).
  // Null: the schedule's ratios as given.
  LoadingController* controller = nullptr;
  // The floor of the controller's ratio for this request; none: the
  // controller's own r_min.
  std::optional<double> min_ratio;
  // The controller's name for the storage tier `store` reads from.  Chunks
  // computed in this request are read from RAM whatever the tier.
  std::string storage_tier;
};

struct RagPrefillStats {
  FusionStats fusion;
  int64_t cache_hits = 0;  // chunks whose KV was read from the store
  // Of those, chunks copied from the session's backend memory instead
  // (Session::resident_chunks()).
  int64_t resident_hits = 0;
  int64_t cache_misses = 0;    // chunks computed: absent, or unreadable (fusion.chunks_recomputed)
  double precompute_ms = 0.0;  // computing missing chunks' KV
  // What the controller saw and chose (auto ratio only).
  std::optional<RequestShape> shape;
  std::optional<RatioChoice> choice;
};

// Throws kContextOverflow, saying which, when a chunk (with its chunk head)
// or the whole request does not fit the session's context.
void check_rag_request_fits(const Session& s, const RagPrompt& prompt, ChunkHead head);

// Prefills the empty session `s` with the request and returns the last
// token's logits; first check_rag_request_fits().  `store` may be null in full mode.  Chunks
// missing from the store are computed (in `s`, before the fusion) and stored.
std::span<const float> rag_prefill(Session& s, const RagPrompt& prompt, cache::ChunkStore* store,
                                   const RagPrefillOptions& opts, RagPrefillStats* stats = nullptr);

}  // namespace cb
