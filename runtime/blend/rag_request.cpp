#include "runtime/blend/rag_request.h"

#include <algorithm>
#include <chrono>

#include "platform/cancel.h"
#include "platform/error.h"

namespace cb {

std::vector<int32_t> RagPrompt::tokens() const {
  std::vector<int32_t> t = head;
  for (const auto& c : chunks) t.insert(t.end(), c.begin(), c.end());
  t.insert(t.end(), suffix.begin(), suffix.end());
  return t;
}

RagPrompt build_rag_prompt(const Tokenizer& tok, ChatFormat format, std::string_view system_prompt,
                           std::span<const std::string> chunk_texts, std::string_view question) {
  RagPrompt p;
  p.head = rag_prompt_head(tok, format, system_prompt);
  for (const std::string& c : chunk_texts) p.chunks.push_back(rag_chunk_tokens(tok, c));
  p.suffix = tok.encode("Question: ", false, false);
  auto q = tok.encode(question, false, false);
  p.suffix.insert(p.suffix.end(), q.begin(), q.end());
  auto tail = tok.encode(rag_turns(format, system_prompt).after_question, false, true);
  p.suffix.insert(p.suffix.end(), tail.begin(), tail.end());
  return p;
}

std::vector<int32_t> rag_prompt_head(const Tokenizer& tok, ChatFormat format,
                                     std::string_view system_prompt) {
  return tok.encode(rag_turns(format, system_prompt).head, false, true);
}

std::vector<int32_t> rag_chunk_tokens(const Tokenizer& tok, std::string_view chunk_text) {
  // Chunk text is data, not markup: special-token text inside a document
  // stays plain text.
  return tok.encode(std::string(chunk_text) + "\n\n", false, false);
}

const char* chunk_head_name(ChunkHead h) {
  return h == ChunkHead::kNone ? "none" : "prompt";
}

std::vector<int32_t> chunk_head_tokens(ChunkHead h, std::span<const int32_t> prompt_head) {
  if (h != ChunkHead::kPrompt) return {};
  return {prompt_head.begin(), prompt_head.end()};
}

cache::ChunkKey chunk_cache_key(const Model& model, ChunkHead h,
                                std::span<const int32_t> head_tokens,
                                std::span<const int32_t> chunk, const std::string& ns) {
  // The head's token ids in full, not a hash of them: the store compares
  // every key field, so no collision can serve a chunk computed after
  // another head.
  std::string head_id = std::string(chunk_head_name(h)) + ":";
  head_id.append(reinterpret_cast<const char*>(head_tokens.data()),
                 head_tokens.size() * sizeof(int32_t));
  return cache::ChunkKey{model.fingerprint(), std::move(head_id), std::nullopt,
                         std::vector<int32_t>(chunk.begin(), chunk.end()), ns};
}

cache::ChunkKey after_context_key(cache::ChunkKey alone) {
  alone.chunk_head.insert(0, "after-context/");
  return alone;
}

namespace {

// A chunk found in the index but whose KV could not be read (a damaged or
// vanished blob) was computed: it is a miss, not a hit.
void count_unreadable_as_misses(RagPrefillStats& st) {
  st.cache_hits -= st.fusion.chunks_recomputed;
  st.cache_misses += st.fusion.chunks_recomputed;
}

// The session's copy in backend memory of what `src`, found in `store` for
// `key`, reads (null: none).  The store, the key, and the codec and size the
// chunk is stored in name its bytes.
ResidentChunk* resident_copy(Session& s, const cache::ChunkStore& store, const cache::ChunkKey& key,
                             const cache::ChunkLayerSource& src) {
  ResidentChunks& resident = s.resident_chunks();
  if (resident.budget_bytes() == 0) return nullptr;
  uint64_t bytes = 0;
  for (int64_t l = 0; l < s.model().hparams().n_layer; ++l) bytes += src.layer_bytes(l);
  const std::optional<cache::Codec> codec = src.codec();
  const std::string name = std::to_string(store.id()) + '/' +
                           (codec ? cache::codec_name(*codec) : "ram") + '/' +
                           std::to_string(bytes) + '/' + cache::serialize_key(key);
  return resident.acquire(name, static_cast<int64_t>(key.tokens.size()));
}

}  // namespace

void check_rag_request_fits(const Session& s, const RagPrompt& prompt, ChunkHead head) {
  const int64_t n_ctx = s.n_ctx();
  const int64_t head_len =
      head == ChunkHead::kPrompt ? static_cast<int64_t>(prompt.head.size()) : 0;
  for (size_t i = 0; i < prompt.chunks.size(); ++i) {
    const int64_t len = static_cast<int64_t>(prompt.chunks[i].size());
    if (len + head_len > n_ctx)
      fail(ErrorCode::kContextOverflow,
           "chunk " + std::to_string(i) + " is " + std::to_string(len) + " tokens long" +
               (head_len > 0 ? " (plus a " + std::to_string(head_len) + "-token chunk head)"
                             : std::string()) +
               ", more than the session's context of " + std::to_string(n_ctx) + " tokens");
  }
  int64_t n_total = static_cast<int64_t>(prompt.head.size() + prompt.suffix.size());
  for (const auto& c : prompt.chunks) n_total += static_cast<int64_t>(c.size());
  if (n_total > n_ctx)
    fail(ErrorCode::kContextOverflow,
         "the request is " + std::to_string(n_total) + " tokens (prompt head " +
             std::to_string(prompt.head.size()) + ", " + std::to_string(prompt.chunks.size()) +
             " chunks, question " + std::to_string(prompt.suffix.size()) +
             "), more than the session's context of " + std::to_string(n_ctx) + " tokens");
}

std::span<const float> rag_prefill(Session& s, const RagPrompt& prompt, cache::ChunkStore* store,
                                   const RagPrefillOptions& opts, RagPrefillStats* stats) {
  check_rag_request_fits(s, prompt, opts.chunk_head);
  // The session's abort check also ends a wait on a slow storage tier.
  ScopedCancelCheck cancel(s.stop_check() ? *s.stop_check() : StopCheck());
  RagPrefillStats local;
  RagPrefillStats& st = stats ? *stats : local;
  st = RagPrefillStats{};
  const std::vector<int32_t> head_tokens = chunk_head_tokens(opts.chunk_head, prompt.head);
  std::vector<Segment> segments;
  segments.push_back({prompt.head});
  std::vector<std::unique_ptr<cache::ChunkLayerSource>> sources;
  std::vector<cache::ChunkKV> computed;  // kept alive for the sources below
  computed.reserve(prompt.chunks.size());

  if (opts.blend.mode != BlendMode::kFull) {
    if (!store) fail(ErrorCode::kInvalidArgument, "mode needs a chunk cache");
    s.resident_chunks().begin_request();
    for (size_t i = 0; i < prompt.chunks.size(); ++i) {
      const auto& chunk = prompt.chunks[i];
      if (chunk.empty()) continue;
      const cache::ChunkKey key =
          chunk_cache_key(s.model(), opts.chunk_head, head_tokens, chunk, opts.ns);
      const cache::KvShape shape = chunk_kv_shape(s.model(), chunk.size());
      // Only the first chunk follows exactly its head, and only when the
      // head is the request's own P; any other chunk may take the KV
      // computed after a context.
      const bool exact = i == 0 && opts.chunk_head == ChunkHead::kPrompt;
      std::unique_ptr<cache::ChunkLayerSource> src;
      ResidentChunk* resident = nullptr;
      if (!exact && opts.neighbour_kv) {
        const cache::ChunkKey after = after_context_key(key);
        if ((src = store->find(after, shape))) resident = resident_copy(s, *store, after, *src);
      }
      if (!src && (src = store->find(key, shape))) resident = resident_copy(s, *store, key, *src);
      if (src) {
        ++st.cache_hits;
        if (resident && resident->ready) ++st.resident_hits;
      } else {
        ++st.cache_misses;
        const auto t0 = std::chrono::steady_clock::now();
        computed.push_back(precompute_chunk_kv(s, head_tokens, chunk));
        st.precompute_ms +=
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        store->put(key, computed.back());
        src = std::make_unique<cache::MemoryChunkSource>(computed.back());
      }
      sources.push_back(std::move(src));
      segments.push_back({chunk, sources.back().get(), exact, resident});
    }
  } else {
    for (const auto& chunk : prompt.chunks) segments.push_back({chunk});
  }
  segments.push_back({prompt.suffix});
  if (!opts.controller || opts.blend.mode != BlendMode::kBlend) {
    auto logits = fuse_prefill(s, segments, opts.blend, &st.fusion, opts.pipeline);
    count_unreadable_as_misses(st);
    return logits;
  }

  RequestShape shape;
  shape.n_layers = s.model().hparams().n_layer;
  shape.first_check_layer = opts.blend.schedule.empty() ? 1 : opts.blend.schedule.front().layer;
  shape.loads_overlap_recompute = opts.blend.selection != Selection::kLookahead;
  for (const Segment& seg : segments) {
    shape.n_tokens += static_cast<int64_t>(seg.tokens.size());
    if (!seg.cached) continue;
    shape.n_reused += static_cast<int64_t>(seg.tokens.size());
    // Copied within the backend: no load to hide.
    if (seg.resident && seg.resident->ready) continue;
    uint64_t bytes = 0;
    for (int64_t l = 0; l < shape.n_layers; ++l) bytes += seg.cached->layer_bytes(l);
    const std::optional<cache::Codec> codec = seg.cached->codec();
    // Computed chunks (no codec) are plain floats in RAM: no storage tier.
    const std::string tier = codec ? opts.storage_tier : std::string();
    const double per_layer = static_cast<double>(bytes) / static_cast<double>(shape.n_layers);
    auto part = std::find_if(shape.loads.begin(), shape.loads.end(), [&](const LayerLoadPart& p) {
      return p.tier == tier && p.codec == codec;
    });
    if (part == shape.loads.end()) {
      shape.loads.push_back({tier, codec, per_layer});
    } else {
      part->bytes_per_layer += per_layer;
    }
  }
  // The fusor always computes the last token, cached or not.
  for (auto seg = segments.rbegin(); seg != segments.rend(); ++seg) {
    if (seg->tokens.empty()) continue;
    if (seg->cached) --shape.n_reused;
    break;
  }
  const RatioChoice choice = opts.controller->choose_ratio(shape, opts.min_ratio);
  BlendOptions blend = opts.blend;
  blend.schedule = schedule_with_ratio(blend.schedule, choice.ratio);
  if (choice.skip_loads) blend.mode = BlendMode::kFull;
  const std::optional<cache::ReadCounters> before =
      store != nullptr ? store->read_counters() : std::nullopt;
  auto logits = fuse_prefill(s, segments, blend, &st.fusion, opts.pipeline);
  if (st.fusion.chunks_recomputed == 0) opts.controller->observe_fusion(shape, st.fusion);
  if (before) opts.controller->observe_store(opts.storage_tier, *before, *store->read_counters());
  st.shape = std::move(shape);
  st.choice = choice;
  count_unreadable_as_misses(st);
  return logits;
}

}  // namespace cb
